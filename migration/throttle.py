"""The service's own bandwidth cap for copying (``storage.migrate.bytes.per.second``)."""

from __future__ import annotations

import threading
import time


class Throttle:
    """A token bucket shared by the copying threads: ``rate`` bytes per second, 0 = none."""

    def __init__(self, rate: int):
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def __call__(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more fit within the rate (at once when there is none)."""
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._next = max(self._next, now) + nbytes / self.rate
            wait = self._next - now
        if wait > 0:
            time.sleep(wait)
