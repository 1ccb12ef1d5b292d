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
* Commits check retention at most every ``log.retention.check.interval.ms`` per host
  (:func:`retention_due`), as Kafka's log manager does; the migration service checks it on
  every run, and :meth:`~tier_store.topic.Topic.apply_retention` at once.
* ``log.retention.bytes`` (per partition, as in Kafka): delete while the partition's committed
  bytes exceed it. ``log.retention.ms``: delete segments whose newest record was committed
  longer ago than that. -1 disables either.
"""

from __future__ import annotations

import logging
import os
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


def retention_due(topic: Topic) -> bool:
    """Whether a commit on ``topic`` checks retention now: at most every
    ``log.retention.check.interval.ms`` per host (0: every commit). The time of the last
    check is the modification time of a marker in the topic's local pointer directory, so
    short-lived committers (Spark's sink commits run in fresh processes) share it; a handle
    that checked recently asks no file at all."""
    interval = topic.setting("log.retention.check.interval.ms") / 1000.0
    if interval <= 0:
        return True
    key = (topic.store.root, topic.id)
    now = time.time()
    if now - _checked.get(key, 0.0) < interval:
        return False
    marker = os.path.join(topic.store.pointer_dir(topic.name, topic.id), RETENTION_MARKER)
    try:
        last = os.stat(marker).st_mtime
    except FileNotFoundError:
        last = 0.0
    if now - last < interval:
        _checked[key] = last
        return False
    with open(marker, "ab"):
        pass
    os.utime(marker, (now, now))
    _checked[key] = now
    return True


RETENTION_MARKER = "retention.checked"
# (store root, topic id) -> when this process last checked retention or saw the marker's time
_checked: dict[tuple[str, str], float] = {}


def segments_to_delete(state: TopicState, retention_bytes: int, retention_ms: int, now_ms: int
                       ) -> list[str]:
    """Ids of the segments to delete now (pure function of the state): O(segments), from
    each partition's own segments."""
    out: list[str] = []
    for part in state.parts:
        segs = sorted(part.segments.values(), key=lambda s: s.seq)
        out.extend(s.id for s in _partition_prefix(segs, retention_bytes, retention_ms, now_ms))
    return out


def _wanted(seg: SegmentState, total: int, retention_bytes: int, retention_ms: int,
            now_ms: int) -> bool:
    by_bytes = retention_bytes >= 0 and total > retention_bytes
    by_time = retention_ms >= 0 and now_ms - seg.last_ts > retention_ms
    return by_bytes or by_time


def _partition_prefix(segs: list[SegmentState], retention_bytes: int, retention_ms: int,
                      now_ms: int) -> list[SegmentState]:
    if len(segs) < 2:
        return []
    total = sum(s.bytes for s in segs)
    # lowest[i]: the lowest base offset of segs[i:], so each step costs O(1), not O(rest).
    lowest = [0] * len(segs)
    low = segs[-1].base
    for i in range(len(segs) - 1, -1, -1):
        low = min(low, segs[i].base)
        lowest[i] = low
    best = 0
    reach = -1
    for i, seg in enumerate(segs[:-1]):
        if not _wanted(seg, total, retention_bytes, retention_ms, now_ms):
            break
        total -= seg.bytes
        reach = max(reach, seg.end)
        if reach <= lowest[i + 1]:
            best = i + 1
    return segs[:best]


__all__ = ["RETENTION_MARKER", "apply_retention", "retention_due", "segments_to_delete"]
