"""Reader pins: memory maps of segment files, cached per process, each holding a shared
``flock`` on its file.

A segment that moved (or was deleted) is released only once no reader pins it: garbage
collection and pool tiers take the exclusive lock before a file goes (see
:mod:`tier_store.maintenance.garbage`). A mapping unused for :data:`PIN_IDLE_S` is dropped,
and with it the pin. Files are opened without following symbolic links, and a mapped file
must be the one its path names, with a header naming the segment its path names.

The store never truncates or shrinks a file a reader pins. A file truncated from outside is
:class:`CorruptSegment` when a read maps it or reuses its cached mapping (its size against
the range read); truncated under a mapping in use, the reader's next access past the new end
is SIGBUS, which no check can prevent (see ``docs/integrity.md``).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import pyarrow as pa

from .errors import CorruptSegment, PafkaError
from .layout import SEGMENT_SUFFIX, not_regular
from .segment import HEADER_FIELDS, SegmentHeader, header_names

PIN_IDLE_S = 5.0
"""A cached mapping unused this long is dropped, and with it the reader's pin on the file."""

MAP_BYTES = 512 << 20
"""Bytes of segment files a process keeps mapped between reads, at most (the mapping a read
is using is kept whatever its size)."""


COPY_BYTES = 1 << 16
"""A read of at most this many bytes of a file not mapped already copies them
(:func:`pin_read`): a mapping's setup, first page faults and unmapping cost several times a
``pread`` of a few pages, which is the fixed cost of reading a partition's newest records."""


class _PinnedMap(mmap.mmap):
    """A read-only mapping that holds a shared ``flock`` on its file (a reader pin) until the
    mapping itself is freed, i.e. until no Arrow buffer sliced from it is alive any more.
    A freed pool file returns to the pool only once an exclusive lock on it succeeds
    (:func:`~tier_store.maintenance.garbage.release_file`), so a pinned file is never reused under a
    reader; the kernel drops the pin when the process dies."""

    pin_fd = -1

    def __del__(self) -> None:
        fd, self.pin_fd = self.pin_fd, -1
        if fd >= 0:
            os.close(fd)


@dataclass
class _Mapped:
    dev: int
    ino: int
    buf: pa.Buffer
    owner: tuple[str, str] | None  # (topic, partition) of a segment path
    used: float


