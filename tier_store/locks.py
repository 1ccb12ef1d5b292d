"""Cross-process locks on local lock files: a thread lock and ``flock``, held per process.

Each lock file is opened once per process and kept open (opening and closing it would drop
``flock`` locks other threads hold through it). A descriptor whose file no longer is the
one at its path (its topic was deleted, and perhaps created again) is replaced, so a process
never locks a file other processes no longer use. A forked child opens its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections.abc import Iterator

_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}
_fds: dict[str, int] = {}


def _forget_after_fork() -> None:
    # A forked child shares the parent's open file descriptions, and with them any flock the
    # parent holds: it must open its own.
    _thread_locks.clear()
    _fds.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


def _thread_lock(path: str) -> threading.Lock:
    with _guard:
        return _thread_locks.setdefault(path, threading.Lock())


def _lock_fd(path: str, blocking: bool) -> int:
    """Take the ``flock`` of lock file ``path``: its descriptor, or -1 when it is busy
    (non-blocking). Caller holds the path's thread lock."""
    while True:
        fd = _fds.get(path)
        if fd is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            _fds[path] = fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return -1
        held = os.fstat(fd)
        try:
            named = os.stat(path)
        except FileNotFoundError:
            named = None
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd
        del _fds[path]
        os.close(fd)  # drops the lock on the old file


@contextlib.contextmanager
def held(path: str, blocking: bool = True) -> Iterator[bool]:
    """Hold the lock of file ``path`` against other threads and processes; yields whether
    it is held (False only with ``blocking=False`` when another holder has it)."""
    tl = _thread_lock(path)
    if not tl.acquire(blocking):
        yield False
        return
    try:
        fd = _lock_fd(path, blocking)
        if fd < 0:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        tl.release()


def forget(prefix: str) -> None:
    """Close this process's lock files under ``prefix`` (their topic is being deleted)."""
    with _guard:
        paths = [p for p in _fds if p.startswith(prefix)]
    for path in paths:
        # Under the path's thread lock: a thread of this process may hold the flock.
        with _thread_lock(path):
            fd = _fds.pop(path, None)
            if fd is not None:
                os.close(fd)


__all__ = ["forget", "held"]
