"""Idle: sealing quiet active segments, so that the segments of quiet topics migrate too.

What it does: :func:`seal_idle` seals each partition's active segment whose newest commit
is older than ``idle_ms`` (the migration service passes ``log.segment.ms``). Only sealed
segments move; a topic that stopped receiving data would otherwise keep its last segment
on the fastest tier for good.

Steps, each crash-safe:

1. Against the refreshed state, pick the active segments (by each partition's pointer)
   whose newest commit is old enough.
2. Take the partition's lock without waiting (a busy partition is being written to: not
   idle) and check that the pointer still names the segment.
3. Set the ``sealed`` word of its header (one aligned word, flushed). A crash before it
   leaves the segment active; after it, sealed. Either is a consistent state.

DANGER: it rewrites a live segment's header (the ``sealed`` flag), nothing else: no chunk,
no ``end``. Appends are protected by the partition's lock, under which writers also work:
the next append finds the segment sealed and starts the next one. Readers read chunks the
log names, which sealing does not touch.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..topic import Topic


def seal_idle(topic: Topic, idle_ms: int, now_ms: int | None = None) -> list[str]:
    """Seal active segments whose newest commit is older than ``idle_ms`` so that quiet
    topics migrate too; returns the ids sealed. Under the partition's lock."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    st = topic.state()
    sealed = []
    for p in range(st.partitions):
        part = topic.partition_log(p)
        active = part.active_segment()
        if active is None:
            continue
        seg = st.part(p).segments.get(active[0])
        if seg is None or seg.tier != active[1] or now - seg.last_ts < idle_ms:
            continue
        if part.seal_idle(active):
            sealed.append(seg.id)
    return sealed


__all__ = ["seal_idle"]
