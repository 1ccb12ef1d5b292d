"""Demotion to a lake tier: sealed segments of one partition become one Parquet file of the
topic's Delta table, then one ``move`` entry names its row groups as their chunks.

1. **Read** the committed chunks, each checked against its checksum, and decode them.
2. **Build** the file in memory (:func:`tier_store.lake.build_file`): its name is a function
   of the partition and the source segments (first and last sequence), and its bytes of the
   rows, so a retry builds the same file again.
3. **Write** it whole to the table's directory (durable, or one object PUT).
4. **Commit** it to the table: one Delta commit of one add action, carrying transaction
   (``pafka-<topic id>-<partition>``, last source's sequence + 1).
5. **Publish** the ``move`` entry, naming the file and its row groups.

What the table holds is read from its files, never inferred: a file holds the segments its
name says, and Delta keys files by path, so the same file is never counted twice. A crash
before 4 leaves a file no table version names (the next attempt writes it again). A crash
after 4 leaves both copies, consistent: the table holds the rows, the log still names the
segment files. The retry finds the file in the table with the same bytes as it builds, and
goes straight to 5. Planned meanwhile with more segments, it publishes the committed run
first. Any other overlap with the table's files leaves the segments where they are, never
adding rows twice. The sources' files become tombstones, as after any move.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..chunk import checksum
from ..chunk_decoder import ChunkDecoder
from ..conflicts import Requirement
from ..crash import crash_point
from ..entries import ChunkRecord, LakeRecord
from ..errors import CommitConflict, CorruptSegment, SegmentNotMovable
from ..lake import build_file
from ..lake_table import LakeTable
from ..layout import segment_id
from .bundles import source_chunks

if TYPE_CHECKING:
    from ..state import SegmentState
    from ..tiers.lake_tier import LakeTier
    from ..topic import Topic

log = logging.getLogger(__name__)

LAKE_POINTS = ("lake.written", "lake.committed")
"""Crash points of a demotion: after its file is written, after its Delta commit."""


OPEN_TABLES = 64  # tables a lake tier handle keeps open (each holds its files' list)


def lake_table(topic: Topic, target: LakeTier) -> LakeTable:
    """The table of ``topic``'s incarnation on lake tier ``target``: one handle per tier
    handle and incarnation, brought up to date at each use."""
    with target.tables_lock:
        table = target.tables.get(topic.id)
        if table is None:
            table = LakeTable(target.path, topic.name, topic.id, topic.schema,
                              target.storage_options())
            target.tables[topic.id] = table
            while len(target.tables) > OPEN_TABLES:
                target.tables.popitem(last=False)
        target.tables.move_to_end(topic.id)
        return table


def lake_summary(topic: Topic) -> dict[str, Any] | None:
    """``topic``'s table on its store's lake tier (:meth:`LakeTable.summary`); None if the
    store has no lake."""
    last = topic.store.tiers[-1]
    if not last.is_lake:
        return None
    return lake_table(topic, last).summary()  # type: ignore[arg-type]


def demote(topic: Topic, target: LakeTier, segs: Sequence[SegmentState], rows: np.ndarray
           ) -> tuple[list[SegmentState], list[ChunkRecord], LakeRecord]:
    """Write and commit the lake file of segments ``segs`` (one partition, sequence order;
    ``rows``: their committed chunks, in offset order) on ``target``. Returns the segments
    it holds (``segs``, or the first of them when the table holds a file of those already:
    a run committed before a crash, then planned with more), the chunks (row groups) and the
    record the move entry names."""
    p = segs[0].partition
    table = lake_table(topic, target)
    table.evolve(topic.schema)  # a schema change its evolve could not make there (a crash)
    first, last = segs[0].seq, segs[-1].seq
    held = [run for run in table.held(p) if run[0] <= last and first <= run[1]]
    if held and held != [(first, last)]:
        run = held[0]
        if len(held) > 1 or run[0] != first or run[1] > last:
            raise SegmentNotMovable(
                f"topic {topic.name!r}: the lake table holds files of segments "
                f"{sorted(held)} of partition {p}, across the run {[s.id for s in segs]}; "
                "those segments stay where they are")
        # A run committed before a crash, planned now with more: that run goes first.
        segs = [s for s in segs if s.seq <= run[1]]
        rows = rows[np.isin(rows["seq"], [s.seq for s in segs])]
        last = run[1]
    bufs = source_chunks(topic, segs, rows)
    f, data = build_file(topic.schema, p, (first, last), _runs(topic, p, rows, bufs))
    path = target.file_path(topic.name, topic.id, p, first, last)
    if held:
        # A retry after a crash past the commit: the table holds this run. Its file must be
        # exactly the one built now, or the log would name bytes the table does not hold.
        have = target.read_range(path, 0, data.size) if target.exists(path) else None
        if have is None or have.size != data.size or checksum(have) != checksum(data):
            raise SegmentNotMovable(
                f"topic {topic.name!r}: the lake table holds {path}, but not with the rows "
                f"of segments {[s.id for s in segs]} as built now; they stay where they are")
        version = table.version()
        log.info("%s: the table holds %s already (a retried demotion)", table, path)
    else:
        target.write_file(path, data)
        crash_point("lake.written")
        ts = rows["ts"]
        version = table.add(p, f, int(ts.min()), int(ts.max()), last + 1)
        crash_point("lake.committed")
    chunks = [ChunkRecord(p, first, target.number, g.pos, g.length, g.base, g.records,
                          g.checksum, st=g.st) for g in f.groups]
    return list(segs), chunks, LakeRecord(f.size, f.footer_pos, f.footer_length,
                                          f.footer_checksum, version, last)


def demote_and_publish(topic: Topic, target: LakeTier, segs: Sequence[SegmentState],
                       rows: np.ndarray, seen: Requirement) -> list[SegmentState] | None:
    """:func:`demote`, then publish the move entry if ``seen`` (the sources as planned)
    still holds; returns the segments moved (``segs`` or their first ones), None if it lost
    a race (the caller plans again: the table keeps what it committed, and the retry finds
    it there)."""
    segs, chunks, lake = demote(topic, target, segs, rows)
    try:
        topic.replace_segments(segs[0].partition, [s.seq for s in segs], segs[0].seq,
                               target.number, chunks, requirements=[seen],
                               read_from=[s.tier for s in segs], lake=lake)
    except CommitConflict as e:
        log.info("topic %s: demotion of %s lost a race (%s); retrying", topic.name,
                 [s.id for s in segs], e)
        return None
    return segs


def _runs(topic: Topic, p: int, rows: np.ndarray, bufs: list[pa.Buffer]
          ) -> Iterator[tuple[pa.RecordBatch, int, int, bool]]:
    """(batch, first offset, commit time, whether its chunk ends with it) of each chunk's
    batches, decoded and checked."""
    decoder = ChunkDecoder(check=True, target=topic.schema)  # older chunks read as it
    for r, buf in zip(rows, bufs, strict=True):
        base, ts = int(r["base"]), int(r["ts"])
        where = f"topic {topic.name!r} segment {segment_id(p, int(r['seq']))} at {int(r['pos'])}"
        batches = decoder.batches(buf, lambda where=where: where)
        if sum(b.num_rows for b in batches) != int(r["records"]) or any(
                not b.schema.equals(topic.schema) for b in batches):
            raise CorruptSegment(f"{where}: the chunk does not hold the {int(r['records'])} "
                                 "records of the topic's schema its log entry names")
        for i, b in enumerate(batches):
            yield b, base, ts, i == len(batches) - 1
            base += b.num_rows


__all__ = ["LAKE_POINTS", "demote", "demote_and_publish", "lake_summary", "lake_table"]