class MappedFiles:
    """Read-only, pinned Arrow memory maps of segment files, cached per process.

    A growing file (a file tier's active segment) is remapped when a chunk lies past the
    mapped length. A cached mapping is used only while the path still names the same inode.
    Each mapping pins its file (:class:`_PinnedMap`); a cached one is dropped — unpinning the
    file once the batches read from it are gone — when it is unused for :data:`PIN_IDLE_S`,
    when the path names another file or none, when a plan of its partition no longer names
    it (:meth:`forget`), or, least recently used first, when the mapped bytes would pass
    ``max_bytes``: the pages a reader touched count in its memory (RSS) while they are
    mapped, so the budget is what bounds a long read's memory, not what it has read.
    Every operation costs O(1) per mapping it drops, whatever is cached. Thread-safe.
    """

    def __init__(self, max_bytes: int = MAP_BYTES, idle_s: float = PIN_IDLE_S,
                 copy_bytes: int = COPY_BYTES):
        self._maps: OrderedDict[str, _Mapped] = OrderedDict()  # least recently used first
        self._by_owner: dict[tuple[str, str], set[str]] = {}
        self._bytes = 0
        self.max_bytes = max_bytes
        self.copy_bytes = copy_bytes  # reads up to this size of a file not mapped: copied
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._janitor: threading.Thread | None = None

    def slice(self, path: str, pos: int, length: int) -> pa.Buffer:
        return self.whole(path, pos, length).slice(pos, length)

    def cached(self, path: str, pos: int, length: int) -> pa.Buffer | None:
        """The cached mapping of ``path`` if it still holds ``[pos, pos + length)``, else
        None. FileNotFoundError when it is cached and the path names no file now."""
        if path not in self._maps:
            return None  # no stat: opening the file finds it missing
        st = os.stat(path, follow_symlinks=False)  # FileNotFoundError for a missing file
        with self._lock:
            hit = self._maps.get(path)
            # A cached mapping of a file truncated since would fault (SIGBUS) past the file's
            # new end: the size from this stat must still cover the range (a new mapping
            # then finds the file too short).
            if hit is not None and (hit.dev, hit.ino) == (st.st_dev, st.st_ino) and \
                    pos + length <= min(hit.buf.size, st.st_size):
                hit.used = time.monotonic()
                self._maps.move_to_end(path)
                return hit.buf
        return None

    def whole(self, path: str, pos: int, length: int) -> pa.Buffer:
        """The mapping of ``path``, which holds ``[pos, pos + length)``. FileNotFoundError
        when the path names no file (or stopped naming the one we opened);
        :class:`CorruptSegment` when the file is shorter than that range."""
        hit = self.cached(path, pos, length)
        if hit is not None:
            return hit
        now = time.monotonic()
        buf, dev, ino = pin_map(path)
        if pos + length > buf.size:
            raise CorruptSegment(f"{path}: the read of bytes [{pos}, {pos + length}) lies past "
                                 f"the file's end ({buf.size} bytes): the segment was "
                                 "truncated")
        with self._lock:
            self._drop_idle(now)
            self._remove(path)
            while self._maps and self._bytes + buf.size > self.max_bytes:
                self._remove(next(iter(self._maps)))
            owner = owner_of(path)
            self._maps[path] = _Mapped(dev, ino, buf, owner, now)
            self._bytes += buf.size
            if owner is not None:
                self._by_owner.setdefault(owner, set()).add(path)
            self._start_janitor()
        return buf

    def _remove(self, path: str) -> None:
        m = self._maps.pop(path, None)
        if m is None:
            return
        self._bytes -= m.buf.size
        if m.owner is not None:
            paths = self._by_owner.get(m.owner)
            if paths is not None:
                paths.discard(path)
                if not paths:
                    del self._by_owner[m.owner]

    def mapped_bytes(self) -> int:
        """Bytes of the cached mappings (the most this cache keeps pages of)."""
        with self._lock:
            return self._bytes

    def forget(self, keep: set[str], owners: set[tuple[str, str]]) -> None:
        """Drop the cached mappings of the partitions ``owners`` (as :func:`owner_of` names
        them) whose paths are not in ``keep``: segments a plan no longer names (moved,
        merged or deleted) are unpinned instead of held until the process ends."""
        by_owner = self._by_owner  # read without the lock: a hint
        if not by_owner or not any(o in by_owner for o in owners):
            return  # nothing mapped of theirs
        with self._lock:
            for owner in owners:
                for path in [p for p in self._by_owner.get(owner, ()) if p not in keep]:
                    self._remove(path)

    def drop(self, paths: set[str]) -> None:
        """Drop the cached mappings of ``paths`` (e.g. a move's sources once it is done)."""
        with self._lock:
            for path in paths:
                self._remove(path)

    def drop_under(self, prefixes: list[str]) -> None:
        """Drop the cached mappings of paths under ``prefixes`` (a deleted topic's)."""
        with self._lock:
            for path in [p for p in self._maps if p.startswith(tuple(prefixes))]:
                self._remove(path)

    def pinned(self) -> list[str]:
        """Paths of the cached mappings (each pins its file)."""
        with self._lock:
            return list(self._maps)

    def _drop_idle(self, now: float) -> None:
        # Least recently used first: stop at the first mapping still in use.
        while self._maps:
            path, m = next(iter(self._maps.items()))
            if now - m.used <= self._idle_s:
                return
            self._remove(path)

    def _start_janitor(self) -> None:
        # A worker that stops reading must not pin its last files until it exits.
        if self._janitor is None or not self._janitor.is_alive():
            self._janitor = threading.Thread(target=self._sweep, name="pafka-unpin",
                                             daemon=True)
            self._janitor.start()

    def _sweep(self) -> None:
        while True:
            time.sleep(self._idle_s / 2)
            with self._lock:
                self._drop_idle(time.monotonic())
                if not self._maps:
                    self._janitor = None
                    return

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()
            self._by_owner.clear()
            self._bytes = 0

    def _after_fork(self) -> None:
        # The child shares the parent's pins (open file descriptions); its own copies go,
        # and the janitor thread did not survive the fork.
        self._lock = threading.Lock()
        self._maps.clear()
        self._by_owner.clear()
        self._bytes = 0
        self._janitor = None


MAPS = MappedFiles()
os.register_at_fork(after_in_child=MAPS._after_fork)

PIN_WAIT_S = 10.0
"""How long a reader waits for a move or a release holding a segment file exclusively."""


def owner_of(path: str) -> tuple[str, str] | None:
    """(topic, partition) of a segment file's path, whatever its tier; None for other
    files."""
    parts = path.rsplit(os.sep, 3)
    if len(parts) < 3:
        return None
    topic, part, name = parts[-3:]
    if not (part.isdigit() and name.endswith(SEGMENT_SUFFIX)
            and name[: -len(SEGMENT_SUFFIX)].isdigit()):
        return None
    return topic, part


