"""Room on a tier sized by its filesystem: ``storage.tiers.<n>.sizes=-1``, Pafka's default.

Such a tier takes new segments while its filesystem has room for one beyond a reserve (5% of
the filesystem, 1 GiB at most), so the store never fills a disk others need. Its capacity,
for the migration policy and ``pafka tiers``, is what the store holds there plus that room.
"""

from __future__ import annotations

import os

from ..config import WHOLE_FILESYSTEM

RESERVE_FRACTION = 0.05
RESERVE_MAX = 1 << 30


def room(path: str) -> int | None:
    """Bytes a tier at ``path`` may still take: its filesystem's free space less the reserve
    (None where unknown). A tier directory not made yet counts its nearest parent's."""
    while path and not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    reserve = min(RESERVE_MAX, int(fs.f_blocks * fs.f_frsize * RESERVE_FRACTION))
    return max(0, fs.f_bavail * fs.f_frsize - reserve)


def capacity(configured: int, path: str, used: int) -> int:
    """A tier's capacity in bytes: as configured, or for :data:`WHOLE_FILESYSTEM` what it
    holds (``used``) plus the room left on its filesystem."""
    if configured != WHOLE_FILESYSTEM:
        return configured
    left = room(path)
    return used + (left or 0)


__all__ = ["RESERVE_FRACTION", "RESERVE_MAX", "capacity", "room"]
