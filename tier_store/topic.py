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
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .chunk import EncodedChunk
from .commit_log import CommitLog
from .crash import crash_point
from .entries import AppendEntry, ChunkRecord, DeleteEntry, Entry, PartitionsEntry, PositionEntry
from .errors import CommitConflict, DataLoss, PafkaError, SchemaMismatch, StoreFull
from .hashing import partition_of
from .layout import (
    fsync_dir,
    fsync_file,
    parse_segment_id,
    partitions_dir,
    segment_id,
    write_atomic,
)
from .reading import PlannedChunk, ReadPlan, execute
from .records import AppendResult, ChunkRef, SegmentInfo
from .retention import segments_to_delete
from .segment import CHUNK_ALIGN, HEADER_SIZE, SegmentHeader, align
from .state import NO_TIME, TopicState
from .tiers import NO_SPACE, SegmentWriter, Tier

if TYPE_CHECKING:
    from .store import Store

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

    def __init__(self, store: Store, name: str, state: TopicState, commit_log: CommitLog):
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

    def _setting(self, key: str) -> Any:
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
        compression = self._setting("compression.type")
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
            aged = hdr.end > HEADER_SIZE and written - hdr.created_ms > self._setting(
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
                self._after_commit()
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
            fresh = self._unseen(st, refs)
            if not fresh:
                return []
            self._check_refs(st, fresh)
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

    def _unseen(self, st: TopicState, refs: list[ChunkRef]) -> list[ChunkRef]:
        """Drop refs already committed (a retried commit without a writer id)."""
        out = []
        for r in refs:
            if not 0 <= r.partition < st.partitions:
                raise PafkaError(f"topic {self.name!r} has no partition {r.partition}")
            # A chunk is committed after it was written, so only rows committed since then
            # can hold it: a short tail of the index.
            tail = st.chunks[r.partition].committed_since(r.written_ms - 1000)
            same = tail[(tail["seq"] == r.seq) & (tail["pos"] == r.pos)]
            if len(same):
                if int(same["len"][0]) != r.length or int(same["crc"][0]) != r.checksum:
                    # The place was reused after this chunk was written (its segment's
                    # uncommitted tail was recovered and appended to again): the chunk's bytes
                    # are gone, and skipping it would drop its records silently.
                    raise CommitConflict(
                        f"topic {self.name!r}: segment {segment_id(r.partition, r.seq)} "
                        f"holds another committed chunk at {r.pos}; this chunk was overwritten "
                        "before it was committed: write the batch again")
                log.info("topic %s: chunk %s@%d already committed", self.name,
                         segment_id(r.partition, r.seq), r.pos)
                continue
            out.append(r)
        return out

    def _check_refs(self, st: TopicState, refs: list[ChunkRef]) -> None:
        for r in refs:
            if r.topic_id and r.topic_id != st.topic_id:
                raise CommitConflict(
                    f"topic {self.name!r}: a chunk was written to an incarnation of the topic "
                    f"(id {r.topic_id}) that was deleted; the topic is now id "
                    f"{st.topic_id or '(none)'}: write the batch again")
            sid = segment_id(r.partition, r.seq)
            seg = st.segments.get(sid)
            gone = st.tombstone(sid, r.tier) is not None and (seg is None or seg.tier != r.tier)
            if gone or (seg is not None and seg.tier != r.tier):
                raise CommitConflict(
                    f"topic {self.name!r}: segment {sid} was moved or deleted after its chunk "
                    "was written; write the batch again")
            if seg is None:
                tier = self.store.tier(r.tier)
                path = tier.segment_path(self.name, r.partition, r.seq)
                if not tier.exists(path):
                    raise CommitConflict(
                        f"topic {self.name!r}: segment {sid} is gone from tier {r.tier} "
                        f"({path}); write the batch again")

    def append(self, data: Any, partition: int | None = None, key: str | None = None,
               timestamp_column: str | None = None) -> list[AppendResult]:
        """``write_chunks`` then ``commit``: durable and visible on return."""
        return self.commit(self.write_chunks(data, partition, key, timestamp_column))

    def _after_commit(self) -> None:
        """Housekeeping after a published commit: checkpoint, garbage, retention.

        The commit is already visible, so a failure here is logged, not raised: a caller
        told that its commit failed would retry it and, without a writer id, append its
        records twice. A failed checkpoint is written by a later commit (at most
        ``2 * log.checkpoint.interval`` versions on); garbage and retention run again too."""
        st = self._state
        interval = self._setting("log.checkpoint.interval")
        if st.version % interval == 0 or st.version - self._known_checkpoint >= 2 * interval:
            try:
                self._log.write_checkpoint(st, self._setting("log.cleanup.grace.ms"))
                self._known_checkpoint = st.version
            except Exception as e:
                self._housekeeping_failed(f"writing the checkpoint at version {st.version}", e)
            try:
                self.store.collect_garbage(self)
            except Exception as e:
                self._housekeeping_failed("collecting garbage", e)
        try:
            self.apply_retention()
        except Exception as e:
            self._housekeeping_failed("applying retention", e)

    def _housekeeping_failed(self, what: str, e: Exception) -> None:
        log.warning("topic %s: %s after committing version %d failed: %s: %s (the commit "
                    "stands; this is retried after a later commit)", self.name, what,
                    self._state.version, type(e).__name__, e)

    # -- retention --------------------------------------------------------------------------
    def apply_retention(self, now_ms: int | None = None) -> list[str]:
        """Delete whole sealed segments past ``log.retention.bytes``/``.ms`` (a ``delete``
        entry now; the files after ``log.cleanup.grace.ms``). Returns the deleted ids."""
        rbytes = self._setting("log.retention.bytes")
        rms = self._setting("log.retention.ms")
        if rbytes < 0 and rms < 0:
            return []
        now = _now_ms() if now_ms is None else now_ms
        chosen: list[str] = []

        def make(st: TopicState) -> Entry | None:
            chosen[:] = segments_to_delete(st, rbytes, rms, now)
            return DeleteEntry(max(st.last_ts, _now_ms()), tuple(chosen)) if chosen else None

        self._publish_retrying(make)
        if chosen:
            log.info("topic %s: retention deleted segments %s", self.name, ", ".join(chosen))
        return chosen

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
        grace_s = self._setting("log.cleanup.grace.ms") / 1000.0
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
