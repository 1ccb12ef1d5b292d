"""A small cffi (ABI mode) binding to libpmem: map a file, persist or msync a range.

Only ``libpmem1`` is needed at run time (no compiler, no headers). ``pmem_persist`` is used
where ``pmem_is_pmem`` says the mapping is real persistent memory; elsewhere only
``pmem_msync`` is durable (persist alone would leave data in the page cache).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

from ..errors import PmemUnavailable

_CDEF = """
void *pmem_map_file(const char *path, size_t len, int flags, unsigned int mode,
                    size_t *mapped_lenp, int *is_pmemp);
int pmem_unmap(void *addr, size_t len);
int pmem_is_pmem(const void *addr, size_t len);
void pmem_persist(const void *addr, size_t len);
int pmem_msync(const void *addr, size_t len);
const char *pmem_errormsg(void);
const char *pmem_check_version(unsigned major_required, unsigned minor_required);
"""
_LIBC_CDEF = "int madvise(void *addr, size_t length, int advice);"
_MADV_POPULATE_WRITE = 23  # Linux 5.14+: fault in the whole range, writable, in one call

_lock = threading.Lock()
_lib: tuple[Any, Any] | None = None


def load() -> tuple[Any, Any]:
    """Load libpmem once; raise :class:`PmemUnavailable` naming the package to install."""
    global _lib
    with _lock:
        if _lib is None:
            try:
                import cffi
            except ImportError as e:  # pragma: no cover - cffi is a dependency
                raise PmemUnavailable(f"the pmem tier needs cffi: pip install cffi ({e})") from None
            ffi = cffi.FFI()
            ffi.cdef(_CDEF)
            try:
                lib = ffi.dlopen(os.environ.get("PAFKA_LIBPMEM", "libpmem.so.1"))
            except OSError as e:
                raise PmemUnavailable(
                    "the pmem tier needs libpmem: install the Debian/Ubuntu package libpmem1 "
                    f"(apt-get install libpmem1), or use log.channel.type=file ({e})"
                ) from None
            try:
                ffi.cdef(_LIBC_CDEF)
                libc = ffi.dlopen(None)
            except (OSError, AttributeError):
                libc = None
            _lib = (ffi, lib)
            global _libc
            _libc = libc
        return _lib


_libc: Any = None


@dataclass
class PmemMapping:
    """A file mapped with ``pmem_map_file``; flushes with persist or msync as appropriate."""

    path: str
    addr: Any
    length: int
    is_pmem: bool
    _ffi: Any
    _lib: Any

    @classmethod
    def open(cls, path: str) -> PmemMapping:
        ffi, lib = load()
        mapped = ffi.new("size_t *")
        is_pmem = ffi.new("int *")
        addr = lib.pmem_map_file(path.encode(), 0, 0, 0, mapped, is_pmem)
        if addr == ffi.NULL:
            msg = ffi.string(lib.pmem_errormsg()).decode(errors="replace")
            raise OSError(f"pmem_map_file({path}) failed: {msg}")
        return cls(path, addr, int(mapped[0]), bool(is_pmem[0]), ffi, lib)

    def populate(self, pos: int, size: int) -> None:
        """Map the pages of ``[pos, pos + size)`` writable in one call, before they are
        written: page-table faults on first touch made an append several times slower.
        Only the range about to be written: processes that share a segment each map just
        what they write (the whole segment, in each, doubled the cost). Best effort: older
        kernels refuse the advice and pages fault in on use."""
        if _libc is None or size <= 0:
            return
        lo = pos - pos % mmap.PAGESIZE
        hi = min(self.length, pos + size)
        _libc.madvise(self._ffi.cast("char *", self.addr) + lo, hi - lo, _MADV_POPULATE_WRITE)

    def buffer(self, pos: int, size: int) -> Any:
        """A writable buffer over ``[pos, pos + size)`` of the mapping."""
        if pos < 0 or pos + size > self.length:
            raise ValueError(f"range [{pos}, {pos + size}) outside mapping of {self.length}")
        return self._ffi.buffer(self._ffi.cast("char *", self.addr) + pos, size)

    def store_word(self, pos: int, data: bytes) -> None:
        """Write the 8 bytes ``data`` at the 8-aligned ``pos`` with one aligned 8-byte store,
        so that a process reading the file meanwhile sees the old word or the new one,
        never a mix. Not ``struct.pack_into``: it zero-fills its target before packing, and
        a reader in between saw a header word of 0."""
        if len(data) != 8 or pos % 8 or pos < 0 or pos + 8 > self.length:
            raise ValueError(f"word store of {len(data)} bytes at {pos} is not one aligned "
                             f"word inside the mapping of {self.length}")
        word = self._ffi.cast("uint64_t *", self._ffi.cast("char *", self.addr) + pos)
        # The native integer whose bytes in memory are `data`, whatever the byte order.
        word[0] = int.from_bytes(data, sys.byteorder)

    def flush(self, pos: int, size: int) -> None:
        """Make ``[pos, pos + size)`` durable."""
        if size <= 0:
            return
        ptr = self._ffi.cast("char *", self.addr) + pos
        if self.is_pmem:
            self._lib.pmem_persist(ptr, size)
        elif self._lib.pmem_msync(ptr, size) != 0:
            msg = self._ffi.string(self._lib.pmem_errormsg()).decode(errors="replace")
            raise OSError(f"pmem_msync on {self.path} failed: {msg}")

    def close(self) -> None:
        if self.addr is not None:
            self._lib.pmem_unmap(self.addr, self.length)
            self.addr = None
