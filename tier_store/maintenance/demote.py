"""Demotion to a lake tier: sealed segments of one partition become one Parquet file of the
topic's Delta table, then one ``move`` entry names its row groups as their chunks.

1. **Read** the committed chunks, each checked against its checksum, and decode them.
2. **Build** the file in memory (:func:`tier_store.lake.build_file`): its name is a function
   of the partition and offsets, and its bytes of the rows, so a retry builds it again.
3. **Write** it whole to the table's directory (durable, or one object PUT).
4. **Commit** it to the table: one Delta commit, carrying transaction
   (``pafka-<topic id>-<partition>``, last source's sequence + 1). Demotions of a partition
   go in sequence order, so that version says which segments the table holds.
5. **Publish** the ``move`` entry, naming the file and its row groups.

A crash before 4 leaves a file no table version names (the next attempt writes it again). A
crash after 4 leaves both copies, consistent: the table holds the rows, the log still names
the segment files. The retry finds its transaction committed and the same bytes in place,
and goes straight to 5: never a second add of the same rows. The sources' files become
tombstones, as after any move.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..chunk import ChunkDecoder, checksum
from ..conflicts import Requirement
from ..crash import crash_point
from ..entries import ChunkRecord, LakeRecord
from ..errors import CommitConflict, CorruptSegment, SegmentNotMovable
from ..lake import LakeFile, build_file
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


def lake_table(topic: Topic, target: LakeTier) -> LakeTable:
    """The table of ``topic``'s incarnation on lake tier ``target``."""
    return LakeTable(target.path, topic.name, topic.id, topic.schema,
                     target.storage_options())


def lake_summary(topic: Topic) -> dict[str, Any] | None:
    """``topic``'s table on its store's lake tier (:meth:`LakeTable.summary`); None if the
    store has no lake."""
    last = topic.store.tiers[-1]
    if not last.is_lake:
        return None
    return lake_table(topic, last).summary()  # type: ignore[arg-type]


def demote(topic: Topic, target: LakeTier, segs: Sequence[SegmentState], rows: np.ndarray
           ) -> tuple[list[ChunkRecord], LakeRecord]:
    """Write and commit the lake file of segments ``segs`` (one partition, sequence order;
    ``rows``: their committed chunks, in offset order) on ``target``. Returns the chunks
    (row groups) and the record the move entry names."""
    p, seq = segs[0].partition, segs[0].seq
    table = lake_table(topic, target)
    txn = max(s.seq for s in segs) + 1
    done = table.committed_version(p)
    if segs[0].seq < done < txn:
        raise SegmentNotMovable(
            f"topic {topic.name!r}: the lake table holds segments of partition {p} up to "
            f"sequence {done - 1}, inside the run {[s.id for s in segs]}: demote them one by "
            "one")
    bufs = source_chunks(topic, segs, rows)
    f, data = build_file(topic.schema, p, _runs(topic, p, rows, bufs))
    path = target.file_path(topic.name, topic.id, p, f.base, f.end)
    if done >= txn:
        # A retry after a crash past the commit: the table holds this run already. Its file
        # must be exactly the one built now, or the log could name bytes the table lacks.
        held = target.read_range(path, 0, data.size) if target.exists(path) else None
        if held is None or held.size != data.size or checksum(held) != checksum(data):
            raise SegmentNotMovable(
                f"topic {topic.name!r}: the lake table's transaction for partition {p} is "
                f"past segment {segment_id(p, seq)}, but {path} does not hold its rows as "
                "built now; it stays where it is")
        version = table.version()
        log.info("%s: the table holds %s already (a retried demotion)", table, path)
    else:
        target.write_file(path, data)
        crash_point("lake.written")
        ts = rows["ts"]
        version = table.add(p, f, int(ts.min()), int(ts.max()), txn)
        crash_point("lake.committed")
    chunks = [ChunkRecord(p, seq, target.number, g.pos, g.length, g.base, g.records, g.checksum)
              for g in f.groups]
    return chunks, _record(f, version)


def demote_and_publish(topic: Topic, target: LakeTier, segs: Sequence[SegmentState],
                       rows: np.ndarray, seen: Requirement) -> bool:
    """:func:`demote`, then publish the move entry if ``seen`` (the sources as planned)
    still holds; False if it lost a race (the caller plans again: the table keeps what it
    committed, and the retry finds it there)."""
    chunks, lake = demote(topic, target, segs, rows)
    try:
        topic.replace_segments(segs[0].partition, [s.seq for s in segs], segs[0].seq,
                               target.number, chunks, requirements=[seen],
                               read_from=[s.tier for s in segs], lake=lake)
    except CommitConflict as e:
        log.info("topic %s: demotion of %s lost a race (%s); retrying", topic.name,
                 [s.id for s in segs], e)
        return False
    return True


def _record(f: LakeFile, version: int) -> LakeRecord:
    return LakeRecord(f.size, f.footer_pos, f.footer_length, f.footer_checksum, version)


def _runs(topic: Topic, p: int, rows: np.ndarray, bufs: list[pa.Buffer]
          ) -> Iterator[tuple[pa.RecordBatch, int, int]]:
    """(batch, first offset, commit time) of each chunk's batches, decoded and checked."""
    decoder = ChunkDecoder(check=True)
    for r, buf in zip(rows, bufs, strict=True):
        base, ts = int(r["base"]), int(r["ts"])
        where = f"topic {topic.name!r} segment {segment_id(p, int(r['seq']))} at {int(r['pos'])}"
        batches = decoder.batches(buf, lambda where=where: where)
        if sum(b.num_rows for b in batches) != int(r["records"]) or any(
                not b.schema.equals(topic.schema) for b in batches):
            raise CorruptSegment(f"{where}: the chunk does not hold the {int(r['records'])} "
                                 "records of the topic's schema its log entry names")
        for b in batches:
            yield b, base, ts
            base += b.num_rows


__all__ = ["LAKE_POINTS", "demote", "demote_and_publish", "lake_summary", "lake_table"]
