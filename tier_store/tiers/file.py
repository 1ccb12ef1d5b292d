"""The file tier: a local (or NFS) directory; chunks appended with pwrite + fdatasync."""

from __future__ import annotations

import os

from ..chunk import EncodedChunk, checksum
from ..crash import crash_point
from ..layout import fsync_dir
from ..segment import END_OFFSET, HEADER_SIZE, SEALED_OFFSET, WORD, SegmentHeader
from .base import SegmentWriter, Tier, new_header


def _pwrite_all(fd: int, data: memoryview, pos: int) -> None:
    while data:
        n = os.pwrite(fd, data, pos)
        data = data[n:]
        pos += n


class FileSegmentWriter(SegmentWriter):
    """Appends to a segment file with pwrite; durable with fdatasync."""

    def __init__(self, path: str, capacity: int):
        self.path = path
        self._capacity = capacity
        self._fd = os.open(path, os.O_RDWR)

    def header(self) -> SegmentHeader:
        return SegmentHeader.unpack(os.pread(self._fd, HEADER_SIZE, 0), self.path)

    def capacity(self) -> int:
        return self._capacity

    def write_chunk(self, pos: int, chunk: EncodedChunk) -> int:
        view = memoryview(chunk.buffer())
        half = len(view) // 2
        _pwrite_all(self._fd, view[:half], pos)
        crash_point("chunk.copy")
        _pwrite_all(self._fd, view[half:], pos + half)
        crash_point("chunk.flushed")
        return checksum(view)

    def set_end(self, end: int) -> None:
        # One fdatasync makes the chunk and the new end durable together. Either may reach
        # the disk first without harm: `end` only tells the next writer where to append, and
        # nothing references the chunk until write_chunks has returned, after this flush.
        os.pwrite(self._fd, WORD.pack(end), END_OFFSET)
        crash_point("chunk.header")
        os.fdatasync(self._fd)

    def seal(self) -> None:
        os.pwrite(self._fd, WORD.pack(1), SEALED_OFFSET)
        os.fdatasync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class FileTier(Tier):
    """Segments are plain files that grow as chunks are appended."""

    def create_segment(self, topic: str, partition: int, seq: int, min_bytes: int
                       ) -> SegmentWriter | None:
        path = self.segment_path(topic, partition, seq)
        d = os.path.dirname(path)
        os.makedirs(d, exist_ok=True)
        # A file already there is the leftover of a roll that crashed before switching the
        # active pointer: nothing references it, so it is safe to reuse.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, new_header(partition, seq).pack(), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(d)
        return FileSegmentWriter(path, max(self.segment_bytes, HEADER_SIZE + min_bytes))

    def open_segment(self, path: str) -> SegmentWriter:
        w = FileSegmentWriter(path, self.segment_bytes)
        end = w.header().end
        if end > self.segment_bytes:  # a segment made for one oversized chunk
            w._capacity = end
        return w

    def release_segment(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(path))
