"""Cross-process locks on local lock files: a thread lock and ``flock``, held per process.

A lock file's descriptor is kept open between uses, for the :data:`OPEN_LOCK_FILES` most
recently used: a process that writes to thousands of partitions would otherwise hold a
descriptor for each, and run out. One is closed only while no thread of this process uses
it (closing a descriptor drops the ``flock`` held through it). A descriptor whose file no
longer is the one at its path (its topic was deleted, and perhaps created again) is
replaced, so a process never locks a file other processes no longer use. A forked child
opens its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from itertools import islice

OPEN_LOCK_FILES = 256
"""Lock files a process keeps open between uses, least recently used first out."""

_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}
_fds: OrderedDict[str, int] = OrderedDict()  # guarded by _guard


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
        with _guard:
            fd = _fds.get(path)
            if fd is not None:
                _fds.move_to_end(path)
        if fd is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            with _guard:
                _fds[path] = fd
            _trim(path)
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
        with _guard:
            del _fds[path]
        os.close(fd)  # drops the lock on the old file


def _trim(keep: str) -> None:
    """Close the least recently used descriptors beyond :data:`OPEN_LOCK_FILES` that no
    thread uses now (``keep``: the caller's own)."""
    with _guard:
        over = len(_fds) - OPEN_LOCK_FILES
        old = [p for p in islice(_fds, over + 1) if p != keep][:over] if over > 0 else []
    for path in old:
        tl = _thread_lock(path)
        if not tl.acquire(blocking=False):
            continue  # in use: closed by a later trim
        try:
            with _guard:
                fd = _fds.pop(path, None)
            if fd is not None:
                os.close(fd)
        finally:
            tl.release()


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


def raise_open_files() -> int:
    """Raise this process's soft limit of open files to its hard limit, once, as the JVM
    does for every Java process; returns the soft limit in force. A handle holds a
    descriptor per topic (its log directory), so the common default of 1,024 ends a tool
    listing a store of some hundreds of topics; a hard limit of 1,024 stays a limit."""
    global _raised
    if _raised is None:
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
            if soft != resource.RLIM_INFINITY and soft < want:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
            _raised = soft
        except (ImportError, ValueError, OSError):  # no such limit here, or not allowed
            _raised = -1
    return _raised


_raised: int | None = None


def open_lock_files() -> int:
    """How many lock files this process holds open now."""
    with _guard:
        return len(_fds)


def forget(prefix: str) -> None:
    """Close this process's lock files under ``prefix`` (their topic is being deleted)."""
    with _guard:
        paths = [p for p in _fds if p.startswith(prefix)]
    for path in paths:
        # Under the path's thread lock: a thread of this process may hold the flock.
        with _thread_lock(path):
            with _guard:
                fd = _fds.pop(path, None)
            if fd is not None:
                os.close(fd)


__all__ = ["OPEN_LOCK_FILES", "forget", "held", "open_lock_files"]
