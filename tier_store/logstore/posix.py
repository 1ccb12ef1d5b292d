"""A commit log in a directory of a local or NFS filesystem.

Layout (names from :mod:`tier_store.layout`)::

    <20-digit>.json        entry, one per version
    <20-digit>.checkpoint  checkpoint (an Arrow IPC file)
    _last_checkpoint       the hint: version of the newest checkpoint, as decimal text
    _last_checkpoint.lock  flock held while moving the hint forward
    .tmp-<pid>-<random>    a file being written, linked to its name once complete

Put-if-absent is ``link(2)`` of a complete, fsynced temporary file to the entry's name:
``link`` fails when the name exists, and the name appears with the whole file or not at
all. The directory is fsynced after the link, so a published entry survives a crash.

A full filesystem (ENOSPC, EDQUOT) while staging or linking is :class:`StoreFull` naming
the log and the filesystem: the temporary file is removed, nothing is published, and the
same write succeeds once space returns.
"""

from __future__ import annotations

import mmap
import os
import threading

import pyarrow as pa

from ..crash import crash_point
from ..errors import CorruptLog, StoreFull, TopicDeleted
from ..layout import (
    CHECKPOINT_LOCK,
    CHECKPOINT_SUFFIX,
    ENTRY_SUFFIX,
    LAST_CHECKPOINT,
    TMP_PREFIX,
    checkpoint_name,
    entry_name,
    file_lock,
    fsync_dir,
    open_regular,
    parse_log_name,
    read_regular,
    write_atomic,
    write_temp,
)
from ..tiers import NO_SPACE
from .base import Blob, LogStore
from .posix_cleanup import PosixCleanup
from .posix_pieces import PosixPieces


