"""Appending to a pmem segment: chunks copied into a libpmem mapping of the file and made
durable with ``pmem_persist`` on real PMem, or written with one ``pwritev`` and flushed with
``pmem_msync`` elsewhere (the mapping is then page cache, as libpmem prescribes)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pyarrow as pa

from ..chunk import EncodedChunk, checksum, checksum_while
from ..crash import crash_point
from ..segment import END_OFFSET, HEADER_FIELDS, SEALED_OFFSET, WORD, SegmentHeader
from . import libpmem
from .base import SegmentWriter
from .file import no_charge, write_halves


class PmemSegmentWriter(SegmentWriter):
    """Writes chunks straight into a libpmem mapping of a pre-sized segment file.

    ``charge(nbytes)`` is called before each chunk is written: its tier's
    :meth:`~tier_store.tiers.base.Tier.charge_write`, which may sleep (a throttled tier)."""

    def __init__(self, path: str, charge: Callable[[int], None] = no_charge,
                 fd: int | None = None):
        self.path = path
        self._charge = charge
        # A tier opens the file itself, checked (Tier.open_inside); the writer owns ``fd``.
        # libpmem maps by name: the name of the descriptor opened, never the path again,
        # which a link put there since could lead outside the tier.
        if fd is None:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._map = libpmem.PmemMapping.open(_fd_path(fd, path))
        except BaseException:
            os.close(fd)
            raise
        self._map.path = path  # for messages: the descriptor's name dies with it
        self._dirty: tuple[int, int] | None = None  # chunk bytes written, not yet flushed
        self._end_dirty = False
        self._seal_dirty = False
        # Gathering writes where the mapping is not PMem go through an fd of the same file.
        if self._map.is_pmem:
            os.close(fd)
            fd = -1
        self._fd = fd

    @property
    def mapping(self) -> libpmem.PmemMapping:
        """The libpmem mapping of the whole file (read-only attribute): a move writes its
        copy through it, flushing what it wrote with ``mapping.flush``. Valid until
        :meth:`close`."""
        return self._map

    def header(self) -> SegmentHeader:
        return SegmentHeader.unpack(bytes(self._map.buffer(0, HEADER_FIELDS)), self.path,
                                    strict=False)

    def capacity(self) -> int:
        return self._map.length

    def write_chunk(self, pos: int, chunk: EncodedChunk) -> int:
        self._charge(chunk.size)
        if not self._map.is_pmem:
            return self._write_gathered(pos, chunk)
        self._map.populate(pos, chunk.size)
        target = self._map.buffer(pos, chunk.size)
        # py_buffer over the cffi buffer is mutable; a slice of a mutable Arrow buffer or a
        # foreign_buffer is not, and writing through either aborts the process.
        chunk.write_into(pa.py_buffer(target))
        crash_point("chunk.copy")
        lo, hi = self._dirty or (pos, pos)
        self._dirty = (min(lo, pos), max(hi, pos + chunk.size))
        crash_point("chunk.flushed")
        return checksum(target)

    def _write_gathered(self, pos: int, chunk: EncodedChunk) -> int:
        """Where libpmem finds no PMem the mapping is page cache, as a file's is: one kernel
        copy from the batches' own buffers (``pwritev``) beats copying through the mapping,
        which first has to fill in its page tables (about as costly as the copy). The
        mapping's flush (``msync``) covers these pages like any others of the file."""
        pieces = [memoryview(p).cast("B") for p in chunk.pieces()]
        crc = checksum_while(pieces, chunk.size,
                             lambda: write_halves(self._fd, pieces, pos, chunk.size))
        lo, hi = self._dirty or (pos, pos)
        self._dirty = (min(lo, pos), max(hi, pos + chunk.size))
        return crc

    def _set_word(self, offset: int, value: int) -> None:
        # One aligned store: the migration planner and moves read the active segment's
        # header without the partition lock, from other processes, and must see the old
        # `end` (or `sealed`) or the new one, never 0 in between.
        self._map.store_word(offset, WORD.pack(value))

    def set_end(self, end: int, durable: bool = True) -> None:
        self._set_word(END_OFFSET, end)
        crash_point("chunk.header")
        self._end_dirty = True
        if durable:
            self.sync()

    def sync(self) -> None:
        # Deferred chunks lie next to each other: one flush of their span, then the header.
        if self._dirty is not None:
            lo, hi = self._dirty
            self._map.flush(lo, hi - lo)
            self._dirty = None
        if self._end_dirty:
            self._map.flush(END_OFFSET, WORD.size)
            self._end_dirty = False
        if self._seal_dirty:
            self._map.flush(SEALED_OFFSET, WORD.size)
            self._seal_dirty = False
        self._sync_entry()

    def seal(self, durable: bool = True) -> None:
        # sync flushes the chunks, then `end`, then this word: never sealed before its data.
        self._set_word(SEALED_OFFSET, 1)
        self._seal_dirty = True
        if durable:
            self.sync()

    def close(self) -> None:
        try:
            if self._map.addr is not None:
                self.sync()
        finally:
            self._map.close()
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _fd_path(fd: int, path: str) -> str:
    """A name that opens the file ``fd`` has open (Linux's /proc), else ``path``."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else path


__all__ = ["PmemSegmentWriter"]
