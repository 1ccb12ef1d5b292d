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

import errno
import fcntl
import mmap
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from .chunk import ChunkDecoder, checksum
from .errors import CorruptSegment, DataLoss, PafkaError, TopicDeleted, TopicNotFound
from .layout import SEGMENT_SUFFIX, is_url
from .segment import HEADER_FIELDS, SegmentHeader


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
    topic_id: str = ""  # the incarnation planned against

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


PIN_IDLE_S = 5.0
"""A cached mapping unused this long is dropped, and with it the reader's pin on the file."""


class _PinnedMap(mmap.mmap):
    """A read-only mapping that holds a shared ``flock`` on its file (a reader pin) until the
    mapping itself is freed, i.e. until no Arrow buffer sliced from it is alive any more.
    A freed pool file returns to the pool only once an exclusive lock on it succeeds
    (:func:`~tier_store.garbage.release_file`), so a pinned file is never reused under a
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
    it (:meth:`forget`), or past ``limit`` mappings. Thread-safe.
    """

    def __init__(self, limit: int = 256, idle_s: float = PIN_IDLE_S):
        self._maps: dict[str, _Mapped] = {}
        self._limit = limit
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._janitor: threading.Thread | None = None

    def slice(self, path: str, pos: int, length: int) -> pa.Buffer:
        return self.whole(path, pos, length).slice(pos, length)

    def whole(self, path: str, pos: int, length: int) -> pa.Buffer:
        """The mapping of ``path``, which holds ``[pos, pos + length)``. FileNotFoundError
        when the path names no file (or stopped naming the one we opened)."""
        st = os.stat(path, follow_symlinks=False)  # FileNotFoundError for a missing file
        now = time.monotonic()
        with self._lock:
            hit = self._maps.get(path)
            if hit is not None and (hit.dev, hit.ino) == (st.st_dev, st.st_ino) and \
                    pos + length <= hit.buf.size:
                hit.used = now
                return hit.buf
        buf, dev, ino = pin_map(path)
        if pos + length > buf.size:
            raise CorruptSegment(f"{path}: chunk [{pos}, {pos + length}) lies past the file's "
                                 f"end ({buf.size} bytes)")
        with self._lock:
            self._drop_idle(now)
            if len(self._maps) >= self._limit:
                self._maps.pop(next(iter(self._maps)))
            self._maps.pop(path, None)  # re-inserted last: the dict's order is LRU-ish
            self._maps[path] = _Mapped(dev, ino, buf, _owner(path), now)
            self._start_janitor()
        return buf

    def forget(self, keep: set[str], owners: set[tuple[str, str]]) -> None:
        """Drop the cached mappings of the partitions ``owners`` (as :func:`_owner` names
        them) whose paths are not in ``keep``: segments a plan no longer names (moved,
        merged or deleted) are unpinned instead of held until the process ends."""
        with self._lock:
            for path in [p for p, m in self._maps.items()
                         if m.owner in owners and p not in keep]:
                del self._maps[path]

    def drop(self, paths: set[str]) -> None:
        """Drop the cached mappings of ``paths`` (e.g. a move's sources once it is done)."""
        with self._lock:
            for path in paths:
                self._maps.pop(path, None)

    def drop_under(self, prefixes: list[str]) -> None:
        """Drop the cached mappings of paths under ``prefixes`` (a deleted topic's)."""
        with self._lock:
            for path in [p for p in self._maps if p.startswith(tuple(prefixes))]:
                del self._maps[path]

    def pinned(self) -> list[str]:
        """Paths of the cached mappings (each pins its file)."""
        with self._lock:
            return list(self._maps)

    def _drop_idle(self, now: float) -> None:
        for path in [p for p, m in self._maps.items() if now - m.used > self._idle_s]:
            del self._maps[path]

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

    def _after_fork(self) -> None:
        # The child shares the parent's pins (open file descriptions); its own copies go,
        # and the janitor thread did not survive the fork.
        self._lock = threading.Lock()
        self._maps.clear()
        self._janitor = None


MAPS = MappedFiles()
os.register_at_fork(after_in_child=MAPS._after_fork)

PIN_WAIT_S = 10.0
"""How long a reader waits for a move or a release holding a segment file exclusively."""


def _owner(path: str) -> tuple[str, str] | None:
    """(topic, partition) of a segment file's path, whatever its tier; None for other
    files."""
    pdir, name = os.path.split(path)
    tdir, part = os.path.split(pdir)
    if not (part.isdigit() and name.endswith(SEGMENT_SUFFIX)
            and name[: -len(SEGMENT_SUFFIX)].isdigit()):
        return None
    return os.path.basename(tdir), part


