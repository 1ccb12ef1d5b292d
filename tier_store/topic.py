"""A topic handle: the producer and consumer API over one topic's segments and commit log.

Writing is two steps. :meth:`Topic.write_chunks` (run anywhere, e.g. on executors) appends
one chunk per partition touched, durably, under the partition's lock, and returns
:class:`ChunkRef` s; nothing is visible yet. :meth:`Topic.commit` (run once, e.g. on the
driver) publishes one commit-log entry that assigns offsets and makes all the chunks visible
at once. :meth:`Topic.append` does both.

The handle is a façade: each partition's writes go through its
:class:`~tier_store.partition.PartitionLog`, publishing through the topic's
:class:`~tier_store.topic_log.TopicLog`, read-only views through :mod:`tier_store.views`,
and it sees its store through :class:`~tier_store.host.TopicHost` only.

Thread-safety: a handle may be shared by threads.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from . import dropped, positions, scan, sharing, views
from .chunk import EncodedChunk
from .commit_log import CommitLog
from .conflicts import Requirement
from .entries import ChunkRecord, DeleteEntry, LakeRecord, MoveEntry, PartitionsEntry
from .errors import InvalidArgument
from .evolve import evolve
from .flusher import Flusher
from .follow import follow
from .layout import fsync_dir
from .maintenance import deferred, retention
from .partition import PartitionLog
from .reading import ReadPlan
from .records import AppendResult, ChunkRef, SegmentInfo
from .segment import HEADER_SIZE
from .state import NO_TIME, TopicState
from .stats import STATS_MIN_ROWS, ChunkFilter, compute
from .tables import as_table, check_valid, conform, loose_type, route, split_chunks, time_range
from .topic_config import set_config
from .topic_log import TopicLog, now_ms

if TYPE_CHECKING:
    from .host import TopicHost


def _non_negative(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InvalidArgument(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


class Topic(positions.GroupPositions):
    """A handle on one topic of a :class:`~tier_store.Store`."""

    def __init__(self, store: TopicHost, name: str, state: TopicState, commit_log: CommitLog):
        self.store = store
        self.name = name
        self.log = TopicLog(name, store, state, commit_log)
        self._parts: dict[int, PartitionLog] = {}
        self._parts_lock = threading.Lock()  # _parts, _rr: appends never wait on commits
        self._flusher = Flusher()
        self._sync_lock = threading.Lock()
        self._rr = random.randrange(1 << 16)
        dropped.prepare()  # dropped without close(), the handle's writers are closed there

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, partitions={self.partitions})"

    # -- state ------------------------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        assert self.log.current.schema is not None
        return self.log.current.schema

    @property
    def partitions(self) -> int:
        return self.log.current.partitions

    @property
    def version(self) -> int:
        return self.log.current.version

    @property
    def id(self) -> str:
        """This incarnation's id: a topic deleted and created again has another."""
        return self.log.current.topic_id

    @property
    def config(self) -> dict[str, Any]:
        """Topic-level configuration (overrides of the store's changeable keys)."""
        return dict(self.log.current.config)

    def setting(self, key: str) -> Any:
        """The value of configuration key ``key`` for this topic: its own, else the store's."""
        return self.log.current.config.get(key, self.store.config[key])

    def refresh(self) -> Topic:
        """Read the commit-log entries published since this handle last looked."""
        self.log.refresh()
        return self

    def state(self, refresh: bool = True) -> TopicState:
        """The topic's state (refreshed unless ``refresh=False``), read-only."""
        return self.log.refresh() if refresh else self.log.current

    def snapshot(self) -> contextlib.AbstractContextManager[TopicState]:
        """Hold the handle's lock and yield the refreshed state (keep the block short)."""
        return self.log.snapshot()

    @property
    def checkpointed_version(self) -> int:
        """The version of the newest checkpoint this handle knows of (0: none)."""
        return self.log.checkpointed_version

    def write_checkpoint(self) -> int:
        """Write a checkpoint of the state as it is; returns its version."""
        keys = ("log.cleanup.grace.ms", "log.checkpoint.interval")
        return self.log.write_checkpoint(*map(self.setting, keys))

    def latest_offsets(self) -> dict[int, int]:
        """Per partition, the next offset to be written."""
        return dict(enumerate(self.log.refresh().next_offset))

    def earliest_offsets(self) -> dict[int, int]:
        """Per partition, the first offset still retained."""
        return dict(enumerate(self.log.refresh().start_offset))

    def _check_partition(self, partition: Any) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int | np.integer):
            raise InvalidArgument(f"partition must be an integer, got {partition!r}")
        if not 0 <= partition < self.partitions:
            self.refresh()
        if not 0 <= partition < self.partitions:
            raise InvalidArgument(f"topic {self.name!r} has no partition {partition}: it has "
                                  f"partitions 0..{self.partitions - 1}")
        return int(partition)

    def partition_log(self, partition: int) -> PartitionLog:
        """Partition ``partition``'s log as this handle writes it."""
        p = self._check_partition(partition)
        with self._parts_lock:
            part = self._parts.get(p)
            if part is None:
                part = self._parts[p] = PartitionLog(self.name, p, self.store, self.setting,
                                                     self.log, self._flusher)
            return part

    # -- writing: step 1 ------------------------------------------------------------------
    def write_chunks(self, data: Any, partition: int | None = None, key: str | None = None,
                     timestamp_column: str | None = None, durable: bool = True
                     ) -> list[ChunkRef]:
        """Append ``data`` durably as one chunk per partition touched; nothing is visible
        until :meth:`commit`. Rows go to ``partition`` if given, else by the stable hash of
        column ``key`` (nulls to 0), else all to the next partition in rotation. Data that
        fails Arrow's full validation is :class:`InvalidArgument`, checked before anything
        reads its values (a cast or a take of malformed buffers may crash).

        With ``durable=False`` the chunks are not flushed yet: call :meth:`sync` once after
        the last, then hand the references to the committer (a flush per segment, not chunk)."""
        table = as_table(data)
        check_valid(table, f"data written to topic {self.name!r}")
        table = conform(table, self.schema, self.name)
        if table.num_rows == 0:
            return []
        if partition is not None and key is not None:
            raise InvalidArgument("give either partition or key, not both")
        names = table.schema.names
        for what, col in (("timestamp column", timestamp_column), ("key column", key)):
            if col is not None and col not in names:
                raise InvalidArgument(f"{what} {col!r} is not a column of topic {self.name!r} "
                                      f"(columns: {names})")
        routed: tuple[str, int] | None = None  # the key and partition count rows go by
        if partition is not None:
            groups = [(self._check_partition(partition), table)]
        elif key is not None:
            routed = (key, self.partitions)
            groups = route(table, key, routed[1])
        else:
            with self._parts_lock:
                p = self._rr % self.partitions
                self._rr += 1
            groups = [(p, table)]
        compression = self.setting("compression.type")
        limit = self.store.config["log.segment.bytes"] - HEADER_SIZE
        stats = self.setting("log.chunk.statistics")
        return [self._append_chunk(p, piece, timestamp_column, durable,
                                   None if stats == "none" or piece.records < STATS_MIN_ROWS
                                   else compute(piece.batches, self.schema, routed,
                                                stats == "all"))
                for p, part in groups for piece in split_chunks(part, compression, limit)]

    def sync(self) -> None:
        """Make durable every chunk this handle wrote with ``durable=False``, and wait for
        the segments rolled out meanwhile, flushed in the background. Thread-safe."""
        # One sync at a time: a second caller must not return while the first is still
        # flushing chunks it also wrote.
        with self._sync_lock:
            with self._parts_lock:
                parts = sorted(self._parts.values(), key=lambda q: q.number)
            if any([q.sync() for q in parts]):
                fsync_dir(self.store.pointer_dir(self.name, self.id))
            self._flusher.wait()  # after: rolled-out segments were queued before their sync

    def _append_chunk(self, p: int, chunk: EncodedChunk, ts_col: str | None,
                      durable: bool, stats: dict[str, Any] | None = None) -> ChunkRef:
        tmin, tmax = time_range(chunk, ts_col) if ts_col is not None else (None, None)
        written = now_ms()
        # A handle on a deleted topic must not append to what its name leads to now.
        seq, tier, pos, crc = self.partition_log(p).append(chunk, durable, written,
                                                            self.log.check_incarnation)
        shared = self.store.shared
        return ChunkRef(self.name, p, seq, tier.number, pos, chunk.size, chunk.records, crc,
                        written, tmin, tmax, self.store.relocation(tier.number), self.id,
                        None if shared is None else shared.host, st=stats)

    def active_segment(self, p: int) -> tuple[int, int] | None:
        """(sequence, tier) of partition ``p``'s active segment, if it has one."""
        return self.partition_log(p).active_segment()

    def share(self, refs: Sequence[ChunkRef]) -> list[ChunkRef]:
        """On a store shared by many hosts, upload the chunks of ``refs`` (made durable by
        :meth:`sync`) to the shared tier as one object; returns the references naming it. A
        write task calls this before handing its references to the committer: committed data
        survives the loss of this host. Elsewhere returns ``refs`` as they are."""
        shared = self.store.shared
        return list(refs) if shared is None else \
            sharing.share(shared, self.id, list(refs), self.store.tier)

    # -- writing: step 2 ------------------------------------------------------------------
    def commit(self, refs: list[ChunkRef], writer_id: str | None = None,
               batch_id: int | None = None) -> list[AppendResult]:
        """Make ``refs`` visible in one commit-log entry, assigning offsets in their order.

        With ``writer_id`` and ``batch_id``, a batch id not above the writer's highest
        committed one is a replay: acknowledged, not appended again (returns ``[]``).
        Raises :class:`CommitConflict` if a chunk's segment was moved or deleted since."""
        refs = list(refs)
        for r in refs:
            if not isinstance(r, ChunkRef):
                raise InvalidArgument("commit takes the ChunkRefs that write_chunks returned, "
                                      f"got {type(r).__name__}")
            if r.topic != self.name:
                raise InvalidArgument(f"chunk of topic {r.topic!r} cannot be committed to "
                                      f"{self.name!r}")
        if (writer_id is None) != (batch_id is None):
            raise InvalidArgument("give both writer_id and batch_id, or neither")
        if not refs:
            return []
        if self.store.shared is not None:
            refs = self.share(refs)  # those written here and not shared yet
            sharing.check_fresh(refs, self.setting("log.cleanup.grace.ms"), now_ms())
        # The relocation check comes first (and holds through the publish): a chunk written
        # to a tier's old place must be refused, not taken for one already committed.
        with self.log.lock:
            with self.store.publishing({(r.tier, r.relocation) for r in refs}):
                results = self.log.commit(refs, writer_id, batch_id)
            if results:
                # Still under the handle's lock: housekeeping sees the state just published.
                self.store.after_commit(self)
            return results

    def append(self, data: Any, partition: int | None = None, key: str | None = None,
               timestamp_column: str | None = None) -> list[AppendResult]:
        """``write_chunks`` then ``commit``: durable and visible on return."""
        return self.commit(self.write_chunks(data, partition, key, timestamp_column))

    # -- maintenance primitives -----------------------------------------------------------
    def replace_segments(self, partition: int, sources: Sequence[int], seq: int, tier: int,
                         chunks: Sequence[ChunkRecord], requirements: Sequence[Requirement] = (),
                         read_from: Iterable[int] = (), lake: LakeRecord | None = None
                         ) -> MoveEntry:
        """Publish a ``move`` entry: sealed segments ``sources`` of ``partition`` become
        segment ``seq`` on ``tier``, holding ``chunks`` (in ``lake``'s file, on a lake);
        checked and fenced as :meth:`~tier_store.topic_log.TopicLog.replace_segments` says."""
        return self.log.replace_segments(partition, sources, seq, tier, chunks, requirements,
                                         read_from, lake)

    def delete_segments(self, ids: Sequence[str], reason: str = "retention",
                        requirements: Sequence[Requirement] = ()) -> DeleteEntry:
        """Publish a ``delete`` entry removing committed segments ``ids`` and their records."""
        return self.log.delete_segments(ids, reason, requirements)

    def apply_retention(self, now_ms: int | None = None) -> list[str]:
        """Delete sealed segments past ``log.retention.*``; returns their ids (``retention``)."""
        return retention.apply_retention(self, now_ms)

    # -- reading ------------------------------------------------------------------------------
    read = scan.read  # records of a partition: a range, columns, conditions
    follow = follow  # yields a partition's records as they are committed: tier_store.follow

    def plan_read(self, partition: int, start: int, end: int | None = None) -> ReadPlan:
        """Plan reading ``[start, end)`` of ``partition`` (see :mod:`tier_store.reading`)."""
        return self.plan_reads([(partition, start, end)])[0]

    def plan_reads(self, ranges: Sequence[tuple[int, int, int | None]],
                   keep: ChunkFilter | None = None) -> list[ReadPlan]:
        """:meth:`plan_read` of many ``(partition, start, end)``: one lock, one refresh
        (``keep``: only chunks whose statistics may hold a row it passes)."""
        n = self.partitions
        todo = [(p, s, e) if type(p) is int and 0 <= p < n and type(s) is int and s >= 0
                else (self._check_partition(p), _non_negative("start offset", s), e)
                for p, s, e in ranges]
        with self.log.lock:
            st = self.log.current
            if not _committed(st, todo):
                st = self.log.refresh()
            return views.read_plans(self.store, self.name, st, todo, keep)

    def bytes_between(self, partition: int, start: int, end: int) -> int:
        """Approximate bytes of records ``[start, end)``: whole chunks, pro rata at the ends."""
        return views.bytes_between(self.log.current, partition, start, end)
    bytes_by_tier = views.topic_bytes_by_tier  # by the tier holding them: tier_store.views

    def offset_for_time(self, partition: int, timestamp_ms: int) -> int:
        """The first offset committed at or after ``timestamp_ms`` (latest if none)."""
        p = self._check_partition(partition)
        return views.offset_for_time(self.log.refresh(), p, timestamp_ms)

    def segments(self) -> list[SegmentInfo]:
        """The committed segments, by partition and base offset."""
        return views.segment_infos(self.name, self.state(), self.store.tier, self.active_segment,
                                   self.setting("log.cleanup.grace.ms") / 1000.0)

    # -- partitions and positions ---------------------------------------------------------
    def add_partitions(self, n: int) -> int:
        """Add ``n`` partitions (readers discover them); returns the new total."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgument(f"add_partitions takes a positive number of partitions, "
                                  f"got {n!r}")
        st = self.log.publish_retrying(
            lambda st: PartitionsEntry(max(st.last_ts, now_ms()), st.partitions + n))
        self.store.pointer_dir(self.name, self.id)  # made if missing
        return st.partitions

    set_config = set_config  # the topic's own keys, in its log: tier_store.topic_config
    evolve = evolve  # an allowed change of the schema, in its log: tier_store.evolve

    def close(self) -> None:
        """Flush and release every segment writer this handle holds, and its log."""
        self.sync()
        deferred.wait(self.log)  # a checkpoint under way finishes first
        _close_writers(self._parts, self._parts_lock)
        self._flusher.shutdown()
        self.log.close()

    def __del__(self) -> None:  # not from the collector's thread: see tier_store.dropped
        _release_dropped(vars(self))


def _committed(st: TopicState, ranges: list[tuple[int, int, int | None]]) -> bool:
    """Whether ``st`` holds every range's end (a loop, not any(): one range is usual)."""
    for p, _, e in ranges:  # noqa: SIM110 (a generator costs more than the check)
        if e is None or e > st.part(p).next_offset:
            return False
    return True


def _forget_writers(parts: dict[int, PartitionLog], lock: threading.Lock | None
                    ) -> list[Callable[[], None]]:
    """How to close the partition writers in ``parts``, which forgets them."""
    with lock or contextlib.nullcontext():
        closers = [q.close for q in parts.values()]
        parts.clear()
    return closers


def _close_writers(parts: dict[int, PartitionLog], lock: threading.Lock) -> None:
    for close in _forget_writers(parts, lock):
        close()


def _release_dropped(fields: dict[str, Any]) -> None:
    """Have the writers of a handle dropped without close() (its ``vars``) closed."""
    if "_parts" in fields:  # not if __init__ failed before it
        dropped.release_later(f"topic {fields['name']}", _forget_writers(fields["_parts"], None))


__all__ = ["NO_TIME", "Topic", "as_table", "conform", "loose_type"]
