"""The file tier: a local (or NFS) directory; chunks appended with pwritev + fdatasync.

A chunk is gathered from its record batches' own buffers (:meth:`EncodedChunk.pieces`), so
the kernel's copy into the page cache is the only copy.

One fdatasync covers every chunk written to the segment since the last one, so a writer that
defers durability (:meth:`Topic.write_chunks` with ``durable=False``, then ``sync``) pays one
flush per segment instead of one per chunk. Each deferred chunk's writeback is started at once
(``sync_file_range``), so the device writes while the writer goes on and that flush finds
little left to do: at the end of a task, waiting for the device was most of what it cost.

With ``log.file.direct.bytes`` set, big chunks go past the page cache (``O_DIRECT``):
copying them into it is the largest CPU cost of a durable append on some machines, and the
write is flushed at once anyway; readers of those chunks then read from the device.
Direct I/O needs whole aligned blocks, so the chunk is encoded into a scratch mapping (on
huge pages, so the device gets large requests) at its offset within its first block; that
first, shared block is written through the page cache and the rest directly, so the layout
on disk is the same either way.
Where the file system refuses ``O_DIRECT`` (older tmpfs), chunks go through the page cache.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Callable

import pyarrow as pa

from ..chunk import EncodedChunk, checksum, checksum_while
from ..config import TierSpec
from ..crash import crash_point
from ..layout import fsync_dir, makedirs_durable
from ..segment import END_OFFSET, HEADER_FIELDS, HEADER_SIZE, SEALED_OFFSET, WORD, SegmentHeader
from .base import SegmentWriter, Tier, new_header


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        n = os.pwrite(fd, data, pos)
        data = data[n:]
        pos += n


def split_at(pieces: list[memoryview], n: int) -> tuple[list[memoryview], list[memoryview]]:
    """The first ``n`` bytes of ``pieces`` and the rest, as two lists of views."""
    for i, piece in enumerate(pieces):
        if n <= len(piece):
            return pieces[:i] + [piece[:n]], [piece[n:]] + pieces[i + 1:]
        n -= len(piece)
    return pieces, []


IOV_MAX = 1024  # iovecs per pwritev on Linux


def pwritev_all(fd: int, pieces: list[memoryview], pos: int) -> None:
    """Write the concatenation of ``pieces`` at ``pos``, straight from where they are."""
    i = 0
    while i < len(pieces):
        n = os.pwritev(fd, pieces[i:i + IOV_MAX], pos)
        pos += n
        while i < len(pieces) and n >= len(pieces[i]):  # skip what was written whole
            n -= len(pieces[i])
            i += 1
        if n:  # a short write inside a piece
            pieces[i] = pieces[i][n:]


def write_halves(fd: int, pieces: list[memoryview], pos: int, size: int) -> None:
    """Gathering write of a chunk's ``pieces`` at ``pos``, with crash points after each half."""
    first, rest = split_at(pieces, size // 2)
    pwritev_all(fd, first, pos)
    crash_point("chunk.copy")
    pwritev_all(fd, rest, pos + size // 2)
    crash_point("chunk.flushed")


def _load_sync_file_range() -> ctypes._CFuncPtr | None:
    try:
        f = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux: the final flush does all the work
        return None
    f.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    f.restype = ctypes.c_int
    return f


_sync_file_range = _load_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, pos: int, size: int) -> None:
    """Ask the kernel to start writing ``[pos, pos + size)`` back now, without waiting: the
    device then works while the writer goes on, and the flush that makes the range durable
    finds it (mostly) done. Best effort."""
    if _sync_file_range is not None and size > 0:
        _sync_file_range(fd, pos, size, _SYNC_FILE_RANGE_WRITE)


BLOCK = 4096  # the alignment O_DIRECT asks for on every common device
HUGE = 2 * 1024 * 1024  # a transparent huge page on x86-64 and arm64 (4k base pages)
_scratch = threading.local()


SCRATCH_KEPT = 64 * 1024 * 1024  # a bigger (oversized) chunk gets a mapping of its own


class _Scratch:
    """A private anonymous mapping whose view starts on a huge-page boundary and which asks
    for transparent huge pages. A direct write's pages go to the device as they lie in
    memory, and a request holds at most ``max_segments`` of them (254 on virtio-blk): from
    4 KiB pages a request carries at most ~1 MiB, from 2 MiB pages the device's largest
    request (measured here: 0.55 MiB requests at 250-350 MB/s, 4 MiB requests at
    460-520 MB/s on the same disk)."""

    def __init__(self, size: int):
        self.map = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self.map.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # huge pages disabled: 4 KiB pages work, in smaller requests
                pass
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        lead = -base % HUGE
        self.view = memoryview(self.map)[lead:lead + size]

    def __len__(self) -> int:
        return len(self.view)


def _scratch_buffer(size: int) -> memoryview:
    """A huge-page-aligned buffer of at least ``size`` bytes, reused by this thread (its
    pages stay mapped, so encoding into it takes no page faults)."""
    if size > SCRATCH_KEPT:
        return _Scratch(size).view
    buf = getattr(_scratch, "buf", None)
    if buf is None or len(buf) < size:
        buf = _scratch.buf = _Scratch(max(size, 4 * 1024 * 1024))
    return buf.view


def no_charge(nbytes: int) -> None:
    """The charge of a writer made without its tier's throttle: nothing."""


class FileSegmentWriter(SegmentWriter):
    """Appends to a segment file with pwritev (or O_DIRECT); durable with fdatasync.

    ``charge(nbytes)`` is called before each chunk is written: its tier's
    :meth:`~tier_store.tiers.base.Tier.charge_write`, which may sleep (a throttled tier)."""

    def __init__(self, path: str, capacity: int, direct_bytes: int = 0,
                 charge: Callable[[int], None] = no_charge, fd: int | None = None):
        self.path = path
        self._capacity = capacity
        self._charge = charge
        # A tier opens the file itself, checked (Tier.open_inside); the writer owns ``fd``.
        self._fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC) if fd is None \
            else fd
        self._direct_bytes = direct_bytes if hasattr(os, "O_DIRECT") else 0
        self._dfd = -1
        self._unsynced = False
        self._written_back = 0  # where the writeback started by deferred appends has reached

    def header(self) -> SegmentHeader:
        return SegmentHeader.unpack(os.pread(self._fd, HEADER_FIELDS, 0), self.path,
                                    strict=False)

    def capacity(self) -> int:
        return self._capacity

    def _direct_fd(self) -> int:
        if self._dfd < 0 and self._direct_bytes:
            try:
                # O_NONBLOCK: a FIFO put in the file's place since must not make the open
                # wait for a reader (ENXIO; or, with one, it is compared below and left).
                dfd = os.open(self.path, os.O_WRONLY | os.O_DIRECT | os.O_NOFOLLOW
                              | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ELOOP, errno.ENOENT, errno.ENXIO,
                                   errno.EISDIR):
                    raise
                self._direct_bytes = 0  # the file system has no direct I/O, or the name moved
                return -1
            a, b = os.fstat(dfd), os.fstat(self._fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                # The name leads elsewhere now: write only through the file opened, checked.
                os.close(dfd)
                self._direct_bytes = 0
                return -1
            os.set_blocking(dfd, True)  # only the open had to be guarded
            self._dfd = dfd
        return self._dfd

    def write_chunk(self, pos: int, chunk: EncodedChunk) -> int:
        self._charge(chunk.size)
        return self._write(pos, chunk)

    def _write(self, pos: int, chunk: EncodedChunk) -> int:
        if (self._direct_bytes and chunk.size >= self._direct_bytes
                and pos % BLOCK + chunk.size > BLOCK and self._direct_fd() >= 0):
            return self._write_direct(pos, chunk)
        # Gathered from the record batches' own buffers: the kernel's copy into the page
        # cache is the only one.
        pieces = [memoryview(p).cast("B") for p in chunk.pieces()]
        return checksum_while(pieces, chunk.size,
                              lambda: write_halves(self._fd, pieces, pos, chunk.size))

    def _write_direct(self, pos: int, chunk: EncodedChunk) -> int:
        lead = pos % BLOCK
        end = lead + chunk.size
        total = -(-end // BLOCK) * BLOCK
        view = _scratch_buffer(total)
        # Laid out as in the file from the block holding `pos`, so that the direct part
        # starts at an aligned address.
        chunk.write_into(pa.py_buffer(view[lead:end]))
        view[end:total] = bytes(total - end)  # beyond `end`: free space
        crc = checksum(view[lead:end])
        start = pos - lead
        if lead:
            # The first block also holds the chunk before, which readers may have cached:
            # a direct write there could race with their page faults. Through the cache.
            _pwrite_all(self._fd, view[lead:BLOCK], pos)
        first = BLOCK if lead else 0
        half = first + (total - first) // 2 // BLOCK * BLOCK
        try:
            _pwrite_all(self._dfd, view[first:half], start + first)
            crash_point("chunk.copy")
            _pwrite_all(self._dfd, view[half:total], start + half)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # Refused after all (alignment rules stricter than BLOCK): use the page cache.
            self._direct_bytes = 0
            return self._write(pos, chunk)
        crash_point("chunk.flushed")
        return crc

    def set_end(self, end: int, durable: bool = True) -> None:
        # One fdatasync makes the chunks and the new end durable together. Either may reach
        # the disk first without harm: `end` only tells the next writer where to append, and
        # nothing references a chunk until it has been flushed.
        os.pwrite(self._fd, WORD.pack(end), END_OFFSET)
        crash_point("chunk.header")
        self._unsynced = True
        if durable:
            self.sync()
        else:
            start = max(self._written_back, HEADER_SIZE)
            start_writeback(self._fd, start, end - start)
            self._written_back = end

    def sync(self) -> None:
        if self._unsynced:
            os.fdatasync(self._fd)
            self._unsynced = False
        self._sync_entry()

    def seal(self, durable: bool = True) -> None:
        os.pwrite(self._fd, WORD.pack(1), SEALED_OFFSET)
        self._unsynced = True
        if durable:
            self.sync()

    def close(self) -> None:
        if self._fd >= 0:
            self.sync()
        for fd in (self._fd, self._dfd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._dfd = -1


class FileTier(Tier):
    """Segments are plain files that grow as chunks are appended."""

    def __init__(self, spec: TierSpec, segment_bytes: int, direct_bytes: int = 0):
        super().__init__(spec, segment_bytes)
        self.direct_bytes = direct_bytes

    def prepare(self) -> None:
        makedirs_durable(self.path)

    def create_segment(self, topic: str, partition: int, seq: int, min_bytes: int,
                       durable: bool = True) -> SegmentWriter | None:
        path = self.segment_path(topic, partition, seq)
        d = os.path.dirname(path)
        # <tier>/<topic>/<p>: each new directory's entry in its parent must be durable too,
        # inline or (deferred) with the segment's own entry at the writer's first sync.
        new_dirs = self.make_dirs(d, durable)
        w = None
        try:
            # A file already there is the leftover of a roll that crashed before switching
            # the active pointer: nothing references it, so it is safe to reuse.
            # Never through a link on the way (a linked <topic>/ or <partition>/ directory,
            # or a link at the name): CorruptSegment naming it.
            fd = self.open_inside(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            try:
                os.pwrite(fd, new_header(partition, seq).pack(), 0)
                if durable:
                    os.fsync(fd)
                w = FileSegmentWriter(path, max(self.segment_bytes, HEADER_SIZE + min_bytes),
                                      self.direct_bytes, self.charge_write, fd)
            finally:
                if w is None:
                    os.close(fd)
        finally:
            if w is None and not durable:
                # No writer will sync the new directories' entries, and a later segment in
                # them will not see them as new: make them durable now.
                for nd in new_dirs:
                    fsync_dir(nd)
        if durable:
            fsync_dir(d)
            for parent in self.entry_dirs(d):
                if parent not in new_dirs:  # those makedirs_durable synced already
                    fsync_dir(parent)
        else:
            w._unsynced = True
            w.defer_entry(d, *new_dirs, *self.entry_dirs(d))
        return w

    def open_segment(self, path: str) -> SegmentWriter:
        # Capacity is the segment size, not the header's `end`, which may be damaged: a
        # segment made for one oversized chunk ends past it, so the next append rolls.
        fd = self.open_inside(path, os.O_RDWR)
        return FileSegmentWriter(path, self.segment_bytes, self.direct_bytes, self.charge_write,
                                 fd)

    def release_segment(self, path: str) -> None:
        # Never a link, nor through one (CorruptSegment): see Tier.unlink_inside.
        self.unlink_inside(path)
