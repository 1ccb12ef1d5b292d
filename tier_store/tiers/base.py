"""The contract every tier implements, and what local tiers share.

A tier is a directory (or, later, an fsspec URL) holding segment files. Writers append chunks
to a segment through a :class:`SegmentWriter`; readers map segment files with Arrow and slice
chunks out of the mapping, so reading is the same for every local tier.
"""

from __future__ import annotations

import errno
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from ..chunk import EncodedChunk
from ..config import TierSpec
from ..layout import fsync_dir, segment_relpath
from ..segment import HEADER_SIZE, SegmentHeader

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""errno values that mean a tier's filesystem is full."""

_throttles: dict[int | None, Callable[[int], None]] = {}


def throttle_tier_writes(charge: Callable[[int], None] | None, tier: int | None = None) -> None:
    """In this process, call ``charge(nbytes)`` before every write of ``nbytes`` to tier
    number ``tier`` (to every tier when None): appends and the copies of moves. It may
    sleep, which makes the tier a slower device (benchmarks simulate a disk this way).
    ``charge=None`` removes it."""
    if charge is None:
        _throttles.pop(tier, None)
    else:
        _throttles[tier] = charge


class SegmentWriter(ABC):
    """Appends chunks to one segment file. Not thread-safe: callers hold the partition lock."""

    path: str
    # Directories whose entries for this file are not yet known to be durable: those of a
    # segment created with durable=False, or opened by a writer that did not create it.
    _entry_dirs: tuple[str, ...] = ()

    def defer_entry(self, *dirs: str) -> None:
        """Leave the fsync of ``dirs`` (this file's directory entries) to the next sync."""
        self._entry_dirs = tuple(dict.fromkeys(self._entry_dirs + dirs))

    def _sync_entry(self) -> None:
        dirs, self._entry_dirs = self._entry_dirs, ()
        for d in dirs:
            fsync_dir(d)

    @abstractmethod
    def header(self) -> SegmentHeader:
        """Read the header as it is in the file now (another process may have advanced it)."""

    @abstractmethod
    def capacity(self) -> int:
        """The byte position no chunk may extend past."""

    @abstractmethod
    def write_chunk(self, pos: int, chunk: EncodedChunk) -> int:
        """Write ``chunk`` at ``pos``; return its checksum. It is durable once
        :meth:`set_end` with ``durable=True``, :meth:`sync`, :meth:`seal` or :meth:`close`
        has returned."""

    @abstractmethod
    def set_end(self, end: int, durable: bool = True) -> None:
        """Advance the header's ``end``. With ``durable``, every chunk written so far and
        ``end`` are durable on return; otherwise they wait for :meth:`sync`."""

    @abstractmethod
    def sync(self) -> None:
        """Make every chunk and header word written so far durable, and the file's directory
        entry if it may not be (nothing to do if all are)."""

    @abstractmethod
    def seal(self, durable: bool = True) -> None:
        """Mark the segment sealed; with ``durable``, it and every chunk written before are
        durable on return, otherwise they wait for :meth:`sync` or :meth:`close` (the
        partition's pointer, not this flag, says which segment is active, so the flag may
        reach the disk late)."""

    @abstractmethod
    def close(self) -> None:
        """Make what was written durable (:meth:`sync`), then release the file (and
        mapping)."""