def pin_map(path: str) -> tuple[pa.Buffer, int, int]:
    """Map ``path`` read-only with a reader pin on it: (buffer, st_dev, st_ino).

    The file is opened without following a symlink, and only if it is a regular file (a
    directory, a FIFO or a device is :class:`CorruptSegment` naming it); the pin (a shared
    ``flock``) is taken, then the path is checked to still name the file opened — a file
    released to a pool meanwhile (under an exclusive lock) is FileNotFoundError, as a moved
    segment's is — and a segment file's header must name the partition and sequence its
    path does, so a reused file is never read as the old segment (:class:`CorruptSegment`
    otherwise)."""
    fd, held = _open_pinned(path)
    try:
        if held.st_size == 0:
            os.close(fd)
            return pa.py_buffer(b""), held.st_dev, held.st_ino
        m = _PinnedMap(fd, 0, prot=mmap.PROT_READ)
        m.pin_fd = fd  # closed (unpinned) when the mapping is freed
        return pa.py_buffer(m), held.st_dev, held.st_ino
    except BaseException:
        os.close(fd)
        raise


def pin_read(path: str, pos: int, length: int) -> pa.Buffer:
    """Bytes ``[pos, pos + length)`` of segment file ``path``, copied under a reader pin
    held only while reading, with :func:`pin_map`'s checks. :class:`CorruptSegment` when the
    file is shorter than that range."""
    fd, _ = _open_pinned(path, header=False)
    try:
        # The header and the range in one read when they are close (a partition's first
        # chunks), else two.
        at = 0 if pos <= COPY_BYTES else pos
        data = os.pread(fd, pos + length - at, at)
        head = data if at == 0 else os.pread(fd, HEADER_FIELDS, 0)
    finally:
        os.close(fd)
    _check_header(head, path)
    if len(data) != pos + length - at:
        raise CorruptSegment(f"{path}: the read of bytes [{pos}, {pos + length}) lies past "
                             "the file's end: the segment was truncated")
    return pa.py_buffer(data).slice(pos - at)  # from byte pos, whichever read it was


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW


def _open_pinned(path: str, header: bool = True) -> tuple[int, os.stat_result]:
    """``path`` opened and pinned, checked as :func:`pin_map` says (``header=False``: the
    caller checks the header): (fd, its stat)."""
    # Never opened unless a regular file: a FIFO's open would wait for a writer, a device's
    # may act. O_NOFOLLOW and O_NONBLOCK cover a name changed between this stat and the open.
    first = os.stat(path, follow_symlinks=False)  # FileNotFoundError for a missing file
    if not stat.S_ISREG(first.st_mode):
        raise _not_a_segment(path, first.st_mode)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _not_a_segment(path, stat.S_IFLNK) from None
        raise
    try:
        deadline = time.monotonic() + PIN_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                # A move publishing its copy, or a release checking this file: brief.
                if time.monotonic() > deadline:
                    raise PafkaError(f"{path}: held exclusively by another process for over "
                                     f"{PIN_WAIT_S:g} s (a move or a release that stalled); "
                                     "cannot pin it for reading, try again") from None
                time.sleep(0.002)
        held = os.fstat(fd)
        if not stat.S_ISREG(held.st_mode):
            raise _not_a_segment(path, held.st_mode)
        # Pinned: the path must still name the file opened (not released to a pool since).
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            raise FileNotFoundError(errno.ENOENT, "segment file was released while opened",
                                    path)
        if header and held.st_size:
            _check_header(os.pread(fd, HEADER_FIELDS, 0), path)
        return fd, held
    except BaseException:
        os.close(fd)
        raise


def _not_a_segment(path: str, mode: int) -> CorruptSegment:
    if stat.S_ISLNK(mode):
        return CorruptSegment(f"{path} is a symbolic link: segment files are never read "
                              "through links")
    return not_regular(CorruptSegment, "segment file", path, mode)


def _check_header(data: bytes, path: str) -> None:
    """A segment file's header (its first bytes, ``data``) must name the segment its path
    names; other files have none to check."""
    owner = owner_of(path)
    if owner is None:
        return
    partition = int(owner[1])
    seq = int(path[path.rfind(os.sep) + 1: -len(SEGMENT_SUFFIX)])
    if header_names(data, partition, seq):
        return  # the usual case: no header object built
    hdr = SegmentHeader.unpack(data, path)  # CorruptSegment naming what is malformed
    if (hdr.partition, hdr.seq) != (partition, seq):
        raise CorruptSegment(f"{path}: its header names segment {hdr.partition}-{hdr.seq}, "
                             f"not {partition}-{seq} as its path does")


def map_file(path: str) -> pa.Buffer:
    """A read-only shared mapping of the whole file as an Arrow buffer, pinned (see
    :func:`pin_map`). Not ``pa.memory_map(...).read_buffer()``: that advises WILLNEED on the
    whole file, which costs 100 µs per 64 MiB segment on tmpfs and would read a whole
    segment from a disk to serve one chunk of it."""
    return pin_map(path)[0]


__all__ = ["COPY_BYTES", "MAPS", "PIN_IDLE_S", "PIN_WAIT_S", "MappedFiles", "map_file", "owner_of",
           "pin_map", "pin_read"]
