"""A topic handle: the producer and consumer API over one topic's segments and commit log.

Writing is two steps. :meth:`Topic.write_chunks` (run anywhere, e.g. on executors) appends
one chunk per partition touched, durably, under the partition's lock, and returns
:class:`ChunkRef` s; nothing is visible yet. :meth:`Topic.commit` (run once, e.g. on the
driver) publishes one commit-log entry that assigns offsets and makes all the chunks visible
at once. :meth:`Topic.append` does both.

Thread-safety: a handle may be shared by threads; its state is guarded by a lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .chunk import EncodedChunk
from .commit_log import CommitLog
from .conflicts import (
    Requirement,
    SegmentsCommitted,
    append_requirements,
    unseen_chunks,
    validate_all,
)
from .crash import crash_point
from .entries import (
    AppendEntry,
    ChunkRecord,
    DeleteEntry,
    Entry,
    MoveEntry,
    PartitionsEntry,
    PositionEntry,
)
from .errors import (
    CommitConflict,
    DataLoss,
    InvalidArgument,
    PafkaError,
    SchemaMismatch,
    StoreFull,
)
from .hashing import partition_of
from .layout import (
    fsync_dir,
    fsync_file,
    parse_segment_id,
    partitions_dir,
    segment_id,
    write_atomic,
)
from .maintenance import retention
from .reading import PlannedChunk, ReadPlan, execute
from .records import AppendResult, ChunkRef, SegmentInfo
from .segment import CHUNK_ALIGN, HEADER_SIZE, SegmentHeader, align
from .state import NO_TIME, TopicState
from .tiers import NO_SPACE, SegmentWriter, Tier

if TYPE_CHECKING:
    from .host import TopicHost

log = logging.getLogger(__name__)

_MAX_COMMIT_ATTEMPTS = 10_000


def _now_ms() -> int:
    return int(time.time() * 1000)


def as_table(data: Any) -> pa.Table:
    """Accept a RecordBatch, a Table, or a list of batches; anything else is an error."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, list | tuple) and data and all(isinstance(b, pa.RecordBatch)
                                                        for b in data):
        return pa.Table.from_batches(list(data))
    raise PafkaError(
        f"expected a pyarrow RecordBatch, Table or list of RecordBatches, got "
        f"{type(data).__name__}"
    )


