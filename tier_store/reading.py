"""Reading: plan on one side (where the commit log is loaded), execute anywhere.

:meth:`Topic.plan_read` turns ``[start, end)`` of a partition into a :class:`ReadPlan`: the
chunks' files, byte ranges, offsets and commit times. A plan is small and picklable, so a
Spark driver can plan and an executor can execute without loading the commit log at all.
:func:`execute` memory-maps the files (ranged reads on a remote tier) and yields Arrow
record batches sliced exactly at the range. If a file is gone (the segment moved since
planning), it opens the store, plans again once, and goes on; a file still missing then is
:class:`DataLoss`.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from .chunk import ChunkDecoder, checksum
from .errors import CorruptSegment, DataLoss


@dataclass(frozen=True)
class PlannedChunk:
    """One committed chunk to read: file, byte range, offsets, commit time and checksum."""

    path: str
    pos: int
    length: int
    base: int
    records: int
    timestamp: int
    crc: int


@dataclass(frozen=True)
class ReadPlan:
    """What to read for ``[start, end)`` of one partition (picklable)."""

    root: str
    topic: str
    partition: int
    start: int
    end: int
    chunks: tuple[PlannedChunk, ...]

    @property
    def records(self) -> int:
        return self.end - self.start

    @property
    def bytes(self) -> int:
        return sum(c.length for c in self.chunks)


@dataclass(frozen=True)
class PlannedBatch:
    """A batch read by a plan: the records, the offset of its first row, its commit time."""

    batch: pa.RecordBatch
    offset: int
    timestamp: int


class MappedFiles:
    """Read-only Arrow memory maps of segment files, cached per process.

    A growing file (a file tier's active segment) is remapped when a chunk lies past the
    mapped length. A cached mapping is used only while the path still names the same inode:
    a pool file renamed to a new segment must never be read through an old mapping.
    Files are never shrunk while they may be mapped, so a mapping stays valid.
    """

    def __init__(self, limit: int = 256):
        self._maps: dict[str, tuple[int, int, pa.Buffer]] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def slice(self, path: str, pos: int, length: int) -> pa.Buffer:
        return self.whole(path, pos, length).slice(pos, length)

    def whole(self, path: str, pos: int, length: int) -> pa.Buffer:
        """The mapping of ``path``, which holds ``[pos, pos + length)``."""
        st = os.stat(path)  # FileNotFoundError for a missing file
        with self._lock:
            hit = self._maps.get(path)
        if hit is None or hit[:2] != (st.st_dev, st.st_ino) or pos + length > hit[2].size:
            buf = map_file(path)
            with self._lock:
                if len(self._maps) >= self._limit:
                    self._maps.pop(next(iter(self._maps)))
                self._maps[path] = (st.st_dev, st.st_ino, buf)
        else:
            buf = hit[2]
        if pos + length > buf.size:
            raise CorruptSegment(f"{path}: chunk [{pos}, {pos + length}) lies past the file's "
                                 f"end ({buf.size} bytes)")
        return buf

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()


MAPS = MappedFiles()


def map_file(path: str) -> pa.Buffer:
    """A read-only shared mapping of the whole file as an Arrow buffer, which keeps the
    mapping alive. Not ``pa.memory_map(...).read_buffer()``: that advises WILLNEED on the
    whole file, which costs 100 µs per 64 MiB segment on tmpfs and would read a whole
    segment from a disk to serve one chunk of it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if os.fstat(fd).st_size == 0:
            return pa.py_buffer(b"")
        return pa.py_buffer(mmap.mmap(fd, 0, prot=mmap.PROT_READ))
    finally:
        os.close(fd)


def read_range(path: str, pos: int, length: int) -> pa.Buffer:
    """A chunk's bytes: a slice of a memory map on a local tier, a ranged read on a remote
    one (an fsspec URL). Raises FileNotFoundError when the file is gone."""
    if "://" in path:
        from .tiers.remote import read_range as remote_range
        return remote_range(path, pos, length)
    return MAPS.slice(path, pos, length)


REVALIDATE_S = 1.0


def execute(plan: ReadPlan, verify: bool = False, replan: bool = True
            ) -> Iterator[PlannedBatch]:
    """Yield the plan's records as Arrow batches, zero-copy from memory-mapped chunks."""
    at_offset = plan.start
    decoder = ChunkDecoder()
    # The mapping of the segment being read: its next chunks are sliced from it without a
    # stat of the file each. It is checked again (is the path still that file?) at least
    # every REVALIDATE_S, far within log.cleanup.grace.ms, after which a moved segment's
    # file may be reused.
    mapped: tuple[str, pa.Buffer, float] | None = None
    for i, c in enumerate(plan.chunks):
        try:
            if mapped is not None and mapped[0] == c.path and \
                    c.pos + c.length <= mapped[1].size and \
                    time.monotonic() - mapped[2] < REVALIDATE_S:
                buf = mapped[1].slice(c.pos, c.length)
            elif "://" in c.path:
                buf = read_range(c.path, c.pos, c.length)
            else:
                mapped = (c.path, MAPS.whole(c.path, c.pos, c.length), time.monotonic())
                buf = mapped[1].slice(c.pos, c.length)
        except FileNotFoundError:
            if not replan:
                raise DataLoss(
                    f"topic {plan.topic!r} partition {plan.partition}: offsets {c.base}.."
                    f"{c.base + c.records - 1} are in {c.path}, which is missing") from None
            # The segment moved (or was deleted) since planning: plan the rest again, once.
            from .store import Store
            topic = Store.open(plan.root).topic(plan.topic)
            rest = topic.plan_read(plan.partition, max(at_offset, plan.chunks[i].base),
                                   plan.end)
            yield from execute(rest, verify, replan=False)
            return
        def where(c: PlannedChunk = c) -> str:
            return (f"{plan.topic}/{plan.partition} offsets [{c.base}, {c.base + c.records}) "
                    f"in {c.path}")

        if verify and checksum(buf) != c.crc:
            raise CorruptSegment(f"topic {plan.topic!r} partition {plan.partition}: chunk with "
                                 f"offsets [{c.base}, {c.base + c.records}) in {c.path} does "
                                 "not match its checksum")
        row = c.base
        for batch in decoder.batches(buf, where):
            b0, b1 = row, row + batch.num_rows
            row = b1
            lo, hi = max(plan.start, b0), min(plan.end, b1)
            if lo < hi:
                out = batch if (lo, hi) == (b0, b1) else batch.slice(lo - b0, hi - lo)
                yield PlannedBatch(out, lo, c.timestamp)
                at_offset = hi
