"""The contract every tier implements, and what local tiers share.

A tier is a directory (or, later, an fsspec URL) holding segment files. Writers append chunks
to a segment through a :class:`SegmentWriter`; readers map segment files with Arrow and slice
chunks out of the mapping, so reading is the same for every local tier.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator

from ..chunk import EncodedChunk
from ..config import WHOLE_FILESYSTEM, TierSpec
from ..errors import CorruptSegment
from ..layout import file_unlinked, fsync_dir, makedirs_durable, not_regular, segment_relpath
from ..segment import HEADER_SIZE, SegmentHeader
from . import space

log = logging.getLogger(__name__)

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""errno values that mean a tier's filesystem is full."""

_throttles: dict[int | None, Callable[[int], None]] = {}


def throttle_tier_writes(charge: Callable[[int], None] | None, tier: int | None = None) -> None:
    """In this process, call ``charge(nbytes)`` before every write of ``nbytes`` to tier
    ``tier`` (every tier when None), appends and moves; it may sleep, making the tier a
    slower device (benchmarks simulate a disk so). ``charge=None`` removes it."""
    if charge is None:
        _throttles.pop(tier, None)
    else:
        _throttles[tier] = charge


class SegmentWriter(ABC):
    """Appends chunks to one segment file. Not thread-safe: callers hold the partition lock."""

    path: str
    # Directories whose entries for this file may not be durable yet: a segment created
    # with durable=False, or opened by a writer that did not create it.
    _entry_dirs: tuple[str, ...] = ()

    def unlinked(self) -> bool:
        """Whether its file left its directory (removed by hand): writes there never commit."""
        return file_unlinked(getattr(self, "_fd", -1))

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
        """Make what was written durable (:meth:`sync`), then release the file and mapping."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def unsafe_path_error(tier: InsideTier, path: str, what: str) -> CorruptSegment:
    """The error for a path on ``tier`` the store will not write, rename or delete through."""
    return CorruptSegment(f"tier {tier.number} ({tier.path}): {path} is {what}: the store "
                          "never writes, renames or deletes through one; replace it with "
                          "the directory or file it stands for")


class InsideTier:
    """Files of a local tier reached through no symbolic link below the tier's directory:
    ``O_NOFOLLOW`` guards only a path's last component, so each directory on the way is
    opened on its own. A link, or a file that is not a regular file on the tier's device, is
    :class:`CorruptSegment` naming it. The tier's own directory may be a link."""

    path: str
    number: int

    def open_parent(self, path: str) -> tuple[int, str]:
        """(descriptor of ``path``'s directory, ``path``'s last component); the caller closes
        the descriptor. FileNotFoundError when a directory on the way is missing."""
        rel = os.path.relpath(path, self.path)
        parts = rel.split(os.sep)
        if rel.startswith(os.pardir) or os.path.isabs(rel) or "" in parts or os.pardir in parts:
            raise unsafe_path_error(self, path, "outside the tier's directory")
        fd = os.open(self.path, _DIR_FLAGS)
        try:
            for i, name in enumerate(parts[:-1]):
                try:
                    nfd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as e:
                    if e.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise unsafe_path_error(self, os.path.join(self.path, *parts[:i + 1]),
                                          "a symbolic link or not a directory") from None
                    raise
                os.close(fd)
                fd = nfd
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def make_dirs(self, d: str, durable: bool = True) -> list[str]:
        """``makedirs_durable(d)``; a dangling link on the way is CorruptSegment naming it."""
        try:
            return makedirs_durable(d, durable)
        except FileExistsError:
            raise unsafe_path_error(self, d, "reached through a link or a file where a "
                                    "directory should be") from None

    def open_inside(self, path: str, flags: int, mode: int = 0o644) -> int:
        """Open ``path`` (a file under the tier's directory) with ``flags``, never through a
        link; check it is a regular file on the tier's device. Returns the descriptor.
        A directory, a FIFO or a device there is :class:`CorruptSegment` naming it, raised
        before it is opened (a FIFO's open for reading would wait for a writer)."""
        dfd, name = self.open_parent(path)
        try:
            if not flags & os.O_EXCL:  # an exclusive create refuses whatever is there
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    pass  # the open creates it, or says it is missing
                else:
                    if stat.S_ISLNK(st.st_mode):
                        raise unsafe_path_error(self, path, "a symbolic link")
                    if not stat.S_ISREG(st.st_mode):
                        raise not_regular(CorruptSegment, f"tier {self.number}:", path, st.st_mode)
            try:
                # O_NONBLOCK: the name may lead to a FIFO since the stat.
                fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                             | os.O_NOCTTY, mode, dir_fd=dfd)
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise unsafe_path_error(self, path, "a symbolic link") from None
                raise
            try:
                st, dev = os.fstat(fd), os.fstat(dfd).st_dev
                if not stat.S_ISREG(st.st_mode):
                    raise not_regular(CorruptSegment, f"tier {self.number}:", path, st.st_mode)
                if st.st_dev != dev:
                    raise unsafe_path_error(self, path, "not a regular file on the tier's device")
                os.set_blocking(fd, True)  # only the open had to be guarded
            except BaseException:
                os.close(fd)
                raise
            return fd
        finally:
            os.close(dfd)

    def is_regular_inside(self, path: str) -> bool:
        """Whether ``path`` names a regular file reached through no link below the tier's
        directory (False when missing); CorruptSegment for a link on the way or at it."""
        return self._lstat_inside(path, lambda dfd, name: True) is not None

    def _lstat_inside(self, path: str, then: Callable[[int, str], bool],
                      skip_link: bool = False) -> bool | None:
        """``then(directory fd, name)`` once ``path`` is checked to be a regular file
        reached through no link (CorruptSegment otherwise; with ``skip_link`` a link at
        ``path`` itself is left alone with a warning); None when it is missing."""
        try:
            dfd, name = self.open_parent(path)
        except FileNotFoundError:
            return None
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if stat.S_ISLNK(st.st_mode):
                if not skip_link:
                    raise unsafe_path_error(self, path, "a symbolic link")
                log.warning("%s is a symbolic link: left alone, never used", path)
            if not stat.S_ISREG(st.st_mode):
                return None
            try:
                return then(dfd, name)
            except FileNotFoundError:
                return None
        finally:
            os.close(dfd)

    def unlink_inside(self, path: str) -> None:
        """Delete the regular file ``path`` (durably); never a link (CorruptSegment), nor
        anything through one. Nothing to do when it is gone."""
        def unlink(dfd: int, name: str) -> bool:
            os.unlink(name, dir_fd=dfd)
            os.fsync(dfd)
            return True
        self._lstat_inside(path, unlink)

    def rename_inside(self, src: str, dst: str, durable: bool = True,
                      skip_link: bool = False) -> bool:
        """Rename the regular file ``src`` to ``dst``, both under the tier's directory,
        between directories opened without following links; False when ``src`` is gone
        (another process took it). A link is CorruptSegment (with ``skip_link``, a link at
        ``src`` is False and a warning), never renamed."""
        def rename(sfd: int, sname: str) -> bool:
            dfd, dname = self.open_parent(dst)
            try:
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                if durable:
                    os.fsync(sfd)
                    os.fsync(dfd)
            finally:
                os.close(dfd)
            return True
        return bool(self._lstat_inside(src, rename, skip_link))