def loose_type(t: pa.DataType) -> pa.DataType:
    """``t`` with nested nullability and time zones erased: types equal under this are the
    same data (a time zone only says how instants are shown) and convert by a cast."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz="UTC" if t.tz else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = loose_type(t.value_type)
        return pa.list_(inner) if pa.types.is_list(t) else pa.large_list(inner)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, loose_type(t.field(i).type))
                          for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(loose_type(t.key_type), loose_type(t.item_type))
    return t


def conform(table: pa.Table, schema: pa.Schema, topic: str) -> pa.Table:
    """Make ``table`` carry exactly ``schema``: reorder columns by name, and cast nullable
    columns into non-null fields when they hold no null. Anything else is SchemaMismatch."""
    if table.schema.equals(schema, check_metadata=False):
        return table if table.schema.metadata == schema.metadata else table.cast(schema)
    names, want = table.schema.names, schema.names
    missing = [n for n in want if n not in names]
    extra = [n for n in names if n not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if extra:
            parts.append(f"unexpected columns {extra}")
        raise SchemaMismatch(f"data written to topic {topic!r} does not match its schema: "
                             f"{'; '.join(parts)} (topic columns: {want})")
    if names != want:
        table = table.select(want)
    problems = []
    for f in schema:
        got = table.schema.field(f.name)
        if not loose_type(got.type).equals(loose_type(f.type)):
            problems.append(f"column {f.name!r}: topic has {f.type}, data has {got.type}")
        elif not f.nullable and table.column(f.name).null_count:
            problems.append(f"column {f.name!r} is not nullable in the topic but the data holds "
                            f"{table.column(f.name).null_count} nulls")
    if problems:
        raise SchemaMismatch(f"data written to topic {topic!r} does not match its schema: "
                             + "; ".join(problems))
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise SchemaMismatch(f"data written to topic {topic!r} does not fit its schema: {e}"
                             ) from None


class Topic:
    """A handle on one topic of a :class:`~tier_store.Store`."""

    def __init__(self, store: TopicHost, name: str, state: TopicState, commit_log: CommitLog):
        self.store = store
        self.name = name
        # The log the state was loaded from: it knows the incarnation it read.
        self._log = commit_log
        self._state = state
        self._lock = threading.RLock()
        self._writers: dict[int, tuple[tuple[int, int], SegmentWriter]] = {}
        self._unsynced: set[int] = set()  # partitions with chunks written with durable=False
        # Partitions whose active pointer this handle relies on but has not made durable: it
        # rolled them with durable=False, or appends to a segment another handle rolled to.
        # A commit must not name a chunk of that segment before the pointer is durable: after
        # a crash an older pointer would lead a writer to create the segment again, empty.
        self._pointer_unsynced: set[int] = set()
        # Segments rolled out while holding deferred chunks, being flushed and closed.
        self._flushing: list[Future[None]] = []
        self._flusher: ThreadPoolExecutor | None = None
        self._sync_lock = threading.Lock()
        self._rr = random.randrange(1 << 16)
        self._known_checkpoint = self._log.last_checkpoint() or 0

    def __repr__(self) -> str:
        return f"Topic({self.name!r}, partitions={self.partitions})"

    # -- state ------------------------------------------------------------------------------
    @property
    def schema(self) -> pa.Schema:
        assert self._state.schema is not None
        return self._state.schema

    @property
    def partitions(self) -> int:
        return self._state.partitions

    @property
    def version(self) -> int:
        return self._state.version

    @property
    def id(self) -> str:
        """This incarnation's id ("" for a topic made before topics had ids): a topic
        deleted and created again under its name has another."""
        return self._state.topic_id

    @property
    def config(self) -> dict[str, Any]:
        """Topic-level configuration (overrides of the store's changeable keys)."""
        return dict(self._state.config)

    def setting(self, key: str) -> Any:
        """The value of configuration key ``key`` in effect for this topic: the topic's own
        override, else the store's."""
        return self._state.config.get(key, self.store.config[key])

    def refresh(self) -> Topic:
        """Read the commit-log entries published since this handle last looked."""
        with self._lock:
            self._state = self._log.refresh(self._state)
        return self

    def state(self, refresh: bool = True) -> TopicState:
        """The topic's state (refreshed unless ``refresh=False``): segments, chunk index,
        offsets, writers, positions. Treat it as read-only."""
        if refresh:
            self.refresh()
        return self._state

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[TopicState]:
        """Hold this handle's lock and yield its refreshed state.

        A refresh applies new entries to the state's own objects in place, and another
        thread may refresh the handle at any time: what must be read consistently (a plan)
        is read, or copied, inside the block. Keep it short: commits through this handle
        wait for it."""
        with self._lock:
            yield self.state()

    @property
    def checkpointed_version(self) -> int:
        """The version of the newest checkpoint this handle knows of (0 for none)."""
        return self._known_checkpoint

    def write_checkpoint(self) -> int:
        """Write a checkpoint of this handle's state as it is (not refreshed first); returns
        its version. The entries and checkpoints it supersedes are deleted once older than
        ``log.cleanup.grace.ms``."""
        with self._lock:
            st = self._state
            self._log.write_checkpoint(st, self.setting("log.cleanup.grace.ms"))
            self._known_checkpoint = st.version
            return st.version

    def latest_offsets(self) -> dict[int, int]:
        """Per partition, the next offset to be written."""
        self.refresh()
        return dict(enumerate(self._state.next_offset))

    def earliest_offsets(self) -> dict[int, int]:
        """Per partition, the first offset still retained."""
        self.refresh()
        return dict(enumerate(self._state.start_offset))

    def _check_partition(self, partition: Any) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int | np.integer):
            raise PafkaError(f"partition must be an integer, got {partition!r}")
        if not 0 <= partition < self._state.partitions:
            self.refresh()
        if not 0 <= partition < self._state.partitions:
            raise PafkaError(f"topic {self.name!r} has no partition {partition}: it has "
                             f"partitions 0..{self._state.partitions - 1}")
        return int(partition)

    # -- writing: step 1 ------------------------------------------------------------------
    def write_chunks(self, data: Any, partition: int | None = None, key: str | None = None,
                     timestamp_column: str | None = None, durable: bool = True
                     ) -> list[ChunkRef]:
        """Append ``data`` durably as one chunk per partition touched; nothing is visible
        until :meth:`commit`. Rows go to ``partition`` if given, else by the stable hash of
        column ``key`` (nulls to 0), else all to the next partition in rotation.

        With ``durable=False`` the chunks are written but not yet flushed: a writer of many
        chunks calls :meth:`sync` once, after the last, and only then hands the references
        to the committer (one flush per segment instead of one per chunk)."""
        table = conform(as_table(data), self.schema, self.name)
        if table.num_rows == 0:
            return []
        if partition is not None and key is not None:
            raise PafkaError("give either partition or key, not both")
        if timestamp_column is not None and timestamp_column not in table.schema.names:
            raise PafkaError(f"timestamp column {timestamp_column!r} is not a column of topic "
                             f"{self.name!r} (columns: {table.schema.names})")
        groups: list[tuple[int, pa.Table]]
        if partition is not None:
            groups = [(self._check_partition(partition), table)]
        elif key is not None:
            if key not in table.schema.names:
                raise PafkaError(f"key column {key!r} is not a column of topic {self.name!r} "
                                 f"(columns: {table.schema.names})")
            groups = self._route(table, key)
        else:
            with self._lock:
                p = self._rr % self._state.partitions
                self._rr += 1
            groups = [(p, table)]
        compression = self.setting("compression.type")
        refs = []
        for p, part in groups:
            for piece in self._split(part, compression):
                refs.append(self._append_chunk(p, piece, timestamp_column, durable))
        return refs

    def sync(self) -> None:
        """Make durable every chunk this handle wrote with ``durable=False``.

        Thread-safe. Segments rolled since are flushed in the background as they are
        rolled; this waits for them too."""
        # One sync at a time: a second caller must not return while the first is still
        # flushing chunks it also wrote.
        with self._sync_lock:
            with self._lock:
                parts, self._unsynced = self._unsynced, set()
            pointers = False
            for p in sorted(parts):
                with self.store.partition_lock(self.name, p):
                    cached = self._writers.get(p)
                    if cached is not None:
                        cached[1].sync()
                    pointers |= self._sync_pointer(p, with_dir=False)
            if pointers:
                fsync_dir(partitions_dir(self.store.root, self.name))
            # Taken after the partitions: a segment rolled out before its partition was
            # synced above was queued for its flush before that, so it is in this list.
            with self._lock:
                flushing, self._flushing = self._flushing, []
            errors = [e for e in (f.exception() for f in flushing) if e is not None]
            if errors:
                raise errors[0]

    def _route(self, table: pa.Table, key: str) -> list[tuple[int, pa.Table]]:
        parts = partition_of(table.column(key), self._state.partitions)
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=self._state.partitions)
        ordered = table.take(pa.array(order))
        out, at = [], 0
        for p, n in enumerate(counts):
            if n:
                out.append((p, ordered.slice(at, int(n))))
                at += int(n)
        return out

    def _split(self, table: pa.Table, compression: str) -> Iterator[EncodedChunk]:
        """Chunks that fit in a segment; a single row too big for one gets its own segment."""
        limit = self.store.config["log.segment.bytes"] - HEADER_SIZE
        chunk = EncodedChunk.of(table.to_batches(), table.schema, compression)
        if chunk.size <= limit or table.num_rows <= 1:
            yield chunk
            return
        half = table.num_rows // 2
        yield from self._split(table.slice(0, half), compression)
        yield from self._split(table.slice(half), compression)

    def _append_chunk(self, p: int, chunk: EncodedChunk, ts_col: str | None,
                      durable: bool = True) -> ChunkRef:
        tmin = tmax = None
        if ts_col is not None:
            tmin, tmax = _time_range(chunk, ts_col)
        written = _now_ms()
        with self.store.partition_lock(self.name, p):
            # A handle on a deleted topic must not append to what its name leads to now.
            self._log.check_incarnation()
            seq, tier, w = self._active_writer(p, chunk.size, durable)
            hdr = w.header()
            pos = align(hdr.end)
            aged = hdr.end > HEADER_SIZE and written - hdr.created_ms > self.setting(
                "log.segment.ms")
            if hdr.sealed or aged or pos + chunk.size > w.capacity():
                seq, tier, w = self._roll(p, seq, w, chunk.size, durable)
                pos = align(w.header().end)
            for attempt in range(len(self.store.tiers) + 1):
                try:
                    crc = w.write_chunk(pos, chunk)
                    w.set_end(pos + chunk.size, durable)
                    break
                except OSError as e:
                    if e.errno not in NO_SPACE:
                        raise
                    if attempt == len(self.store.tiers):
                        raise StoreFull(f"topic {self.name!r} partition {p}: every local tier "
                                        f"answered {os.strerror(e.errno)} for a chunk of "
                                        f"{chunk.size} bytes; free space or run the "
                                        "migration service") from e
                    # The tier's filesystem is full: it counts as full until space returns,
                    # and the chunk goes to a new segment on the next local tier with room
                    # (StoreFull when none has). What was written here is a hole.
                    self.store.mark_out_of_space(tier, e)
                    seq, tier, w = self._roll(p, seq, w, chunk.size, durable)
                    pos = align(w.header().end)
            if durable:
                self._sync_pointer(p)
            else:
                with self._lock:
                    self._unsynced.add(p)
        return ChunkRef(self.name, p, seq, tier.number, pos, chunk.size, chunk.records, crc,
                        written, tmin, tmax, self.store.relocation(tier.number),
                        self._state.topic_id)

    def _pointer_path(self, p: int) -> str:
        return os.path.join(partitions_dir(self.store.root, self.name), f"{p}.active")

    def _read_pointer(self, p: int) -> tuple[int, int] | None:
        """(sequence, tier) named by partition ``p``'s pointer; None if it has none."""
        try:
            with open(self._pointer_path(p), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        try:
            ptr = json.loads(raw)
            return int(ptr["seq"]), int(ptr["tier"])
        except (ValueError, KeyError, TypeError):
            # A machine crash after a deferred roll can leave the renamed pointer empty. No
            # commit names that roll's segment (sync makes the pointer durable first).
            log.warning("topic %s partition %d: active pointer %s is unreadable (%r); "
                        "the next append starts a new segment", self.name, p,
                        self._pointer_path(p), raw[:64])
            return None

    def _sync_pointer(self, p: int, with_dir: bool = True) -> bool:
        """Make partition ``p``'s pointer durable if this handle relies on it unsynced
        (caller holds the partition lock); True if it did."""
        with self._lock:
            if p not in self._pointer_unsynced:
                return False
            self._pointer_unsynced.discard(p)
        try:
            fsync_file(self._pointer_path(p))
            if with_dir:
                fsync_dir(partitions_dir(self.store.root, self.name))
        except BaseException:
            with self._lock:
                self._pointer_unsynced.add(p)
            raise
        return True

    def _last_seq(self, p: int) -> int | None:
        """The highest segment sequence partition ``p`` is known to have used: a new
        segment after it cannot overwrite one that a commit names."""
        st = self.state()
        seqs = [s.seq for s in st.segments.values() if s.partition == p]
        for key in st.tombstones:
            sp, seq = parse_segment_id(key.split("@")[0])
            if sp == p:
                seqs.append(seq)
        return max(seqs, default=None)

    def _active_writer(self, p: int, need: int, durable: bool = True
                       ) -> tuple[int, Tier, SegmentWriter]:
        ptr = self._read_pointer(p)
        if ptr is None:
            return self._roll(p, self._last_seq(p), None, need, durable)
        seq, tier_no = ptr
        tier = self.store.tier(tier_no)
        cached = self._writers.get(p)
        if cached is not None and cached[0] == (seq, tier_no):
            return seq, tier, cached[1]
        if cached is not None:
            self._retire(cached[1], durable)
        try:
            w = tier.open_segment(tier.segment_path(self.name, p, seq))
        except FileNotFoundError:
            # The active segment's file is gone (e.g. tier 1 was RAM and the host rebooted):
            # start the next segment; what was lost is reported by readers as DataLoss.
            log.warning("topic %s partition %d: active segment %s is missing; rolling",
                        self.name, p, segment_id(p, seq))
            return self._roll(p, max(seq, self._last_seq(p) or 0), None, need, durable)
        # Created by another handle, which may not have made it and the pointer durable yet.
        w.defer_entry(os.path.dirname(w.path))
        with self._lock:
            self._pointer_unsynced.add(p)
        self._writers[p] = ((seq, tier_no), w)
        return seq, tier, w

    def _retire(self, w: SegmentWriter, durable: bool) -> None:
        """Close a writer that is no longer the active segment's. One rolled out by a
        deferred append is flushed and closed on a thread of this handle, so the device
        writes it while the appends go on; :meth:`sync` waits for it."""
        if durable:
            w.close()
            return
        with self._lock:
            if self._flusher is None:
                self._flusher = ThreadPoolExecutor(1, thread_name_prefix="pafka-flush")
            self._flushing.append(self._flusher.submit(w.close))

    def _roll(self, p: int, seq: int | None, old: SegmentWriter | None, need: int,
              durable: bool = True) -> tuple[int, Tier, SegmentWriter]:
        """Seal the active segment and start the next one (caller holds the partition lock).
        A deferred append (``durable=False``) leaves the old segment's flush to
        :meth:`_retire`."""
        if old is not None:
            try:
                old.seal(durable)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                # The pointer, not this flag, says which segment is active: the roll stands.
                log.warning("topic %s partition %d: sealing %s failed (%s); rolling anyway",
                            self.name, p, old.path, e)
            crash_point("segment.roll.sealed")
        new_seq = 0 if seq is None else seq + 1
        tier, w = self.store.place_segment(self.name, p, new_seq, need, durable)
        crash_point("segment.roll.created")
        # Deferred: the new segment's file and the pointer are made durable by sync(), before
        # any chunk in the segment can be committed.
        write_atomic(self._pointer_path(p),
                     json.dumps({"seq": new_seq, "tier": tier.number}).encode(), durable)
        with self._lock:
            if durable:
                self._pointer_unsynced.discard(p)
            else:
                self._pointer_unsynced.add(p)
        cached = self._writers.pop(p, None)
        if cached is not None:
            self._retire(cached[1], durable)
        self._writers[p] = ((new_seq, tier.number), w)
        log.debug("topic %s partition %d: rolled to segment %s on tier %d", self.name, p,
                  segment_id(p, new_seq), tier.number)
        return new_seq, tier, w

    def active_segment(self, p: int) -> tuple[int, int] | None:
        """(sequence, tier) of partition ``p``'s active segment, if it has one."""
        return self._read_pointer(p)

    # -- writing: step 2 ------------------------------------------------------------------
    def commit(self, refs: list[ChunkRef], writer_id: str | None = None,
               batch_id: int | None = None) -> list[AppendResult]:
        """Make ``refs`` visible in one commit-log entry, assigning offsets in their order.

        With ``writer_id`` and ``batch_id``, a batch id not above the writer's highest
        committed one is a replay: acknowledged, not appended again (returns ``[]``).
        Raises :class:`CommitConflict` if a chunk's segment was moved or deleted since.
        """
        refs = list(refs)
        for r in refs:
            if not isinstance(r, ChunkRef):
                raise PafkaError("commit takes the ChunkRefs that write_chunks returned, got "
                                 f"{type(r).__name__}")
            if r.topic != self.name:
                raise PafkaError(f"chunk of topic {r.topic!r} cannot be committed to {self.name!r}")
        if (writer_id is None) != (batch_id is None):
            raise PafkaError("give both writer_id and batch_id, or neither")
        if not refs:
            return []
        # The relocation check comes first (and holds through the publish): a chunk written
        # to a tier's old place must be refused, not taken for one already committed.
        with self._lock:
            with self.store.publishing({(r.tier, r.relocation) for r in refs}):
                results = self._commit_refs(refs, writer_id, batch_id)
            if results:
                # Still under the handle's lock: housekeeping sees the state just published.
                self.store.after_commit(self)
            return results

    def _commit_refs(self, refs: list[ChunkRef], writer_id: str | None,
                     batch_id: int | None) -> list[AppendResult]:
        """:meth:`commit` under the topic's lock and the store's publishing lock."""
        for _ in range(_MAX_COMMIT_ATTEMPTS):
            st = self._log.refresh(self._state)
            self._state = st
            if writer_id is not None and st.writers.get(writer_id, -1) >= batch_id:
                log.info("topic %s: batch %s of writer %s is already committed; skipping "
                         "the replay", self.name, batch_id, writer_id)
                return []
            fresh = unseen_chunks(self.name, st, refs)
            if not fresh:
                return []
            validate_all(append_requirements(self.name, fresh, self.store.tier), st)
            ts = max(st.last_ts, _now_ms())
            nxt = list(st.next_offset)
            chunks, results = [], []
            for r in fresh:
                base = nxt[r.partition]
                nxt[r.partition] += r.records
                chunks.append(ChunkRecord(r.partition, r.seq, r.tier, r.pos, r.length, base,
                                          r.records, r.checksum, r.tmin, r.tmax))
                results.append(AppendResult(r.partition, base, r.records, st.version + 1, ts))
            entry = AppendEntry(ts, tuple(chunks), writer_id, batch_id)
            if self._publish(st, entry, held=True):
                return results
        raise CommitConflict(f"topic {self.name!r}: gave up committing after "
                             f"{_MAX_COMMIT_ATTEMPTS} lost races")

    def _publish(self, st: TopicState, entry: Entry,
                 tiers: Iterable[tuple[int, int | None]] = (), held: bool = False) -> bool:
        """Publish ``entry`` as the next version of ``st``; apply it on success. ``tiers``:
        where the data it names was written (see :meth:`Store.publishing`); ``held``: the
        caller is inside :meth:`Store.publishing` already."""
        v = st.version + 1
        with contextlib.nullcontext() if held else self.store.publishing(tiers):
            if not self._log.publish(v, entry):
                return False
        st.apply(v, entry)
        return True

    def _publish_retrying(self, make: Any, tiers: Iterable[tuple[int, int | None]] = ()
                          ) -> TopicState:
        """Publish ``make(state)`` (an entry, or None for nothing to do) until it wins."""
        with self._lock:
            for _ in range(_MAX_COMMIT_ATTEMPTS):
                st = self._log.refresh(self._state)
                self._state = st
                entry = make(st)
                if entry is None or self._publish(st, entry, tiers):
                    return st
            raise CommitConflict(f"topic {self.name!r}: gave up after "
                                 f"{_MAX_COMMIT_ATTEMPTS} lost races")

    def append(self, data: Any, partition: int | None = None, key: str | None = None,
               timestamp_column: str | None = None) -> list[AppendResult]:
        """``write_chunks`` then ``commit``: durable and visible on return."""
        return self.commit(self.write_chunks(data, partition, key, timestamp_column))

    # -- maintenance primitives ---------------------------------------------------------------
    def _publish_checked(self, requirements: Sequence[Requirement],
                         build: Any, tiers: Iterable[tuple[int, int | None]] = ()) -> Entry:
        """Publish ``build(state)`` once every requirement holds against the state it is
        published on (checked again after each lost race); returns the entry published."""
        published: list[Entry] = []

        def make(st: TopicState) -> Entry:
            validate_all(requirements, st)
            published[:] = [build(st)]
            return published[0]

        self._publish_retrying(make, tiers)
        return published[0]

    def replace_segments(self, partition: int, sources: Sequence[int], seq: int, tier: int,
                         chunks: Sequence[ChunkRecord],
                         requirements: Sequence[Requirement] = (),
                         read_from: Iterable[int] = ()) -> MoveEntry:
        """Publish a ``move`` entry: the sealed segments ``sources`` (sequence numbers, in
        order) of ``partition`` are replaced by segment ``seq`` on tier ``tier``, which holds
        ``chunks`` (the sources' committed chunks at their positions in the new file).

        The sources must be committed segments of the partition
        (:class:`~tier_store.conflicts.SegmentsCommitted`) and every one of
        ``requirements`` must hold, checked against the state the entry is published on: a
        race lost to an entry that breaks none of them is retried, one that breaks one
        raises :class:`CommitConflict`. The entry is refused
        (:class:`~tier_store.errors.TierRelocated`) if ``tier`` or a tier of ``read_from``
        (where the chunks were read) was relocated since this store handle was opened.
        Returns the entry published. The sources' files are not touched: they become
        tombstones, for garbage collection after ``log.cleanup.grace.ms``."""
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise InvalidArgument(f"partition must be a non-negative integer, got "
                                  f"{partition!r}")
        seqs = tuple(int(q) for q in sources)
        if not seqs or len(set(seqs)) != len(seqs):
            raise InvalidArgument(f"replace_segments takes distinct source segments, got "
                                  f"{list(sources)!r}")
        moved = tuple(chunks)
        stray = [c for c in moved if (c.p, c.seq, c.tier) != (partition, seq, tier)]
        if stray:
            raise InvalidArgument(f"topic {self.name!r}: a chunk of segment "
                                  f"{segment_id(stray[0].p, stray[0].seq)} on tier "
                                  f"{stray[0].tier} is not in segment "
                                  f"{segment_id(partition, seq)} on tier {tier}")
        committed = SegmentsCommitted(self.name, tuple(segment_id(partition, q) for q in seqs))
        used = {tier, *read_from}

        def build(st: TopicState) -> MoveEntry:
            return MoveEntry(max(st.last_ts, _now_ms()), partition, seqs, seq, tier, moved)

        entry = self._publish_checked([committed, *requirements], build,
                                      {(n, self.store.relocation(n)) for n in used})
        assert isinstance(entry, MoveEntry)
        return entry

    def delete_segments(self, ids: Sequence[str], reason: str = "retention",
                        requirements: Sequence[Requirement] = ()) -> DeleteEntry:
        """Publish a ``delete`` entry removing the committed segments ``ids`` from the log
        (their records with them; the partition's earliest offset moves past them), naming
        ``reason``. The segments must be committed
        (:class:`~tier_store.conflicts.SegmentsCommitted`) and every one of ``requirements``
        must hold, checked against the state the entry is published on, as for
        :meth:`replace_segments`. Returns the entry published. The files become
        tombstones, for garbage collection after ``log.cleanup.grace.ms``."""
        if isinstance(ids, str) or not ids or not all(isinstance(i, str) for i in ids):
            raise InvalidArgument(f"delete_segments takes a list of segment ids, got {ids!r}")
        if not isinstance(reason, str) or not reason:
            raise InvalidArgument(f"reason must be a non-empty string, got {reason!r}")
        gone = tuple(ids)
        committed = SegmentsCommitted(self.name, gone)

        def build(st: TopicState) -> DeleteEntry:
            return DeleteEntry(max(st.last_ts, _now_ms()), gone, reason)

        entry = self._publish_checked([committed, *requirements], build)
        assert isinstance(entry, DeleteEntry)
        return entry

    # -- retention --------------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> list[str]:
        """Delete whole sealed segments past ``log.retention.bytes``/``.ms`` (a ``delete``
        entry now; the files after ``log.cleanup.grace.ms``). Returns the deleted ids. See
        :mod:`tier_store.maintenance.retention`."""
        return retention.apply_retention(self, now_ms)

    # -- reading ------------------------------------------------------------------------------
    def read(self, partition: int, start: int, end: int | None = None, verify: bool = True
             ) -> Iterator[pa.RecordBatch]:
        """Yield the records ``[start, end)`` of ``partition`` as Arrow record batches,
        zero-copy from memory-mapped chunks. ``end=None`` reads to the latest offset; past
        the latest there is nothing. Below the earliest retained offset: :class:`DataLoss`.
        Each chunk's checksum is checked before its bytes are decoded
        (:class:`CorruptSegment`); ``verify=False`` trusts the bytes, and a damaged chunk may
        then give wrong rows or crash the process."""
        for pb in execute(self.plan_read(partition, start, end), verify):
            yield pb.batch

    def plan_read(self, partition: int, start: int, end: int | None = None) -> ReadPlan:
        """Plan reading ``[start, end)`` of ``partition`` (see :mod:`tier_store.reading`)."""
        p = self._check_partition(partition)
        if isinstance(start, bool) or not isinstance(start, int | np.integer) or start < 0:
            raise PafkaError(f"start offset must be a non-negative integer, got {start!r}")
        with self._lock:
            st = self._state
            if end is None or end > st.next_offset[p]:
                st = self._state = self._log.refresh(st)
            earliest, latest = st.start_offset[p], st.next_offset[p]
            rows = st.chunks[p].rows()
            tiers = {s.seq: s.tier for s in st.segments.values() if s.partition == p}
        if start < earliest:
            raise DataLoss(f"topic {self.name!r} partition {p}: offsets [{start}, {earliest}) "
                           f"were deleted by retention; the earliest offset is {earliest}")
        stop = latest if end is None else max(start, min(end, latest))
        chunks: list[PlannedChunk] = []
        paths: dict[int, str] = {}  # a segment holds many chunks
        if start < stop:
            i = max(0, int(np.searchsorted(rows["base"], start, side="right")) - 1)
            j = int(np.searchsorted(rows["base"], stop, side="left"))
            sel = rows[i:j]
            for seq, pos, length, base, n, ts, crc in zip(
                    sel["seq"].tolist(), sel["pos"].tolist(), sel["len"].tolist(),
                    sel["base"].tolist(), sel["n"].tolist(), sel["ts"].tolist(),
                    sel["crc"].tolist(), strict=True):
                path = paths.get(seq)
                if path is None:
                    path = paths[seq] = self._segment_path(p, seq, tiers[seq])
                chunks.append(PlannedChunk(path, pos, length, base, n, ts, crc))
        return ReadPlan(self.store.root, self.name, p, start, max(start, stop), tuple(chunks),
                        self._state.topic_id)

    def bytes_between(self, partition: int, start: int, end: int) -> int:
        """Approximate bytes of records ``[start, end)``: whole chunks, pro rata at the ends."""
        rows = self._state.chunks[partition].rows()
        if end <= start or not len(rows):
            return 0
        i = max(0, int(np.searchsorted(rows["base"], start, side="right")) - 1)
        j = int(np.searchsorted(rows["base"], end, side="left"))
        sel = rows[i:j]
        lo = np.maximum(sel["base"], start)
        hi = np.minimum(sel["base"] + sel["n"], end)
        frac = np.clip(hi - lo, 0, None) / np.maximum(sel["n"], 1)
        return int((frac * sel["len"]).sum())

    def offset_for_time(self, partition: int, timestamp_ms: int) -> int:
        """The first offset committed at or after ``timestamp_ms`` (latest if none)."""
        p = self._check_partition(partition)
        self.refresh()
        st = self._state
        rows = st.chunks[p].rows()
        i = int(np.searchsorted(rows["ts"], timestamp_ms, side="left"))
        return int(rows["base"][i]) if i < len(rows) else st.next_offset[p]

    def _segment_path(self, p: int, seq: int, tier: int) -> str:
        return self.store.tier(tier).segment_path(self.name, p, seq)

    # -- segments, partitions, positions --------------------------------------------------
    def segments(self) -> list[SegmentInfo]:
        """The committed segments, by partition and base offset."""
        st = self.state()
        grace_s = self.setting("log.cleanup.grace.ms") / 1000.0
        now = time.time()
        out = []
        for p in range(st.partitions):
            active = self.active_segment(p)
            rows = st.chunks[p].rows()
            seqs, inverse = np.unique(rows["seq"], return_inverse=True)
            spans = dict(zip(seqs.tolist(), np.bincount(
                inverse, weights=(rows["len"] + CHUNK_ALIGN - 1) // CHUNK_ALIGN * CHUNK_ALIGN
            ).astype(np.int64).tolist(), strict=True)) if len(rows) else {}
            for s in st.partition_segments(p):
                tier = self.store.tier(s.tier)
                path = tier.segment_path(self.name, p, s.seq)
                is_active = (s.seq, s.tier) == active
                hdr = tier.read_header(path) if is_active or tier.local else None
                # The active one is sealed once a roll or the idle check sealed its header.
                sealed = not is_active or (hdr is not None and hdr.sealed)
                settled = is_settled(path, hdr, spans.get(s.seq, 0), grace_s, now)
                out.append(SegmentInfo(
                    s.id, self.name, p, s.base, s.end, s.records, s.bytes, s.chunks, s.tier,
                    tier.type, path, sealed, s.first_ts, s.last_ts, settled))
        return out

    def add_partitions(self, n: int) -> int:
        """Add ``n`` partitions (readers discover them); returns the new total."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PafkaError(f"add_partitions takes a positive number of partitions, got {n!r}")
        total: list[int] = []

        def make(st: TopicState) -> Entry:
            total[:] = [st.partitions + n]
            return PartitionsEntry(max(st.last_ts, _now_ms()), st.partitions + n)

        self._publish_retrying(make)
        os.makedirs(partitions_dir(self.store.root, self.name), exist_ok=True)
        return total[0]

    def set_position(self, group: str, offsets: Mapping[int | str, int]) -> None:
        """Record consumer group ``group``'s committed offsets for the partitions named (for
        lag and ``startingOffsets=group``; retention ignores them).

        The offsets are merged into the group's position: the partitions named get the new
        offsets, the group's other partitions keep theirs (:meth:`reset_position` replaces
        the whole position). An offset must lie in ``[0, latest]``."""
        clean = self._check_position(group, offsets)
        if not clean:
            raise PafkaError(f"set_position of group {group!r} names no partition; "
                             "delete_group() removes a group")

        def make(st: TopicState) -> Entry:
            # Merged with the state this entry is published against, not the one the call
            # started from: a commit of the group that won the race in between is kept.
            merged = {int(p): o for p, o in st.positions.get(group, {}).items()}
            merged.update(clean)
            return self._position_entry(st, group, merged)

        self._publish_retrying(make)

    def reset_position(self, group: str, offsets: Mapping[int | str, int]) -> None:
        """Replace consumer group ``group``'s whole position by ``offsets``: partitions not
        named lose their committed offset (a reader starting from the group starts them at
        the earliest offset). Creates the group if it has no position yet."""
        clean = self._check_position(group, offsets)
        if not clean:
            raise PafkaError(f"reset_position of group {group!r} names no partition; "
                             "delete_group() removes a group")
        self._publish_retrying(lambda st: self._position_entry(st, group, clean))

    def delete_group(self, group: str) -> None:
        """Forget consumer group ``group``'s position on this topic. A group it does not
        have is an error naming the groups it has."""
        self._check_group_name(group)

        def make(st: TopicState) -> Entry:
            if group not in st.positions:
                raise PafkaError(f"topic {self.name!r} has no consumer group {group!r}; "
                                 f"its groups: {', '.join(sorted(st.positions)) or '(none)'}")
            # An empty position removes the group on replay (see tier_store.state).
            return PositionEntry(max(st.last_ts, _now_ms()), group, {})

        self._publish_retrying(make)

    @staticmethod
    def _check_group_name(group: Any) -> None:
        if not isinstance(group, str) or not group:
            raise PafkaError(f"consumer group must be a non-empty string, got {group!r}")

    def _check_position(self, group: str, offsets: Mapping[int | str, int]) -> dict[int, int]:
        """``offsets`` checked: partitions of this topic, offsets in ``[0, latest]``."""
        self._check_group_name(group)
        if not isinstance(offsets, Mapping):
            raise PafkaError("offsets must be a mapping of partition to offset, got "
                             f"{type(offsets).__name__}")
        clean: dict[int, int] = {}
        latest = self.latest_offsets()
        for k, v in offsets.items():
            try:
                number = int(k)
            except (TypeError, ValueError):
                raise PafkaError(f"partition must be an integer, got {k!r}") from None
            p = self._check_partition(number)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
                raise PafkaError(f"offset for partition {p} must be a non-negative integer, "
                                 f"got {v!r}")
            if v > latest[p]:
                # A position past the log would show as negative lag.
                raise PafkaError(f"offset {v} for partition {p} of topic {self.name!r} is past "
                                 f"its latest offset {latest[p]}")
            clean[p] = int(v)
        return clean

    @staticmethod
    def _position_entry(st: TopicState, group: str, offsets: Mapping[int, int]) -> Entry:
        # Partitions in ascending order, as in every offsets JSON of the project.
        ordered = {str(p): int(offsets[p]) for p in sorted(offsets)}
        return PositionEntry(max(st.last_ts, _now_ms()), group, ordered)

    def positions(self) -> dict[str, dict[int, int]]:
        """Every consumer group's committed offsets."""
        st = self.state()
        return {g: {int(p): o for p, o in offs.items()} for g, offs in st.positions.items()}

    def close(self) -> None:
        """Flush and release every segment writer this handle holds, and its log."""
        self.sync()
        for _, w in self._writers.values():
            w.close()
        self._writers.clear()
        if self._flusher is not None:
            self._flusher.shutdown(wait=True)
            self._flusher = None
        self._log.close()


