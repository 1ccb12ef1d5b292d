"""Retention: which whole sealed segments ``log.retention.bytes``/``.ms`` delete.

Rules, per partition:

* The newest committed segment is never deleted (it may still be the active one).
* Segments are deleted oldest first, and only as an offset prefix: a set of segments goes
  only when every offset it holds is below every offset of the segments kept. (Concurrent
  writers can commit a segment's chunks out of order, so a segment's offsets may interleave
  with the next one's; such segments go together.) The earliest offset stays gapless.
* ``log.retention.bytes`` (per partition, as in Kafka): delete while the partition's committed
  bytes exceed it. ``log.retention.ms``: delete segments whose newest record was committed
  longer ago than that. -1 disables either.
"""

from __future__ import annotations

from .state import SegmentState, TopicState


def segments_to_delete(state: TopicState, retention_bytes: int, retention_ms: int, now_ms: int
                       ) -> list[str]:
    """Ids of the segments to delete now (pure function of the state)."""
    out: list[str] = []
    for p in range(state.partitions):
        segs = sorted((s for s in state.segments.values() if s.partition == p),
                      key=lambda s: s.seq)
        out.extend(s.id for s in _partition_prefix(segs, retention_bytes, retention_ms, now_ms))
    return out


def _wanted(seg: SegmentState, total: int, retention_bytes: int, retention_ms: int,
            now_ms: int) -> bool:
    by_bytes = retention_bytes >= 0 and total > retention_bytes
    by_time = retention_ms >= 0 and now_ms - seg.last_ts > retention_ms
    return by_bytes or by_time


def _partition_prefix(segs: list[SegmentState], retention_bytes: int, retention_ms: int,
                      now_ms: int) -> list[SegmentState]:
    total = sum(s.bytes for s in segs)
    best: list[SegmentState] = []
    taken: list[SegmentState] = []
    for i, seg in enumerate(segs[:-1]):
        if not _wanted(seg, total, retention_bytes, retention_ms, now_ms):
            break
        taken.append(seg)
        total -= seg.bytes
        rest = segs[i + 1:]
        if max(s.end for s in taken) <= min(s.base for s in rest):
            best = list(taken)
    return best
