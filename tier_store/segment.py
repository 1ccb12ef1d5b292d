"""The segment file format.

A segment is one partition's file of chunks. It starts with a fixed header page::

    offset  size  field
    0       8     magic  b"PAFKASEG"
    8       4     format version (1)
    12      4     partition
    16      8     sequence number (the segment's id is "<partition>-<sequence>")
    24      8     end: first free byte, where the next chunk goes
    32      8     sealed: 1 once no chunk will be appended any more
    40      8     created, milliseconds since the epoch

Each field is one aligned 8-byte word (4 for the small ones), so an update of ``end`` or
``sealed`` is a single aligned store: never torn.

``end`` is a hint for the next writer, not the truth about what is committed: the commit log
is. A header ``end`` above the end of the segment's last committed chunk is legal (chunks
written but not committed yet, or a hole a crash or a full disk left); below it, the header is
damaged, and a writer that trusted it would overwrite acknowledged chunks. The writer checks
it against the log before every append (:mod:`tier_store.partition`).

Chunks start at ``HEADER_SIZE`` and are aligned to ``CHUNK_ALIGN`` bytes so that Arrow
buffers inside them are aligned too.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .errors import CorruptSegment
from .layout import open_regular

MAGIC = b"PAFKASEG"
VERSION = 1
HEADER_SIZE = 4096
CHUNK_ALIGN = 64
_FMT = struct.Struct("<8sIIQQQQ")
HEADER_FIELDS = _FMT.size  # bytes of the header that hold its fields
END_OFFSET = 24
SEALED_OFFSET = 32
WORD = struct.Struct("<Q")


def header_names(data: bytes, partition: int, seq: int) -> bool:
    """Whether ``data`` starts with a well-formed header of segment ``partition``-``seq``:
    a check without decoding (a fresh reader makes it for every partition it reads)."""
    if len(data) < HEADER_FIELDS:
        return False
    magic, version, p, q, end, _, _ = _FMT.unpack_from(data, 0)
    return magic == MAGIC and version == VERSION and p == partition and q == seq and \
        end >= HEADER_SIZE


def align(n: int) -> int:
    return (n + CHUNK_ALIGN - 1) & ~(CHUNK_ALIGN - 1)


@dataclass(frozen=True)
class SegmentHeader:
    """The decoded header of a segment file."""

    partition: int
    seq: int
    end: int
    sealed: bool
    created_ms: int

    def pack(self) -> bytes:
        raw = _FMT.pack(MAGIC, VERSION, self.partition, self.seq, self.end, int(self.sealed),
                        self.created_ms)
        return raw + b"\0" * (HEADER_SIZE - len(raw))

    @classmethod
    def read(cls, path: str) -> SegmentHeader | None:
        """The header of the segment file at ``path``; None if the file is gone,
        :class:`CorruptSegment` naming it if it is not a regular file."""
        try:
            fd = open_regular(path, CorruptSegment, "segment file")
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            return cls.unpack(f.read(HEADER_SIZE), path)

    @classmethod
    def unpack(cls, data: bytes | memoryview, path: str, strict: bool = True) -> SegmentHeader:
        """Decode a header; :class:`CorruptSegment` naming ``path`` for a bad magic or
        version, and (``strict``) for an ``end`` inside the header. A writer reads it with
        ``strict=False`` and checks ``end`` against the commit log itself."""
        if len(data) < _FMT.size:
            raise CorruptSegment(f"segment {path}: header is truncated ({len(data)} bytes)")
        magic, version, partition, seq, end, sealed, created = _FMT.unpack_from(data, 0)
        if magic != MAGIC:
            raise CorruptSegment(f"segment {path}: bad magic {magic!r}, not a pafka segment")
        if version != VERSION:
            raise CorruptSegment(f"segment {path}: unsupported format version {version}")
        if strict and end < HEADER_SIZE:
            raise CorruptSegment(f"segment {path}: end {end} lies inside the header")
        return cls(partition, seq, end, bool(sealed), created)