class Tier(ABC):
    """One storage tier: a directory of segment files with a capacity."""

    def __init__(self, spec: TierSpec, segment_bytes: int):
        self.spec = spec
        self.number = spec.number
        self.type = spec.type
        self.path = spec.path
        self.capacity = spec.size
        self.segment_bytes = segment_bytes

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.number}, {self.type}, {self.path!r})"

    def segment_path(self, topic: str, partition: int, seq: int) -> str:
        return os.path.join(self.path, segment_relpath(topic, partition, seq))

    def entry_dirs(self, d: str) -> list[str]:
        """``d``'s parents up to the tier's directory: they hold the entries that lead to
        ``d``. A new segment makes them durable whether or not it made ``d``: a deferred
        writer that died before its first sync may have made ``d`` without syncing them."""
        out = []
        while d != self.path:
            parent = os.path.dirname(d)
            if parent == d:
                break
            out.append(parent)
            d = parent
        return out

    def prepare(self) -> None:
        """Create the tier's directory (and pool, where it has one)."""
        os.makedirs(self.path, exist_ok=True)

    @abstractmethod
    def create_segment(self, topic: str, partition: int, seq: int, min_bytes: int,
                       durable: bool = True) -> SegmentWriter | None:
        """Create segment ``seq`` able to hold ``min_bytes`` of chunks; None if no room.
        The file and its directory entry are durable on return, or with ``durable=False``
        once the writer's first :meth:`SegmentWriter.sync` (or close) has returned."""

    @abstractmethod
    def open_segment(self, path: str) -> SegmentWriter:
        """Open an existing segment for appending."""

    @abstractmethod
    def release_segment(self, path: str) -> None:
        """Delete a segment file that no entry references any more (pool files go back)."""

    def has_room(self, used: int, need: int) -> bool:
        """Whether a new segment for a chunk of ``need`` bytes fits, given ``used`` bytes
        accounted on this tier (a whole segment is reserved)."""
        return self.capacity <= 0 or used + max(need, self.segment_bytes) <= self.capacity

    def free_bytes(self) -> int | None:
        """Bytes free on the tier's filesystem (None where unknown, e.g. an object store)."""
        if not self.local:
            return None
        try:
            fs = os.statvfs(self.path)
        except OSError:
            return None
        return fs.f_bavail * fs.f_frsize

    def charge_write(self, nbytes: int) -> None:
        """Charge a write of ``nbytes`` to this tier's throttle, if one is set
        (:func:`throttle_tier_writes`)."""
        charge = _throttles.get(self.number) or _throttles.get(None)
        if charge is not None:
            charge(nbytes)

    def free_pool_files(self) -> int | None:
        """Free pre-allocated segment files, for tiers with a pool; None otherwise."""
        return None

    @property
    def pool_size(self) -> int | None:
        """How many segment files the tier's pool holds; None for tiers without a pool."""
        return None

    def ensure_pool(self) -> int:
        """Complete the pool after a crash or a lost file; returns files created (0 here)."""
        return 0

    def resize(self, capacity: int, save: Callable[[], None],
               progress: Callable[[int], None] | None = None) -> int:
        """Take ``capacity`` as the tier's size once ``save`` has recorded it; returns the
        change in pool files (0 for tiers without a pool)."""
        save()
        self.capacity = capacity
        return 0

    # Files of the tier, for garbage collection, checks and moves. Local tiers use the OS;
    # a remote tier overrides these.
    local = True
    # Whether a released file is reused (a pool): then it is released as soon as no reader
    # pins it (an exclusive flock succeeds) rather than after log.cleanup.grace.ms.
    pinned_by_readers = False

    @property
    def is_remote(self) -> bool:
        """Whether the tier lives behind a filesystem URL (fsspec): no appends, no flock, no
        memory mapping; sealed segments are written whole."""
        return not self.local

    @property
    def has_pool(self) -> bool:
        """Whether the tier keeps a pool of pre-allocated segment files (PMEM)."""
        return self.pinned_by_readers

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def read_header(self, path: str) -> SegmentHeader | None:
        return SegmentHeader.read(path)

    def file_size(self, path: str) -> int:
        return os.path.getsize(path)

    def partition_files(self, topic: str) -> Iterator[tuple[int, str, str, float]]:
        """(partition, name, path, mtime) of every file under the topic's directory."""
        tdir = os.path.join(self.path, topic)
        if not os.path.isdir(tdir):
            return
        for pname in os.listdir(tdir):
            if not pname.isdigit():
                continue
            pdir = os.path.join(tdir, pname)
            for name in os.listdir(pdir):
                path = os.path.join(pdir, name)
                try:
                    yield int(pname), name, path, os.stat(path).st_mtime
                except FileNotFoundError:
                    continue


def new_header(partition: int, seq: int) -> SegmentHeader:
    return SegmentHeader(partition, seq, HEADER_SIZE, False, int(time.time() * 1000))
