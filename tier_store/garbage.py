"""Reclaiming segment files that no commit-log entry references any more.

Rules (run by writers after a checkpoint, and by the migration service; never by a reader or
an ``open``):

* A file is reclaimed only when nothing references it: not a committed segment of the topic's
  state, not a partition's active segment.
* A segment deleted by retention or replaced by a move is reclaimed only once its ``delete``
  or ``move`` entry is older than ``log.cleanup.grace.ms``, so a reader that planned against
  it still finishes. Any other unreferenced file (a roll interrupted by a crash, chunks never
  committed) only once it has been untouched for that long.
* Only under the partition's lock, taken without waiting: a busy partition is left for the
  next pass. Pool files go back to the pool, never deleted.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from .crash import crash_point
from .layout import SEGMENT_SUFFIX, TMP_PREFIX, segment_id

if TYPE_CHECKING:
    from .store import Store
    from .topic import Topic

log = logging.getLogger(__name__)


def collect_garbage(store: Store, topic: Topic, now: float | None = None) -> int:
    """Reclaim ``topic``'s unreferenced segment files past the grace period; return count."""
    now = time.time() if now is None else now
    grace_s = topic._setting("log.cleanup.grace.ms") / 1000.0
    st = topic.state()
    reclaimed = 0
    for tier in store.tiers:
        candidates: dict[int, list[tuple[str, str]]] = {}
        actives: dict[int, tuple[int, int] | None] = {}
        for p, name, path, mtime in tier.partition_files(topic.name):
            if p not in actives:
                actives[p] = topic.active_segment(p) if p < st.partitions else None
            if name.startswith(TMP_PREFIX):
                # A copy of an interrupted move: nothing references it.
                if now - mtime > grace_s:
                    candidates.setdefault(p, []).append((name, path))
                continue
            if not name.endswith(SEGMENT_SUFFIX) or not name[: -len(SEGMENT_SUFFIX)].isdigit():
                continue
            seq = int(name[: -len(SEGMENT_SUFFIX)])
            sid = segment_id(p, seq)
            seg = st.segments.get(sid)
            if (seg is not None and seg.tier == tier.number) or actives[p] == (seq, tier.number):
                continue
            tomb = st.tombstone(sid, tier.number)
            age = now - (tomb[1] / 1000.0 if tomb is not None else mtime)
            if age > grace_s:
                candidates.setdefault(p, []).append((name, path))
        for p, files in candidates.items():
            with store.partition_lock(topic.name, p, blocking=False) as held:
                if not held:
                    continue
                # The active pointer may have moved while we looked: re-check under the lock.
                active = topic.active_segment(p)
                for name, path in files:
                    if name.endswith(SEGMENT_SUFFIX) and \
                            active == (int(name[: -len(SEGMENT_SUFFIX)]), tier.number):
                        continue
                    tier.release_segment(path)
                    crash_point("gc.release")
                    reclaimed += 1
                    log.info("reclaimed unreferenced segment file %s", path)
    return reclaimed
