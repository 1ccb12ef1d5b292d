"""A topic's state, rebuilt by replaying its commit log.

Replay rules, applied in version order:

* ``create`` sets the schema, the partition count and topic config; it is entry 0.
* ``append`` assigns nothing any more: its chunks carry their base offsets. It adds them to
  their partitions' chunk indexes, creates the segments it names on first sight, advances
  ``next_offset``, and raises the writer's highest batch id.
* ``delete`` removes whole segments; the partition's earliest offset moves to the first
  retained record; the files become tombstones, reclaimed after the grace period.
* ``move`` replaces sealed segments of one partition by one segment on another tier; offsets
  are unchanged, chunk positions are the new ones; the old files become tombstones.
* ``partitions`` raises the partition count; ``position`` replaces a consumer group's offsets
  (the whole position: merging happens before publishing), and an empty one deletes the
  group; ``config`` updates topic config (the most recent value of a key wins; null unsets).
* Every entry's ``ts`` raises ``last_ts``; timestamps are monotonic per topic.

Every entry is checked against the state it extends before it changes anything (entry 0 and
only it creates; chunks continue their partition's next offset, lie past the segment header,
stay on their segment's tier; partitions exist and never shrink; a move keeps its offsets), and
a checkpoint's state against itself: a log that breaks one is
:class:`~tier_store.errors.CorruptLog` naming the file, never a state with rows missing or
twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .chunk_index import (
    CHUNK_DTYPE,
    COLUMN_TYPES,
    NO_TIME,
    ChunkIndex,
    InlineRows,
    SegmentRows,
    rows_table,
)
from .entries import (
    AppendEntry,
    ConfigEntry,
    CreateEntry,
    DeleteEntry,
    Entry,
    LakeRecord,
    MoveEntry,
    PartitionsEntry,
    PositionEntry,
    SchemaEntry,
    lake_record,
)
from .errors import CorruptLog
from .index_pieces import IndexPieces, PieceRef
from .layout import segment_id
from .pending_checkpoint import PendingCheckpoint
from .schemas import checked_schema, schema_to_text
from .state_checks import check_checkpoint_meta, entry_problem


@dataclass
class SegmentState:
    """What the log knows of one segment."""

    partition: int
    seq: int
    tier: int
    base: int  # first offset
    end: int  # next offset after its last committed record
    records: int
    bytes: int  # committed chunk bytes
    extent: int  # max(pos + len) of committed chunks: the file length readers need
    chunks: int
    first_ts: int
    last_ts: int
    # The host that wrote it, on a store shared by many hosts: its copy there is a cache.
    host: str | None = None
    lake: LakeRecord | None = None  # its Parquet file, when on a lake tier

    @property
    def id(self) -> str:
        return segment_id(self.partition, self.seq)


@dataclass
class PartitionState:
    """One partition's part of a topic's state."""

    number: int
    next_offset: int = 0  # the next offset to be written
    start_offset: int = 0  # the first offset still retained
    chunks: ChunkIndex = field(default_factory=ChunkIndex)
    segments: dict[int, SegmentState] = field(default_factory=dict)  # by sequence number

    def by_base(self) -> list[SegmentState]:
        """The partition's segments in offset order."""
        return sorted(self.segments.values(), key=lambda s: s.base)


