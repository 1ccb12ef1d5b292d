"""A topic's commit log as one handle follows it: the state at the newest version read, and
publishing entries whose commit requirements are checked in one place.

Publishing is optimistic, as in Delta and Iceberg: an entry is built against the state at
version N and published as N + 1 iff that number is free; a lost race refreshes the state,
checks the entry's requirements (:mod:`tier_store.conflicts`) against what won, and builds
the entry again. Every publish holds the store's relocation fence
(:meth:`~tier_store.host.TopicHost.publishing`).

Thread-safety: :attr:`TopicLog.lock` guards the state; a refresh applies new entries to the
state's own objects in place, so whatever must be read consistently is read under it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from .commit_log import CommitLog
from .conflicts import (
    Requirement,
    SegmentsCommitted,
    append_requirements,
    unseen_chunks,
    validate_all,
)
from .entries import (
    AppendEntry,
    ChunkRecord,
    DeleteEntry,
    Entry,
    LakeRecord,
    MoveEntry,
    check_chunk,
)
from .errors import CommitConflict, InvalidArgument
from .layout import segment_id
from .records import AppendResult, ChunkRef
from .state import TopicState

if TYPE_CHECKING:
    from .host import TopicHost

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 10_000
"""Lost races after which a publish gives up (CommitConflict)."""


def now_ms() -> int:
    return int(time.time() * 1000)


class TopicLog:
    """The commit log of topic ``name`` and the state this handle has read from it."""

    def __init__(self, name: str, host: TopicHost, state: TopicState, commit_log: CommitLog):
        self.name = name
        self.host = host
        self.commit_log = commit_log  # knows the incarnation the state was read from
        self.lock = threading.RLock()
        self._state = state
        self._known_checkpoint = commit_log.last_checkpoint() or 0
        self._started_checkpoint = 0  # the newest checkpoint this handle began to write

    @property
    def current(self) -> TopicState:
        """The state as last read (not refreshed)."""
        return self._state

    def refresh(self) -> TopicState:
        """Read the entries published since this handle last looked."""
        with self.lock:
            self._state = self.commit_log.refresh(self._state)
            return self._state

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[TopicState]:
        """Hold the lock and yield the refreshed state."""
        with self.lock:
            yield self.refresh()

    @property
    def checkpointed_version(self) -> int:
        """The version of the newest checkpoint this handle knows of (0 for none)."""
        return self._known_checkpoint

    def write_checkpoint(self, grace_ms: int, interval: int = 0) -> int:
        """Write a checkpoint of the state as it is; returns its version. Checkpoints are
        mostly at multiples of ``interval`` (see :meth:`LogStore.expired`)."""
        finish = self.start_checkpoint(grace_ms, interval)
        return finish()

    @property
    def checkpoint_begun(self) -> int:
        """The version of the newest checkpoint this handle wrote or began to write: one
        being written counts, so a commit meanwhile does not take its own for overdue."""
        return max(self._known_checkpoint, self._started_checkpoint)

    def start_checkpoint(self, grace_ms: int, interval: int = 0) -> Callable[[], int]:
        """Take what a checkpoint of the state as it is needs, under the lock; returns the
        rest, which writes its pieces and itself outside the lock (taking it again briefly
        to install the pieces) and returns its version."""
        with self.lock:
            version = self._state.version
            pending = self.commit_log.begin_checkpoint(self._state)
            self._started_checkpoint = max(self._started_checkpoint, version)

        def finish() -> int:
            if pending is not None:
                pending.write_pieces()
                with self.lock:
                    pending.install()
                self.commit_log.finish_checkpoint(pending, grace_ms, interval)
            self._known_checkpoint = max(self._known_checkpoint, version)
            return version
        return finish

    def committed_extent(self, partition: int, seq: int, tier: int) -> int:
        """Where the last chunk the log has committed to segment ``seq`` of ``partition`` on
        ``tier`` ends (0: none), as the log is now: an append never writes below it.

        The state is refreshed (a probe of the next version) unless another thread of this
        handle holds the lock (a commit, through its housekeeping): appends never wait on
        commits. Its state is then at most that commit old, and the entries published since
        are read here without being applied."""
        if self.lock.acquire(blocking=False):
            try:
                return _extent(self.refresh(), partition, seq, tier)
            finally:
                self.lock.release()
        st = self._state
        v = st.version + 1  # read before the segments: apply() sets the version last
        extent = _extent(st, partition, seq, tier)
        while (entry := self.commit_log.read_entry(v)) is not None:
            if isinstance(entry, AppendEntry):
                extent = max([extent, *(c.pos + c.length for c in entry.chunks
                                        if (c.partition, c.seq, c.tier) == (partition, seq,
                                                                            tier))])
            v += 1
        return extent

    def check_incarnation(self) -> None:
        """:class:`TopicDeleted` if the topic's name now leads to another log."""
        self.commit_log.check_incarnation()

    # -- publishing ---------------------------------------------------------------------
    def publish(self, st: TopicState, entry: Entry,
                tiers: Iterable[tuple[int, int]] = (), held: bool = False) -> bool:
        """Publish ``entry`` as the version after ``st``'s and apply it on success. ``tiers``:
        where the data it names was written, for the relocation fence; ``held``: the caller
        holds the fence already."""
        v = st.version + 1
        with contextlib.nullcontext() if held else self.host.publishing(tiers):
            if not self.commit_log.publish(v, entry):
                return False
        st.apply(v, entry)
        return True

    def publish_retrying(self, make: Callable[[TopicState], Entry | None],
                         tiers: Iterable[tuple[int, int]] = ()) -> TopicState:
        """Publish ``make(state)`` (None: nothing to do) until it wins a race."""
        with self.lock:
            for _ in range(MAX_ATTEMPTS):
                st = self.refresh()
                entry = make(st)
                if entry is None or self.publish(st, entry, tiers):
                    return st
            raise CommitConflict(f"topic {self.name!r}: gave up after {MAX_ATTEMPTS} lost "
                                 "races")

    def publish_checked(self, requirements: Sequence[Requirement],
                        build: Callable[[TopicState], Entry],
                        tiers: Iterable[tuple[int, int]] = ()) -> Entry:
        """Publish ``build(state)`` once every requirement holds against the state it is
        published on (checked again after each lost race); returns the entry published."""
        published: list[Entry] = []

        def make(st: TopicState) -> Entry:
            validate_all(requirements, st)
            published[:] = [build(st)]
            return published[0]

        self.publish_retrying(make, tiers)
        return published[0]

    def commit(self, refs: list[ChunkRef], writer_id: str | None,
               batch_id: int | None) -> list[AppendResult]:
        """Publish one ``append`` entry for the chunks of ``refs`` not committed yet,
        assigning offsets in their order. The caller holds :attr:`lock` and the relocation
        fence. A batch of ``writer_id`` not above its highest committed one is a replay:
        ``[]``."""
        for _ in range(MAX_ATTEMPTS):
            st = self.refresh()
            if writer_id is not None and batch_id is not None and \
                    st.writers.get(writer_id, -1) >= batch_id:
                log.info("topic %s: batch %s of writer %s is already committed; skipping "
                         "the replay", self.name, batch_id, writer_id)
                return []
            fresh = unseen_chunks(self.name, st, refs)
            if not fresh:
                return []
            validate_all(append_requirements(self.name, fresh, self.host.tier), st)
            ts = max(st.last_ts, now_ms())
            nxt = st.next_offset
            chunks, results = [], []
            for r in fresh:
                base = nxt[r.partition]
                nxt[r.partition] += r.records
                chunks.append(checked(ChunkRecord(
                    r.partition, r.seq, r.tier, r.pos, r.length, base, r.records, r.checksum,
                    r.tmin, r.tmax, r.host, r.obj, r.opos, r.st)))
                results.append(AppendResult(r.partition, base, r.records, st.version + 1, ts))
            if self.publish(st, AppendEntry(ts, tuple(chunks), writer_id, batch_id), held=True):
                return results
        raise CommitConflict(f"topic {self.name!r}: gave up committing after {MAX_ATTEMPTS} "
                             "lost races")

    def replace_segments(self, partition: int, sources: Sequence[int], seq: int, tier: int,
                         chunks: Sequence[ChunkRecord],
                         requirements: Sequence[Requirement] = (),
                         read_from: Iterable[int] = (), lake: LakeRecord | None = None
                         ) -> MoveEntry:
        """Publish a ``move`` entry: the sealed segments ``sources`` (sequence numbers) of
        ``partition`` are replaced by segment ``seq`` on tier ``tier``, which holds
        ``chunks`` at their new positions. The sources must be committed and every one of
        ``requirements`` must hold against the state the entry is published on
        (:mod:`tier_store.conflicts`): a race lost to an entry that breaks none is retried,
        one that breaks one raises :class:`CommitConflict`. Refused
        (:class:`TierRelocated`) if ``tier`` or a tier of ``read_from`` (where the chunks
        were read) was relocated since the store was opened. The sources' files become
        tombstones, released after ``log.cleanup.grace.ms``. ``lake``: the Parquet file
        ``chunks`` (its row groups) are in, on a lake tier."""
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise InvalidArgument(f"partition must be a non-negative integer, got "
                                  f"{partition!r}")
        seqs = tuple(int(q) for q in sources)
        if not seqs or len(set(seqs)) != len(seqs):
            raise InvalidArgument(f"replace_segments takes distinct source segments, got "
                                  f"{list(sources)!r}")
        moved = tuple(chunks)
        stray = [c for c in moved if (c.partition, c.seq, c.tier) != (partition, seq, tier)]
        if stray:
            raise InvalidArgument(f"topic {self.name!r}: a chunk of segment "
                                  f"{segment_id(stray[0].partition, stray[0].seq)} on tier "
                                  f"{stray[0].tier} is not in segment "
                                  f"{segment_id(partition, seq)} on tier {tier}")
        committed = SegmentsCommitted(self.name, tuple(segment_id(partition, q) for q in seqs))

        def build(st: TopicState) -> MoveEntry:
            return MoveEntry(max(st.last_ts, now_ms()), partition, seqs, seq, tier, moved, lake)

        fence = {(n, self.host.relocation(n)) for n in {tier, *read_from}}
        entry = self.publish_checked([committed, *requirements], build, fence)
        assert isinstance(entry, MoveEntry)
        return entry

    def delete_segments(self, ids: Sequence[str], reason: str = "retention",
                        requirements: Sequence[Requirement] = ()) -> DeleteEntry:
        """Publish a ``delete`` entry removing the committed segments ``ids`` (their records
        with them; the partition's earliest offset moves past them), naming ``reason``;
        checked as :meth:`replace_segments`. The files become tombstones."""
        if isinstance(ids, str) or not ids or not all(isinstance(i, str) for i in ids):
            raise InvalidArgument(f"delete_segments takes a list of segment ids, got {ids!r}")
        if not isinstance(reason, str) or not reason:
            raise InvalidArgument(f"reason must be a non-empty string, got {reason!r}")
        gone = tuple(ids)

        def build(st: TopicState) -> DeleteEntry:
            return DeleteEntry(max(st.last_ts, now_ms()), gone, reason)

        entry = self.publish_checked([SegmentsCommitted(self.name, gone), *requirements], build)
        assert isinstance(entry, DeleteEntry)
        return entry

    def close(self) -> None:
        self.commit_log.close()


def checked(c: ChunkRecord) -> ChunkRecord:
    """``c`` if every field lies in its range (as a decoder checks it); else
    :class:`InvalidArgument`: a reference handed over by a writer is published only if every
    later reader can decode it."""
    try:
        check_chunk(c)
    except ValueError as e:
        raise InvalidArgument(f"a chunk reference of partition {c.partition} at byte {c.pos} "
                              f"is malformed: {e}") from None
    return c


def _extent(st: TopicState, partition: int, seq: int, tier: int) -> int:
    part = st.parts[partition] if partition < len(st.parts) else None
    seg = None if part is None else part.segments.get(seq)
    return seg.extent if seg is not None and seg.tier == tier else 0


__all__ = ["MAX_ATTEMPTS", "TopicLog", "now_ms"]