class PosixLogStore(PosixPieces, PosixCleanup, LogStore):
    """The ``_log/`` directory of one topic (see the module for its files)."""

    def __init__(self, path: str, topic: str):
        self.location = self.path = path
        self.topic = topic
        # (st_dev, st_ino) of the directory when first seen: a topic deleted and created
        # again has a new one, and this store must never publish into or read from it. The
        # directory is held open, so its inode number cannot be reused while we compare.
        self._ident: tuple[int, int] | None = None
        self._dir_fd = -1
        self._pin_lock = threading.Lock()
        self._lowest = 0  # the lowest version a cleanup may find present (see expired)
        self._known_checkpoints: set[int] = set()  # versions a cleanup looks for one at

    def __repr__(self) -> str:
        return f"PosixLogStore({self.path!r}, {self.topic!r})"

    # -- the log as a whole ---------------------------------------------------------------
    def exists(self) -> bool:
        return os.path.isdir(self.path)

    def check_incarnation(self) -> None:
        try:
            st = os.stat(self.path)
            now: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            now = None
        if self._ident is None:
            if now is not None:
                self._pin(now)
        elif now != self._ident:
            again = " and created again" if now is not None else ""
            raise TopicDeleted(f"topic {self.topic!r} was deleted{again} since this handle "
                               "opened it: open the topic again")

    def _pin(self, now: tuple[int, int]) -> None:
        """Hold the directory open as this store's incarnation, if it is still ``now``."""
        with self._pin_lock:  # two threads pinning at once would leak a descriptor
            if self._ident is not None:
                return
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            held = os.fstat(fd)
            if (held.st_dev, held.st_ino) != now:
                os.close(fd)  # replaced in between: compare against the next look
                return
            self._dir_fd, self._ident = fd, now

    def close(self) -> None:
        fd, self._dir_fd = self._dir_fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def entry_location(self, version: int) -> str:
        return os.path.join(self.path, entry_name(version))

    def checkpoint_location(self, version: int) -> str:
        return os.path.join(self.path, checkpoint_name(version))

    # -- entries --------------------------------------------------------------------------
    def put_if_absent(self, version: int, data: bytes) -> bool:
        self.check_incarnation()
        try:
            linked = put_unnamed(self._dir_fd, entry_name(version), data)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise self._full(f"entry {version} was not published", e) from None
        if linked is not None:
            if linked:
                crash_point("log.publish.linked")
                os.fsync(self._dir_fd)
                self.check_incarnation()  # published into a deleted topic's: seen nowhere
            return linked
        try:
            tmp = write_temp(self.path, data)  # removed again if the write fails
        except FileNotFoundError:
            self.check_incarnation()  # deleted meanwhile: TopicDeleted
            raise
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise self._full(f"entry {version} was not published", e) from None
        crash_point("log.publish.tmp")
        try:
            # Linked into the directory this store pinned (held open), never into a topic
            # created under the name since.
            if self._dir_fd >= 0:
                os.link(tmp, entry_name(version), dst_dir_fd=self._dir_fd)
            else:
                os.link(tmp, self.entry_location(version))
        except FileExistsError:
            return False
        except OSError as e:  # a directory that cannot grow: the name was not made
            if e.errno not in NO_SPACE:
                raise
            raise self._full(f"entry {version} was not published", e) from None
        finally:
            os.unlink(tmp)
        crash_point("log.publish.linked")
        if self._dir_fd >= 0:
            os.fsync(self._dir_fd)
        else:
            fsync_dir(self.path)
        # Published into a deleted topic's directory: it is visible nowhere.
        self.check_incarnation()
        return True

    def read(self, version: int) -> bytes | None:
        # A directory or FIFO there is damage, not "no entry": probing must not stop at it.
        return read_regular(self.entry_location(version), CorruptLog, "commit-log entry")

    def versions(self, from_version: int = 0) -> list[int]:
        return self._versions(ENTRY_SUFFIX, from_version)

    def _versions(self, suffix: str, from_version: int = 0) -> list[int]:
        return sorted(p[0] for n in self._names()
                      if (p := parse_log_name(n)) and p[1] == suffix and p[0] >= from_version)

    # -- checkpoints ----------------------------------------------------------------------
    def write_checkpoint(self, version: int, data: Blob) -> bool:
        try:
            return self._write_checkpoint(version, data)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise self._full(f"checkpoint {version} was not written", e) from None

    def _write_checkpoint(self, version: int, data: Blob) -> bool:
        view = memoryview(data)
        tmp = os.path.join(self.path, f"{TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            try:
                half = len(view) // 2
                _write_all(fd, view[:half])
                crash_point("checkpoint.write")
                _write_all(fd, view[half:])
                os.fsync(fd)
            finally:
                os.close(fd)
            os.link(tmp, self.checkpoint_location(version))
        except FileExistsError:
            self._known_checkpoints.add(version)
            return False  # another committer wrote the same version's checkpoint
        finally:
            os.unlink(tmp)
        fsync_dir(self.path)
        self._known_checkpoints.add(version)
        return True

    def read_checkpoint(self, version: int) -> Blob | None:
        try:
            fd = open_regular(self.checkpoint_location(version), CorruptLog, "checkpoint")
        except FileNotFoundError:
            return None
        self._known_checkpoints.add(version)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return b""  # mmap refuses an empty file; decoding says it is too short
            # Mapped, not read: the buffer keeps the mapping alive after the file is closed.
            return pa.py_buffer(mmap.mmap(fd, size, prot=mmap.PROT_READ))
        finally:
            os.close(fd)

    def checkpoints(self) -> list[int]:
        return self._versions(CHECKPOINT_SUFFIX)

    def last_checkpoint_hint(self) -> int | None:
        # Not a regular file is CorruptLog, not "no hint": a directory there would stop
        # the next checkpoint's hint, and a FIFO's read would never end.
        raw = read_regular(os.path.join(self.path, LAST_CHECKPOINT), CorruptLog,
                           "checkpoint pointer")
        if raw is None:
            return None
        try:
            return int(raw.strip())
        except ValueError:
            return None  # a torn hint cannot happen (atomic rename); be lenient anyway

    def advance_checkpoint_hint(self, version: int) -> int | None:
        # Re-read under the lock: a writer that stalled while others wrote newer
        # checkpoints (and cleaned up behind them) must not move the hint back. The flock
        # is released by the kernel when its process dies: a crash leaves no lock behind.
        try:
            with file_lock(os.path.join(self.path, CHECKPOINT_LOCK)):
                previous = self.last_checkpoint_hint()
                if previous is None or previous < version:
                    write_atomic(os.path.join(self.path, LAST_CHECKPOINT),
                                 str(version).encode())
                return previous
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            raise self._full(f"the checkpoint hint was not moved to {version}", e) from None

    def _full(self, what: str, e: OSError) -> StoreFull:
        """The :class:`StoreFull` for ``e`` (ENOSPC or EDQUOT), naming the log and its
        filesystem."""
        mount, free = filesystem_of(self.path)
        return StoreFull(
            f"topic {self.topic!r}: {what}: the filesystem of its commit log {self.path} "
            f"(mounted at {mount}, {free} bytes free) is full ({os.strerror(e.errno)}). Free "
            "space there (the store's root) and try again; nothing was left half written")

def filesystem_of(path: str) -> tuple[str, int | None]:
    """The mount point of the filesystem holding ``path`` and the bytes free on it (None
    if unknown), for messages."""
    path = os.path.realpath(path)
    try:
        dev = os.stat(path).st_dev
        while path != os.path.dirname(path) and os.stat(os.path.dirname(path)).st_dev == dev:
            path = os.path.dirname(path)
        fs = os.statvfs(path)
        return path, fs.f_bavail * fs.f_frsize
    except OSError:
        return path, None


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view):]

def put_unnamed(dir_fd: int, name: str, data: bytes) -> bool | None:
    """Create ``name`` in directory ``dir_fd`` holding ``data`` (fsynced) iff it is absent,
    through a file with no name until it is linked (O_TMPFILE): no temporary name is made and
    removed per entry, and a crash leaves no file. Each name made and removed stays in the
    kernel's dentry cache until memory runs short, slowing every lookup as a log grows old.
    True if linked, False if ``name`` existed, None where the filesystem or /proc cannot."""
    if dir_fd < 0:
        return None
    try:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o644, dir_fd=dir_fd)
    except (OSError, AttributeError):
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        crash_point("log.publish.tmp")
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd)
    except FileExistsError:
        return False
    except FileNotFoundError:
        return None  # no /proc here
    finally:
        os.close(fd)
    return True