@dataclass
class TopicState:
    """A topic's state at one commit-log version."""

    name: str
    version: int = -1
    schema: pa.Schema | None = None
    partitions: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    created_ts: int = 0
    last_ts: int = 0
    topic_id: str = ""  # the incarnation (CreateEntry.id)
    # [version, ts, schema text] of the schema made at create and of each change since.
    schemas: list[list[Any]] = field(default_factory=list)
    parts: list[PartitionState] = field(default_factory=list)
    # Every partition's segments by id ("<partition>-<seq>"), as the log names them.
    segments: dict[str, SegmentState] = field(default_factory=dict)
    writers: dict[str, int] = field(default_factory=dict)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)
    # "<id>@<tier>" -> [tier, ts of the delete or move, its version] of segment files no
    # longer referenced, reclaimed after the grace period (no version: read from a
    # checkpoint written before index pieces)
    tombstones: dict[str, list[int]] = field(default_factory=dict)
    # Where the chunk indexes read their pieces (the log this state was read from).
    index: IndexPieces = field(default_factory=IndexPieces)

    def part(self, p: int) -> PartitionState:
        """Partition ``p``'s state."""
        return self.parts[p]

    @property
    def next_offset(self) -> list[int]:
        """Per partition, the next offset to be written (a copy)."""
        return [q.next_offset for q in self.parts]

    @property
    def start_offset(self) -> list[int]:
        """Per partition, the first offset still retained (a copy)."""
        return [q.start_offset for q in self.parts]

    @property
    def chunks(self) -> list[ChunkIndex]:
        """Per partition, the committed chunks' index."""
        return [q.chunks for q in self.parts]

    def _add_segment(self, seg: SegmentState) -> None:
        self.segments[seg.id] = seg
        self.parts[seg.partition].segments[seg.seq] = seg

    def _drop_segment(self, sid: str) -> SegmentState | None:
        seg = self.segments.pop(sid, None)
        if seg is not None:
            self.parts[seg.partition].segments.pop(seg.seq, None)
        return seg

    def tombstone(self, sid: str, tier: int) -> list[int] | None:
        """[tier, ts] if segment ``sid``'s file on ``tier`` was deleted or moved away."""
        return self.tombstones.get(f"{sid}@{tier}")

    # -- replay -------------------------------------------------------------------------
    def apply(self, version: int, entry: Entry, where: str = "") -> None:
        """Apply ``entry`` as ``version``; :class:`CorruptLog` naming ``where`` (the entry's
        file) if it does not extend this state, which is then unchanged."""
        if version != self.version + 1:
            raise CorruptLog(
                f"topic {self.name!r}: commit log version {version} follows {self.version}"
            )
        problem = entry_problem(self, version, entry)
        if problem is not None:
            raise CorruptLog(f"topic {self.name!r}: commit-log entry "
                             f"{where or f'version {version}'} {problem}")
        if isinstance(entry, CreateEntry):
            self.schema = checked_schema(entry.schema, where or f"version {version}")
            self.config = dict(entry.config)
            self.created_ts = entry.ts
            self.topic_id = entry.id
            self.schemas = [[version, entry.ts, entry.schema]]
            self._grow(entry.partitions)
        elif isinstance(entry, SchemaEntry):
            self.schema = checked_schema(entry.schema, where or f"version {version}")
            self.schemas = [*self.schemas, [version, entry.ts, entry.schema]]
        elif isinstance(entry, AppendEntry):
            self._apply_append(entry)
        elif isinstance(entry, DeleteEntry):
            self._apply_delete(entry, version)
        elif isinstance(entry, MoveEntry):
            self._apply_move(entry, version)
        elif isinstance(entry, PartitionsEntry):
            self._grow(entry.partitions)
        elif isinstance(entry, PositionEntry):
            # An entry carries the group's whole position (Topic.set_position merges before
            # publishing); an empty one deletes the group.
            if entry.offsets:
                self.positions[entry.group] = dict(entry.offsets)
            else:
                self.positions.pop(entry.group, None)
        elif isinstance(entry, ConfigEntry):
            for k, v in entry.config.items():  # null unsets a key (Topic.set_config)
                if v is None:
                    self.config.pop(k, None)
                else:
                    self.config[k] = v
        self.last_ts = max(self.last_ts, entry.ts)
        self.version = version

    def _grow(self, partitions: int) -> None:
        while self.partitions < partitions:
            self.parts.append(PartitionState(self.partitions,
                                             chunks=ChunkIndex(self.partitions, self.index)))
            self.partitions += 1

    def _apply_append(self, e: AppendEntry) -> None:
        for c in e.chunks:
            part = self.parts[c.partition]
            seg = part.segments.get(c.seq)
            if seg is None:
                seg = SegmentState(c.partition, c.seq, c.tier, c.base, c.base, 0, 0, 0, 0,
                                   e.ts, e.ts, c.host)
                self._add_segment(seg)
            # Concurrent writers may commit a segment's chunks out of order, so a segment's
            # offsets need not be one range: keep its min and max.
            seg.base = min(seg.base, c.base)
            seg.end = max(seg.end, c.base + c.records)
            seg.records += c.records
            seg.bytes += c.length
            seg.extent = max(seg.extent, c.pos + c.length)
            seg.chunks += 1
            seg.last_ts = e.ts
            part.chunks.append(c, e.ts)
            part.next_offset = c.base + c.records
        if e.writer is not None and e.batch is not None:
            self.writers[e.writer] = max(self.writers.get(e.writer, -1), e.batch)

    def _apply_delete(self, e: DeleteEntry, version: int) -> None:
        by_part: dict[int, set[int]] = {}
        for sid in e.segments:
            seg = self._drop_segment(sid)
            if seg is None:
                continue
            self.tombstones[f"{sid}@{seg.tier}"] = [seg.tier, e.ts, version]
            by_part.setdefault(seg.partition, set()).add(seg.seq)
        for p, seqs in by_part.items():
            part = self.parts[p]
            part.chunks.drop_segments(seqs)
            remaining = [s.base for s in part.segments.values()]
            part.start_offset = min(remaining) if remaining else part.next_offset

    def _apply_move(self, e: MoveEntry, version: int) -> None:
        # entry_problem checked that the log holds every source, and read their rows: the
        # new rows' timestamps come from them (PiecesGone, before any change, if it could
        # not).
        self.parts[e.partition].chunks.replace_segments(set(e.sources), list(e.chunks),
                                                        e.seq, e.tier)
        olds = [self._drop_segment(segment_id(e.partition, s)) for s in e.sources]
        assert all(o is not None for o in olds)
        for old in olds:
            if old is not None and not (old.seq == e.seq and old.tier == e.tier):
                self.tombstones[f"{old.id}@{old.tier}"] = [old.tier, e.ts, version]
        new = SegmentState(
            e.partition, e.seq, e.tier, min(o.base for o in olds if o),
            max(o.end for o in olds if o), sum(c.records for c in e.chunks),
            sum(c.length for c in e.chunks), max((c.pos + c.length for c in e.chunks), default=0),
            len(e.chunks), min(o.first_ts for o in olds if o), max(o.last_ts for o in olds if o),
            lake=e.lake)
        self._add_segment(new)
        self.tombstones.pop(f"{new.id}@{new.tier}", None)

    # -- queries ------------------------------------------------------------------------
    def partition_segments(self, p: int) -> list[SegmentState]:
        """Partition ``p``'s segments by base offset."""
        return self.parts[p].by_base()

    # -- checkpoints --------------------------------------------------------------------
    def to_checkpoint(self, put: Callable[[str, pa.Table], str] | None = None) -> pa.Table:
        """The state as one Arrow table: the chunk rows no index piece holds, the rest as
        schema metadata. With ``put`` (which stores a piece, see
        :mod:`tier_store.index_pieces`), full blocks of rows and the rows of sealed segments
        are cut into pieces first, and the checkpoint names them."""
        return checkpoint_table(*self.checkpoint_parts(put))

    def checkpoint_parts(self, put: Callable[[str, pa.Table], str] | None = None
                         ) -> tuple[np.ndarray, bytes]:
        """What :meth:`to_checkpoint` holds, apart from the state: a copy of the loose rows
        and the metadata's JSON (:func:`checkpoint_table` makes the table from them). With
        ``put``, pieces are cut first, all under the handle's lock (:meth:`begin_checkpoint`
        keeps their writing out of it)."""
        pending = self.begin_checkpoint(put)
        pending.write_pieces()
        pending.install()
        return pending.parts()

    def begin_checkpoint(self, put: Callable[[str, pa.Table], str] | None = None
                         ) -> PendingCheckpoint:
        """A checkpoint of the state as it is now: what it needs is taken here, under the
        handle's lock; the rest is done outside it (see :mod:`tier_store.pending_checkpoint`).
        With ``put``, full blocks of rows and the rows of sealed segments go to pieces."""
        meta = {
            # 5 once the schema changed, 4 when a segment is in a lake: other stores stay
            # readable by older readers.
            "format": 5 if len(self.schemas) > 1 else
            4 if any(s.lake is not None for s in self.segments.values()) else 3,
            "name": self.name, "version": self.version,
            # The text the log holds (another pyarrow may serialize the same schema otherwise).
            "schema": self.schemas[-1][2] if len(self.schemas) > 1 else
            schema_to_text(self.schema) if self.schema is not None else None,
            "partitions": self.partitions, "config": self.config,
            "created_ts": self.created_ts, "last_ts": self.last_ts,
            "topic_id": self.topic_id,
            **({"schemas": self.schemas} if len(self.schemas) > 1 else {}),
            "next_offset": self.next_offset, "start_offset": self.start_offset,
            "segments": None,  # with their pieces, once cut
            "writers": self.writers, "positions": self.positions,
            "tombstones": self.tombstones,
            "chunk_counts": None,
        }
        return PendingCheckpoint(
            self.version, [q.chunks for q in self.parts],
            [_live_segments(q) for q in self.parts],
            [(s.partition, s.seq, _segment_json(s)) for s in self.segments.values()],
            json.dumps(meta), put)  # the JSON now: the state changes after the lock

    @classmethod
    def from_checkpoint(cls, table: pa.Table, where: str, version: int | None = None,
                        topic: str | None = None) -> TopicState:
        """The state checkpoint ``where`` holds (``table``); :class:`CorruptLog` naming it if
        it is malformed, or is not ``version`` of ``topic`` (when given). A checkpoint
        written before index pieces (no ``format``) holds every row inline."""
        try:
            meta = json.loads(table.schema.metadata[b"pafka.state"])
            check_checkpoint_meta(meta, table, COLUMN_TYPES, version, topic)
            st = cls(meta["name"])
            st.version = meta["version"]
            st.schema = checked_schema(meta["schema"], where) if meta["schema"] else None
            st.partitions = meta["partitions"]
            st.config = meta["config"]
            st.created_ts, st.last_ts = meta["created_ts"], meta["last_ts"]
            st.topic_id = meta["topic_id"]
            st.schemas = meta.get("schemas") or \
                ([[0, st.created_ts, meta["schema"]]] if meta["schema"] else [])
            nexts, starts = meta["next_offset"], meta["start_offset"]
            counts = meta["chunk_counts"]
            rows_of: list[list[SegmentRows]] = [[] for _ in range(st.partitions)]
            segs = []
            for s in meta["segments"]:
                s = dict(s)
                pieces = [PieceRef.from_json(r, where) for r in s.pop("pieces", [])]
                if "lake" in s:
                    s["lake"] = lake_record(s["lake"])
                segs.append(SegmentState(**s))
                rows_of[segs[-1].partition].append(SegmentRows(s["seq"], s["tier"], pieces))
            at = 0
            held = InlineRows(table, where)
            for p in range(st.partitions):
                st.parts.append(PartitionState(p, nexts[p], starts[p], ChunkIndex(
                    p, st.index, (held, at, counts[p]), rows_of[p])))
                at += counts[p]
            for seg in segs:
                st._add_segment(seg)
            st.writers, st.positions = meta["writers"], meta["positions"]
            st.tombstones = meta["tombstones"]
        except (KeyError, TypeError, ValueError, IndexError, AttributeError,
                RecursionError) as e:
            raise CorruptLog(f"checkpoint {where} is malformed: {e}") from None
        return st


def checkpoint_table(rows: np.ndarray, meta: bytes) -> pa.Table:
    """A checkpoint's table from :meth:`TopicState.checkpoint_parts`."""
    return rows_table(rows).replace_schema_metadata({b"pafka.state": meta})


def _live_segments(part: PartitionState) -> set[int]:
    """The segments of ``part`` that may still be written: each host's (one, on a store
    not shared) with the highest offsets. The others are sealed: their rows go to pieces."""
    newest: dict[str | None, SegmentState] = {}
    for s in part.segments.values():
        top = newest.get(s.host)
        if top is None or s.base > top.base:
            newest[s.host] = s
    return {s.seq for s in newest.values()}


def _segment_json(s: SegmentState) -> dict[str, Any]:
    """A segment as a checkpoint holds it (``host`` only on a shared store's)."""
    d = asdict(s)
    if d["host"] is None:
        del d["host"]
    if s.lake is None:
        del d["lake"]
    else:
        d["lake"] = s.lake._asdict()
    return d


__all__ = ["CHUNK_DTYPE", "NO_TIME", "ChunkIndex", "PartitionState", "SegmentState", "TopicState"]
