"""Closing rolled-out segment writers in the background, for deferred appends."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from .tiers import SegmentWriter


class Flusher:
    """Closes the writers of segments rolled out by deferred appends on a thread of the
    topic handle, so the device writes them while appends go on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def submit(self, w: SegmentWriter) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="pafka-flush")
            self._pending.append(self._pool.submit(w.close))

    def wait(self) -> None:
        """Wait for every close submitted so far; raise the first one's error."""
        with self._lock:
            pending, self._pending = self._pending, []
        errors = [e for e in (f.exception() for f in pending) if e is not None]
        if errors:
            raise errors[0]

    def shutdown(self) -> None:
        """Stop the closing thread, once what was submitted is closed."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


__all__ = ["Flusher"]
