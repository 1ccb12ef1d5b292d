"""Releasing what handles dropped without ``close()`` held: segment writers' descriptors and
PMEM mappings.

A store and its topic handles refer to each other, so only the cycle collector frees them,
and it finalizes them on whatever thread it happens to run: that thread must not wait there
for a writer's flush (``fdatasync``, ``pmem_msync``), nor take a lock it may already hold.
So a finalizer only queues the closing (``SimpleQueue.put`` may be called from a finalizer),
and a thread of this module closes the writers.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_queue: queue.SimpleQueue[tuple[str, list[Callable[[], None]]]] = queue.SimpleQueue()
_started_in = -1  # the process whose releasing thread runs (a forked child starts its own)
_start_lock = threading.Lock()


def prepare() -> None:
    """Make sure this process's releasing thread runs: called as handles are made, never
    from a finalizer (starting a thread takes locks)."""
    global _queue, _started_in
    if _started_in == os.getpid():
        return
    with _start_lock:
        if _started_in != os.getpid():
            _queue = queue.SimpleQueue()  # a forked child's: the parent's thread is not here
            threading.Thread(target=_run, args=(_queue,), name="pafka-release",
                             daemon=True).start()
            _started_in = os.getpid()


def release_later(what: str, closers: list[Callable[[], None]]) -> None:
    """Have ``closers`` called on the releasing thread; ``what`` names their owner in a
    warning if one fails. Safe to call from a finalizer."""
    if closers:
        _queue.put((what, closers))


def _run(q: queue.SimpleQueue[tuple[str, list[Callable[[], None]]]]) -> None:
    while True:
        _release(*q.get())  # its arguments go on return: the handles are not kept meanwhile


def _release(what: str, closers: list[Callable[[], None]]) -> None:
    for close in closers:
        try:
            close()
        except Exception as e:  # noqa: BLE001 - the thread must go on releasing others
            log.warning("%s: releasing a writer of a handle dropped without close() failed: "
                        "%s", what, e)


__all__ = ["prepare", "release_later"]