class Tier(InsideTier, ABC):
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
        """Whether a segment for a ``need``-byte chunk fits, given ``used`` bytes accounted
        here (a whole segment is reserved; size -1: :mod:`.space`)."""
        if self.capacity == WHOLE_FILESYSTEM:
            left = space.room(self.path)
            return left is None or left >= max(need, self.segment_bytes)
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
        """Take ``capacity`` once ``save`` has recorded it; returns the change in pool files."""
        save()
        self.capacity = capacity
        return 0

    # Files of the tier, for garbage collection, checks and moves: a remote tier overrides.
    local = True
    is_lake = False  # a lake (:mod:`.lake_tier`): Parquet files of a table, no segments
    # Whether a released file is reused (a pool): then it is released as soon as no reader
    # pins it (an exclusive flock succeeds) rather than after log.cleanup.grace.ms.
    pinned_by_readers = False

    @property
    def is_remote(self) -> bool:
        """Whether the tier is an fsspec URL: no appends, flock or maps; whole segments."""
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
        if _linked(tdir) or not os.path.isdir(tdir):
            return
        for pname in os.listdir(tdir):
            if not pname.isdigit():
                continue
            pdir = os.path.join(tdir, pname)
            if _linked(pdir):
                continue
            for name in os.listdir(pdir):
                path = os.path.join(pdir, name)
                try:
                    yield int(pname), name, path, os.stat(path).st_mtime
                except FileNotFoundError:
                    continue


def _linked(d: str) -> bool:
    """Whether directory ``d`` of a tier is a symbolic link: what it leads to is not the
    tier's, so garbage collection and checks leave it alone (with a warning)."""
    if not os.path.islink(d):
        return False
    log.warning("%s is a symbolic link: its files are not the tier's and are left alone; "
                "replace it with the directory it stands for", d)
    return True


def new_header(partition: int, seq: int) -> SegmentHeader:
    return SegmentHeader(partition, seq, HEADER_SIZE, False, int(time.time() * 1000))
