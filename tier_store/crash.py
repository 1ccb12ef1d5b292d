"""Named crash points for crash tests.

A test sets ``PAFKA_CRASH_POINT=<name>`` (and optionally ``PAFKA_CRASH_AFTER=<n>``, the number
of passes through the point to survive first) in a subprocess; the process kills itself with
SIGKILL when it reaches that point, leaving files exactly as a power cut of the process would.
``PAFKA_CRASH_HOST=<host id>`` arms it only on that host (Spark executors of a simulated
cluster share one environment).
"""

from __future__ import annotations

import os
import signal

_POINT = os.environ.get("PAFKA_CRASH_POINT", "")
_after = int(os.environ.get("PAFKA_CRASH_AFTER", "0") or 0)

POINTS = (
    "chunk.copy",  # half of the chunk copied into the segment, partition lock held
    "chunk.flushed",  # chunk written (not yet flushed), header not yet advanced
    "chunk.header",  # header advanced in memory, not yet flushed
    "log.publish.tmp",  # entry's temp file written, not yet linked to its number
    "log.publish.linked",  # entry linked, directory not yet fsynced
    "checkpoint.write",  # checkpoint's temp file half written
    "checkpoint.pointer",  # checkpoint written, _last_checkpoint not yet updated
    "segment.roll.sealed",  # old segment sealed, new one not yet created
    "segment.roll.created",  # new segment created, active pointer not yet switched
)

SHARED_POINTS = (
    "share.uploaded",  # a write task's object uploaded to the shared tier, not committed
)


def _on_this_host() -> bool:
    host = os.environ.get("PAFKA_CRASH_HOST")
    if not host:
        return True
    from .ids import host_id
    return host_id() == host


MOVE_POINTS = (
    "move.copy",  # half of a chunk copied to the target tier
    "move.copied",  # copy complete, not yet verified
    "move.verified",  # verified, final name not yet claimed
    "move.linked",  # final name claimed, move entry not yet published
    "move.committed",  # move entry published, old files not yet reclaimed
    "gc.release",  # garbage collection between two reclaimed files
)


def crash_point(name: str) -> None:
    """Kill this process with SIGKILL if ``name`` is the armed crash point."""
    global _after
    if _POINT and name == _POINT and _on_this_host():
        if _after > 0:
            _after -= 1
            return
        os.kill(os.getpid(), signal.SIGKILL)


STORE_POINTS = (
    "pool.create",  # a pool file written to its temp name, not yet renamed into the pool
    "resize.unsaved",  # pool files deleted or created, the new size not yet saved
)
