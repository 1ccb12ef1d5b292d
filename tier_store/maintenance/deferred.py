"""Work a commit leaves to a thread of its own: writing a checkpoint, and what follows it.

A commit that falls due for a checkpoint takes what the checkpoint needs under its handle's
lock (index pieces written, a copy of the loose rows, the metadata) and hands the rest here:
building and encoding the table, writing and syncing the file, moving the pointer, deleting
the entries it supersedes, collecting garbage. The committing thread returns meanwhile, so
no commit waits for that I/O, however large the checkpoint.

Rules:

* One thread per process runs the work, in the order it came.
* A topic handle has at most one piece of work pending. A commit that falls due meanwhile
  skips its checkpoint (:func:`pending`); the next one due writes the newer state.
* A handle's ``close`` waits for its work (:func:`wait`), and so does the interpreter's exit,
  for at most :data:`EXIT_WAIT_S`. A process killed first loses a checkpoint, never a
  commit: the entries it would have covered stay in the log until one is written.
* A forked child starts with no work and no thread: its parent's work is the parent's.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

EXIT_WAIT_S = 30.0
"""How long the interpreter's exit waits for pending work."""

IDLE_S = 5.0
"""An idle thread ends after this long; the next piece of work starts another."""


class _Worker:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[tuple[object, Callable[[], None]]] = deque()
        self._pending: set[int] = set()  # id() of each key with work queued or running
        self._thread: threading.Thread | None = None
        self.done = 0  # pieces of work run (tests count them)

    def submit(self, key: object, work: Callable[[], None]) -> bool:
        with self._cv:
            if id(key) in self._pending:
                return False
            self._pending.add(id(key))
            self._queue.append((key, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pafka-deferred",
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()
            return True

    def pending(self, key: object) -> bool:
        with self._cv:
            return id(key) in self._pending

    def wait(self, key: object | None = None, timeout: float | None = None) -> bool:
        with self._cv:
            return self._cv.wait_for(
                lambda: not self._pending if key is None else id(key) not in self._pending,
                timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: self._queue, IDLE_S):
                    self._thread = None
                    return
                key, work = self._queue.popleft()
            try:
                work()
            except Exception:  # the work logs its own failures: this is a last guard
                log.exception("deferred maintenance failed")
            finally:
                with self._cv:
                    self._pending.discard(id(key))
                    self.done += 1
                    self._cv.notify_all()

    def _forked(self) -> None:
        self.__init__()  # type: ignore[misc]


_worker = _Worker()
os.register_at_fork(after_in_child=_worker._forked)


def submit(key: object, work: Callable[[], None]) -> bool:
    """Run ``work`` on the maintenance thread, after the work before it; False (and nothing
    queued) if ``key`` has work pending already. ``work`` must not raise: it logs."""
    return _worker.submit(key, work)


def pending(key: object) -> bool:
    """Whether ``key`` has work queued or running."""
    return _worker.pending(key)


def wait(key: object | None = None, timeout: float | None = None) -> bool:
    """Wait until ``key`` (default: every key) has no work pending; False on timeout. Never
    call it from the work itself."""
    if threading.current_thread() is _worker._thread:
        return False
    return _worker.wait(key, timeout)


def runs() -> int:
    """Pieces of work run in this process so far."""
    return _worker.done


@atexit.register
def _at_exit() -> None:
    if not wait(timeout=EXIT_WAIT_S):
        log.warning("exiting with maintenance still running after %.0f s: a checkpoint may "
                    "be left unwritten (the log holds every entry it would cover)", EXIT_WAIT_S)


__all__ = ["pending", "runs", "submit", "wait"]
