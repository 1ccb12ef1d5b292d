"""The pmem tier: pre-sized pool files mapped with libpmem, Arrow IPC written into the mapping.

On real PMem (``pmem_is_pmem``) chunks are copied into the mapping and persisted with
``pmem_persist``; elsewhere the mapping is page cache, so chunks go in with one ``pwritev``
and are made durable with ``pmem_msync``, as libpmem prescribes for non-PMem mappings.

A pool of ``log.pmem.pool.ratio`` × capacity is pre-allocated (and its pages touched) when the
store is created, as ``_pool/<n>.pool`` files of ``log.segment.bytes`` each, so the hot path
never allocates or faults in fresh pages. Every open completes the pool if a crash (or a tier
on RAM losing its files) left it short; ``_pool/_complete`` marks a complete pool, so that
check is one small read. A new segment takes a pool file by renaming it to the
segment's path (atomic, so two processes never take the same file); a released segment is
renamed back into the pool. Capacity is the pool, as in Pafka.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import replace

from ..crash import crash_point
from ..errors import CorruptState, StoreFull
from ..layout import (
    POOL_COMPLETE,
    POOL_DIR,
    POOL_LOCK,
    POOL_SUFFIX,
    SEGMENT_SUFFIX,
    TMP_PREFIX,
    file_lock,
    fsync_dir,
    makedirs_durable,
    read_regular,
    write_atomic,
)
from ..segment import HEADER_SIZE
from . import libpmem
from .base import NO_SPACE, SegmentWriter, Tier, new_header, unsafe_path_error
from .pmem_writer import PmemSegmentWriter

log = logging.getLogger(__name__)
_ZEROS = bytes(4 * 1024 * 1024)


class PmemTier(Tier):
    """A tier on a DAX filesystem (or any local path) with a pool of segment files."""

    pinned_by_readers = True

    def __init__(self, spec, segment_bytes: int, pool_ratio: float):
        super().__init__(spec, segment_bytes)
        self.pool_ratio = pool_ratio
        self.pool_dir = os.path.join(self.path, POOL_DIR)

    @property
    def pool_size(self) -> int:
        """Number of segment files the pool holds in all (free and in use)."""
        return self._pool_files(self.capacity)

    def _pool_files(self, capacity: int) -> int:
        return max(1, int(capacity * self.pool_ratio) // self.segment_bytes)

    def prepare(self) -> None:
        libpmem.load()  # fail early, naming the package, when libpmem is missing
        if os.path.islink(self.pool_dir):  # pool files would be made outside the tier
            raise unsafe_path_error(self, self.pool_dir, "a symbolic link")
        makedirs_durable(self.pool_dir)

    def _marker(self) -> bytes:
        return json.dumps({"pool_files": self.pool_size,
                           "segment_bytes": self.segment_bytes}).encode()

    def _marked_complete(self) -> bool:
        return read_regular(os.path.join(self.pool_dir, POOL_COMPLETE), CorruptState,
                            f"tier {self.number}: pool marker") == self._marker()

    def ensure_pool(self) -> int:
        """Complete the pool: remove temp files of processes that died creating a pool file,
        then create pool files until free + in-use ones reach :attr:`pool_size`; return how
        many were created. Idempotent; when ``_pool/_complete`` says the pool of this size is
        complete, it only reads that marker. A filesystem too full for the whole pool leaves
        it short, with a warning: the tier works with the files it has, and the next call
        tries again.

        Thread-safe and safe across processes (an flock), but a recount that runs while
        other processes take or release pool files may be off by the files they move."""
        self.prepare()
        if self._marked_complete():
            return 0
        with file_lock(os.path.join(self.pool_dir, POOL_LOCK)):
            if self._marked_complete():  # completed by another process while we waited
                return 0
            return self._complete_pool()

    def _in_use(self) -> int:
        """Segment files on the tier (pool files taken)."""
        return sum(sum(f.endswith(SEGMENT_SUFFIX) for f in files)
                   for dirpath, _dirs, files in os.walk(self.path) if dirpath != self.pool_dir)

    def _complete_pool(self, progress: Callable[[int], None] | None = None) -> int:
        """Create the pool files missing from :attr:`pool_size`, then mark the pool complete
        (the caller holds the pool lock)."""
        self._remove_dead_temp_files()
        free = self._free_names()
        missing = self.pool_size - self._in_use() - len(free)
        if missing < 0:
            # More files than the size (a resize that died growing the pool before saving
            # the new size): give the surplus free ones back to the filesystem.
            self._delete_free(free, -missing)
        next_slot = _next_slot(free)
        made = 0
        for i in range(max(0, missing)):
            try:
                self._create_pool_file(next_slot + i)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                # The tier works with the pool files it has (placement skips it once they
                # are taken); no marker, so the next open tries again.
                self._warn_short(missing - made, e)
                break
            made += 1
            if progress is not None:
                progress(1)
        if made > 0:
            fsync_dir(self.pool_dir)
            log.info("pmem tier %s: pre-allocated %d pool files of %d bytes", self.path,
                     made, self.segment_bytes)
        if made < missing:
            return made
        # Only after every pool file is durable: a crash before this leaves no marker,
        # and the next open completes the pool.
        try:
            write_atomic(os.path.join(self.pool_dir, POOL_COMPLETE), self._marker())
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            log.warning("pmem tier %d (%s): the pool is complete but its marker %s cannot be "
                        "written (%s); the next open counts the pool again", self.number,
                        self.path, POOL_COMPLETE, e)
        return made

    def _warn_short(self, short: int, error: OSError) -> None:
        """Say that ``short`` pool files could not be pre-allocated, and what it means."""
        fs = os.statvfs(self.pool_dir)
        have = self.free_pool_files() + self._in_use()
        log.warning(
            "pmem tier %d (%s): its filesystem is full (%s; %d bytes free): %d of its %d pool "
            "files of %d bytes could not be pre-allocated. It opens with the %d it has (%d "
            "bytes of its capacity of %d); new segments go to the next tier with room once "
            "they are taken. Free space on that filesystem or shrink the tier (pafka resize); "
            "the next open completes the pool", self.number, self.path, os.strerror(
                error.errno or 0), fs.f_bavail * fs.f_frsize, short, self.pool_size,
            self.segment_bytes, have, have * self.segment_bytes, self.capacity)

    def _delete_free(self, free: list[str], count: int) -> int:
        """Delete up to ``count`` of the free pool files ``free`` (the newest first); return
        how many could not be (taken by writers meanwhile)."""
        for name in reversed(free):
            if count <= 0:
                break
            try:
                os.unlink(os.path.join(self.pool_dir, name))
            except FileNotFoundError:
                continue  # a writer took it meanwhile
            count -= 1
        fsync_dir(self.pool_dir)
        return count

    def resize(self, capacity: int, save: Callable[[], None],
               progress: Callable[[int], None] | None = None) -> int:
        """Change the pool to hold ``capacity`` bytes: free pool files are deleted, or new
        ones created, before ``save`` records the new size (``_store.json``). Returns the
        change in pool files. Fails before changing anything when the segments on the tier
        need more pool files than the new size gives, or the filesystem has no room for the
        new ones; a failure or a crash midway leaves the pool at the old size (the next open
        completes or trims it)."""
        self.prepare()
        new_files = self._pool_files(capacity)
        marker = os.path.join(self.pool_dir, POOL_COMPLETE)
        with file_lock(os.path.join(self.pool_dir, POOL_LOCK)):
            in_use, free = self._in_use(), self._free_names()
            excess = in_use + len(free) - new_files
            if excess > len(free):
                raise StoreFull(
                    f"tier {self.number} ({self.path}) holds {in_use} segments; a pool of "
                    f"{new_files} files ({capacity} bytes) cannot hold them. Move segments "
                    "off the tier first (pafka migrate), or resize it to at least "
                    f"{math.ceil(in_use * self.segment_bytes / self.pool_ratio) + 1} bytes")
            if excess < 0:
                fs = os.statvfs(self.pool_dir)
                room = fs.f_bavail * fs.f_frsize
                if -excess * self.segment_bytes > room:
                    raise StoreFull(
                        f"tier {self.number} ({self.path}): {-excess} more pool files need "
                        f"{-excess * self.segment_bytes} bytes; its filesystem has {room} free")
            # Unmarked first: a crash from here on leaves a pool the next open completes (or
            # trims) to whichever size _store.json then holds.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker)
            fsync_dir(self.pool_dir)
            if excess > 0 and self._delete_free(free, excess) > 0:
                raise StoreFull(f"tier {self.number} ({self.path}): writers took the free pool "
                                "files while it was being shrunk; try again")
            if excess < 0:
                first = _next_slot(free)
                made: list[str] = []
                try:
                    for slot in range(first, first - excess):
                        made.append(self._create_pool_file(slot))
                        if progress is not None:
                            progress(1)
                    fsync_dir(self.pool_dir)
                except OSError as e:
                    self._delete_free(made, len(made))
                    write_atomic(marker, self._marker())  # the old pool, whole again
                    raise StoreFull(f"tier {self.number} ({self.path}): growing the pool "
                                    f"failed ({e}); it keeps its old size") from None
            crash_point("resize.unsaved")
            save()
            self.capacity = capacity
            self.spec = replace(self.spec, size=capacity)
            self._complete_pool()
        return new_files - (in_use + len(free))

    def _remove_dead_temp_files(self) -> None:
        """Delete ``.tmp-<pid>-<slot>`` pool files whose creating process is gone (caller
        holds the pool lock, so no live process of this release is writing one)."""
        for name in os.listdir(self.pool_dir):
            if not name.startswith(TMP_PREFIX):
                continue
            pid = name[len(TMP_PREFIX):].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            try:
                os.unlink(os.path.join(self.pool_dir, name))
            except FileNotFoundError:
                continue
            log.info("pmem tier %s: removed %s, left by process %s that died creating a pool "
                     "file", self.path, name, pid)

    def _create_pool_file(self, slot: int) -> str:
        """Create pool file ``slot``, allocated and touched; a failure (a full filesystem)
        leaves no temporary file behind."""
        tmp = os.path.join(self.pool_dir, f"{TMP_PREFIX}{os.getpid()}-{slot}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.posix_fallocate(fd, 0, self.segment_bytes)
            # Touch every page now so that appends never pay for first-touch faults.
            pos = 0
            while pos < self.segment_bytes:
                n = min(len(_ZEROS), self.segment_bytes - pos)
                os.pwrite(fd, _ZEROS[:n], pos)
                pos += n
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        crash_point("pool.create")
        name = f"{slot:06d}{POOL_SUFFIX}"
        os.replace(tmp, os.path.join(self.pool_dir, name))
        return name

    def _free_names(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.pool_dir) if n.endswith(POOL_SUFFIX))
        except FileNotFoundError:
            return []

    def free_pool_files(self) -> int:
        return len(self._free_names())

    def has_room(self, used: int, need: int) -> bool:
        return need <= self.segment_bytes - HEADER_SIZE and self.free_pool_files() > 0

    def create_segment(self, topic: str, partition: int, seq: int, min_bytes: int,
                       durable: bool = True) -> SegmentWriter | None:
        if min_bytes > self.segment_bytes - HEADER_SIZE:
            return None  # an oversized chunk cannot use a pool file
        path = self.segment_path(topic, partition, seq)
        new_dirs = self.make_dirs(os.path.dirname(path), durable)
        w = None
        try:
            if self.is_regular_inside(path):  # CorruptSegment for a link on the way
                # Leftover of a roll that crashed before switching the active pointer.
                self.release_segment(path)
            w = self.take_pool_file(path, durable)
        finally:
            if w is None and not durable:
                # No writer will sync the new directories' entries, and a later segment in
                # them will not see them as new: make them durable now.
                for d in new_dirs:
                    fsync_dir(d)
        if w is None:
            return None
        parents = self.entry_dirs(os.path.dirname(path))
        if not durable:
            w.defer_entry(*new_dirs, *parents)
        else:
            for parent in parents:
                if parent not in new_dirs:  # those makedirs_durable synced already
                    fsync_dir(parent)
        hdr = new_header(partition, seq).pack()
        w._map.buffer(0, HEADER_SIZE)[:] = hdr
        w._map.flush(0, HEADER_SIZE)
        return w

    def open_segment(self, path: str) -> SegmentWriter:
        return PmemSegmentWriter(path, self.charge_write, self.open_inside(path, os.O_RDWR))

    def take_pool_file(self, path: str, durable: bool = True) -> PmemSegmentWriter | None:
        """Rename a free pool file to ``path`` and map it; None when the pool is empty.
        With ``durable=False`` the renames are made durable by the writer's first sync.
        Renamed between directories opened without following links: a link in the pool is
        never taken (a warning), one for a directory on the way is CorruptSegment."""
        for name in self._free_names():
            if not self.rename_inside(os.path.join(self.pool_dir, name), path, durable,
                                      skip_link=True):
                continue  # another process took it first, or a link (never taken)
            w = PmemSegmentWriter(path, self.charge_write, self.open_inside(path, os.O_RDWR))
            if not durable:
                w.defer_entry(self.pool_dir, os.path.dirname(path))
            return w
        return None

    def release_segment(self, path: str) -> None:
        """Give a segment file back to the pool (delete it if it is not pool-sized). A link
        at ``path`` or on the way is CorruptSegment: never renamed into the pool, where a
        later segment would write through it."""
        if not self.is_regular_inside(path):
            return
        if os.stat(path, follow_symlinks=False).st_size != self.segment_bytes:
            self.unlink_inside(path)
        else:
            self.rename_inside(path, os.path.join(self.pool_dir,
                                                  f"r{os.urandom(6).hex()}{POOL_SUFFIX}"))


def _next_slot(free: list[str]) -> int:
    """The slot after the highest numbered free pool file (released ones have names)."""
    slots = [int(n.split(".")[0]) for n in free if n.split(".")[0].isdigit()]
    return max(slots, default=-1) + 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