def pin_map(path: str) -> tuple[pa.Buffer, int, int]:
    """Map ``path`` read-only with a reader pin on it: (buffer, st_dev, st_ino).

    The file is opened without following a symlink; the pin (a shared ``flock``) is taken,
    then the path is checked to still name the file opened — a file released to a pool
    meanwhile (under an exclusive lock) is FileNotFoundError, as a moved segment's is — and
    a segment file's header must name the partition and sequence its path does, so a reused
    file is never read as the old segment (:class:`CorruptSegment` otherwise)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CorruptSegment(f"{path} is a symbolic link: segment files are never read "
                                 "through links") from None
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
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            raise FileNotFoundError(errno.ENOENT, "segment file was released while opened",
                                    path)
        if not stat.S_ISREG(held.st_mode):
            raise CorruptSegment(f"{path} is not a regular file")
        if held.st_size == 0:
            os.close(fd)
            return pa.py_buffer(b""), held.st_dev, held.st_ino
        owner = _owner(path)
        if owner is not None:
            _check_header(fd, path, int(owner[1]),
                          int(os.path.basename(path)[: -len(SEGMENT_SUFFIX)]))
        m = _PinnedMap(fd, 0, prot=mmap.PROT_READ)
        m.pin_fd = fd  # closed (unpinned) when the mapping is freed
        return pa.py_buffer(m), held.st_dev, held.st_ino
    except BaseException:
        os.close(fd)
        raise


def _check_header(fd: int, path: str, partition: int, seq: int) -> None:
    hdr = SegmentHeader.unpack(os.pread(fd, HEADER_FIELDS, 0), path)
    if (hdr.partition, hdr.seq) != (partition, seq):
        raise CorruptSegment(f"{path}: its header names segment {hdr.partition}-{hdr.seq}, "
                             f"not {partition}-{seq} as its path does")


def _replan(plan: ReadPlan, start: int, c: PlannedChunk) -> ReadPlan:
    """``[start, plan.end)`` of the plan's partition planned again from the log: the same
    incarnation of the topic, or :class:`TopicDeleted`."""
    from .store import Store
    try:
        topic = Store.open(plan.root).topic(plan.topic)
    except TopicNotFound:
        topic = None
    if topic is None or (plan.topic_id and topic.id != plan.topic_id):
        raise TopicDeleted(
            f"topic {plan.topic!r} partition {plan.partition}: offsets {c.base}.."
            f"{plan.end - 1} cannot be read, the topic was deleted"
            + (" and created again" if topic is not None else ""))
    return topic.plan_read(plan.partition, start, plan.end)


def map_file(path: str) -> pa.Buffer:
    """A read-only shared mapping of the whole file as an Arrow buffer, pinned (see
    :func:`pin_map`). Not ``pa.memory_map(...).read_buffer()``: that advises WILLNEED on the
    whole file, which costs 100 µs per 64 MiB segment on tmpfs and would read a whole
    segment from a disk to serve one chunk of it."""
    return pin_map(path)[0]


def read_range(path: str, pos: int, length: int) -> pa.Buffer:
    """A chunk's bytes: a slice of a memory map on a local tier, a ranged read on a remote
    one (an fsspec URL). Raises FileNotFoundError when the file is gone."""
    if is_url(path):
        from .tiers.remote import read_range as remote_range
        return remote_range(path, pos, length)
    return MAPS.slice(path, pos, length)


def execute(plan: ReadPlan, verify: bool = True, replan: bool = True
            ) -> Iterator[PlannedBatch]:
    """Yield the plan's records as Arrow batches, zero-copy from memory-mapped chunks.

    With ``verify`` (the default) each chunk's checksum is checked before Arrow sees its
    bytes (:class:`CorruptSegment`); ``verify=False`` trusts the bytes, and a damaged chunk
    may then give wrong rows or crash the process.

    A segment may move (and on a pool tier its file be reused) between planning and reading:
    a file gone, or a chunk whose checksum does not match where the plan put it, makes the
    rest of the plan be planned again from the log, as often as the read has moved on since
    the last time; a file still missing then is :class:`DataLoss`, a chunk still not matching
    :class:`CorruptSegment`."""
    yield from _execute(plan, verify, -1 if replan else None)


def _execute(plan: ReadPlan, verify: bool, replanned_at: int | None
             ) -> Iterator[PlannedBatch]:
    """:func:`execute`; ``replanned_at`` is the offset of the last re-planning (-1 none yet),
    None when re-planning is off."""
    at_offset = plan.start
    decoder = ChunkDecoder()
    local = {c.path for c in plan.chunks if not is_url(c.path)}
    owners = {o for o in map(_owner, local) if o is not None}
    if owners:
        # This partition's segments the plan no longer names (moved, merged, deleted) are
        # unpinned now rather than when they go idle.
        MAPS.forget(local, owners)
    # The mapping of the segment being read: its next chunks are sliced from it. It pins its
    # file, so the file is never reused while we read it.
    mapped: tuple[str, pa.Buffer] | None = None
    for c in plan.chunks:
        stale: str | None = None  # why the plan may no longer describe this chunk
        try:
            if mapped is not None and mapped[0] == c.path and \
                    c.pos + c.length <= mapped[1].size:
                buf = mapped[1].slice(c.pos, c.length)
            elif is_url(c.path):
                buf = read_range(c.path, c.pos, c.length)
            else:
                mapped = (c.path, MAPS.whole(c.path, c.pos, c.length))
                buf = mapped[1].slice(c.pos, c.length)
        except FileNotFoundError:
            stale = "missing"
        else:
            if verify and checksum(buf) != c.crc:
                stale = "checksum"
        if stale is not None:
            start = max(at_offset, c.base)
            if replanned_at is None or start <= replanned_at:
                if stale == "missing":
                    raise DataLoss(
                        f"topic {plan.topic!r} partition {plan.partition}: offsets {c.base}.."
                        f"{c.base + c.records - 1} are in {c.path}, which is missing")
                raise CorruptSegment(
                    f"topic {plan.topic!r} partition {plan.partition}: chunk with offsets "
                    f"[{c.base}, {c.base + c.records}) in {c.path} does not match its "
                    "checksum")
            yield from _execute(_replan(plan, start, c), verify, start)
            return

        def where(c: PlannedChunk = c) -> str:
            return (f"{plan.topic}/{plan.partition} offsets [{c.base}, {c.base + c.records}) "
                    f"in {c.path}")

        row = c.base
        for batch in decoder.batches(buf, where):
            b0, b1 = row, row + batch.num_rows
            row = b1
            lo, hi = max(plan.start, b0), min(plan.end, b1)
            if lo < hi:
                out = batch if (lo, hi) == (b0, b1) else batch.slice(lo - b0, hi - lo)
                yield PlannedBatch(out, lo, c.timestamp)
                at_offset = hi