def is_settled(path: str, hdr: SegmentHeader | None, committed_span: int, grace_s: float,
               now: float) -> bool:
    """Whether every chunk of a segment file is committed, or the rest is older than the grace
    period (abandoned). ``committed_span`` is the aligned length of its committed chunks."""
    if hdr is None or align(hdr.end) - HEADER_SIZE <= committed_span:
        return True
    try:
        return now - os.stat(path).st_mtime > grace_s
    except FileNotFoundError:
        return True


def _time_range(chunk: EncodedChunk, column: str) -> tuple[int | None, int | None]:
    """Min and max of an event-time column, in milliseconds since the epoch."""
    arrays = [b.column(column) for b in chunk.batches]
    col = pa.chunked_array(arrays)
    t = col.type
    if pa.types.is_timestamp(t):
        col = col.cast(pa.timestamp("ms", tz=t.tz)).cast(pa.int64())
    elif pa.types.is_date(t):
        col = col.cast(pa.timestamp("ms")).cast(pa.int64())
    elif not pa.types.is_integer(t):
        raise PafkaError(f"timestamp column {column!r} must be a timestamp, date or integer "
                         f"(milliseconds) column, not {t}")
    import pyarrow.compute as pc  # here: importing it costs every process ~60 ms

    mm = pc.min_max(col)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return (None if lo is None else int(lo)), (None if hi is None else int(hi))


__all__ = ["NO_TIME", "Topic", "as_table", "conform"]
