"""Retention: deleting the whole sealed segments ``log.retention.bytes``/``.ms`` let go.

What it does: :func:`apply_retention` chooses the segments to delete
(:func:`segments_to_delete`, a pure function of the state) and publishes one ``delete``
entry naming them (:meth:`~tier_store.topic.Topic.delete_segments`).

Steps, each crash-safe:

1. Choose against a snapshot of the refreshed state.
2. Publish the ``delete`` entry, requiring that the chosen segments are still committed as
   they were chosen (:class:`~tier_store.conflicts.SegmentsUnchanged`); when an entry that
   touched them won the race, choose again against the new state. A crash before the
   publish deletes nothing; after it, the segments are gone from the log.
3. Their files are left to :mod:`.garbage`.

DANGER: it deletes records, for good, from the log (their offsets fall below the earliest).
Readers are protected by the files outliving the entry: they are released only after
``log.cleanup.grace.ms`` (or, on a pool tier, once no reader pins them), so a read planned
before the entry finishes; a read planned after it is told the offsets are gone
(:class:`~tier_store.errors.DataLoss`).

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

import logging
import time
from typing import TYPE_CHECKING

from ..conflicts import SegmentsUnchanged, planned
from ..errors import CommitConflict
from ..state import SegmentState, TopicState

if TYPE_CHECKING:
    from ..topic import Topic

log = logging.getLogger(__name__)

_ATTEMPTS = 100
"""Choices made again after an entry touching the chosen segments won the race."""


def apply_retention(topic: Topic, now_ms: int | None = None) -> list[str]:
    """Delete ``topic``'s whole sealed segments past ``log.retention.bytes``/``.ms`` (a
    ``delete`` entry now; the files after ``log.cleanup.grace.ms``). Returns the deleted
    ids."""
    rbytes = topic.setting("log.retention.bytes")
    rms = topic.setting("log.retention.ms")
    if rbytes < 0 and rms < 0:
        return []
    now = int(time.time() * 1000) if now_ms is None else now_ms
    for _ in range(_ATTEMPTS):
        with topic.snapshot() as st:
            chosen = segments_to_delete(st, rbytes, rms, now)
            seen = planned(st.segments[sid] for sid in chosen)
        if not chosen:
            return []
        try:
            topic.delete_segments(chosen, "retention",
                                  requirements=[SegmentsUnchanged(topic.name, seen, "retention")])
        except CommitConflict as e:
            log.debug("topic %s: retention lost a race (%s); choosing again", topic.name, e)
            continue
        log.info("topic %s: retention deleted segments %s", topic.name, ", ".join(chosen))
        return chosen
    raise CommitConflict(f"topic {topic.name!r}: retention gave up after {_ATTEMPTS} lost "
                         "races")


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


__all__ = ["apply_retention", "segments_to_delete"]
