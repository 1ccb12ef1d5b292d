"""Copy: writing a move's new segment file on the target tier, verified, under its name.

What it does: :func:`place_local` copies the committed chunks of the sources, in offset
order, into a temporary file on a local target tier (on a pmem tier, a pool file), laid
out as :func:`~.adopt.layout` says (holes left by uncommitted chunks are dropped, so a
merged segment holds only what the log references), verifies it and claims the segment's
name there; :func:`upload` writes the segment whole to a remote tier and reads it back.
Every chunk written is charged to the target tier's write throttle
(:meth:`~tier_store.tiers.Tier.charge_write`; an upload is charged whole by the remote tier)
and to the move's own ``throttle``.

Steps, each crash-safe (until the ``move`` entry is published nothing references the new
file; garbage collection reclaims what a crash leaves):

1. Under the partition's lock, create the temporary file (``TMP_PREFIX``), take its
   exclusive ``flock`` (garbage collection and other services release no locked file) and
   make its mtime fresh: garbage collection, which takes that lock first, never finds it
   unlocked.
2. Copy the chunks (touching the file at least every second, so only an abandoned copy
   ages), write the header, sealed, and flush.
3. Verify every chunk's checksum at its new position.
4. ``link`` the file to the segment's name (only if no other file holds it), then unlink
   the temporary name and sync the directories. On a remote tier: write the object whole
   (it becomes visible only once complete) and verify it by reading it back whole. On
   a store shared by many hosts the chunks come from their bundles (:mod:`.bundles`).

The lock is held by the caller until its ``move`` entry is published or the copy is
discarded (:func:`discard_own`, a move that lost its race).

DANGER: it writes a new file under the segment's name on the target tier, and releases
only what it made (its temporary file; its own copy after a lost race, checked to be the
file its lock holds). Readers are protected because nothing references the new file
before the ``move`` entry, and the old files stay until their grace period is over
(:mod:`.garbage`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ..chunk import checksum
from ..crash import crash_point
from ..entries import ChunkRecord
from ..errors import CommitConflict, CorruptSegment, DataLoss, PafkaError, StoreFull
from ..layout import TMP_PREFIX, fsync_dir, makedirs_durable, segment_id
from ..reading import read_range
from ..segment import HEADER_SIZE, SegmentHeader
from ..state import SegmentState
from ..tiers import NO_SPACE
from ..tiers.pmem_writer import PmemSegmentWriter
from .adopt import layout
from .bundles import source_chunks

if TYPE_CHECKING:
    from ..tiers import Tier
    from ..topic import Topic


def place_local(topic: Topic, target: Tier, segs: list[SegmentState], rows: np.ndarray,
                need: int, throttle: Callable[[int], None] | None, final: str
                ) -> tuple[list[ChunkRecord], int]:
    """Copy into a temporary file on a local tier, verify, and claim the final name; return
    the chunks and the descriptor holding the copy's lock (the caller closes it once the
    ``move`` entry is published or the copy discarded). A full target filesystem is
    :class:`StoreFull`, with the temporary copy removed."""
    free = target.free_bytes()
    if not target.has_pool and free is not None and free < need:
        # Known before the first byte: do not write a copy that cannot fit.
        raise _target_full(topic, target, segs, OSError(errno.ENOSPC, os.strerror(
            errno.ENOSPC)))
    try:
        tmp, chunks, lock = _copy(topic, target, segs, rows, need, throttle)
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        raise _target_full(topic, target, segs, e) from None
    try:
        crash_point("move.copied")
        _verify(tmp, chunks)
        crash_point("move.verified")
        # A fresh mtime on the name we claim, as a file left by a crash ages from here.
        _touch(topic, tmp)
        # link, not rename: claim the name only if no other copy holds it (another service
        # moving the same segment, or a copy left by a crash, which garbage collection
        # reclaims after the grace period).
        os.link(tmp, final)
    except FileExistsError:
        _discard(target, tmp)
        os.close(lock)
        raise CommitConflict(f"topic {topic.name!r}: {final} already exists (another move of "
                             "the segment is under way or was interrupted)") from None
    except BaseException as e:
        _discard(target, tmp)
        os.close(lock)
        if isinstance(e, OSError) and e.errno in NO_SPACE:  # the directory cannot grow
            raise _target_full(topic, target, segs, e) from None
        raise
    try:
        crash_point("move.linked")
        os.unlink(tmp)
        fsync_dir(os.path.dirname(final))
        # The directories may be ones a deferred writer made and died before syncing.
        for parent in target.entry_dirs(os.path.dirname(final)):
            fsync_dir(parent)
    except BaseException:
        os.close(lock)
        raise
    return chunks, lock


def discard_own(target: Tier, final: str, lock: int) -> None:
    """Release ``final`` if it still is our copy (the file ``lock`` holds): a move that lost
    its publish race; the name was claimed by our link."""
    held = os.fstat(lock)
    try:
        named = os.stat(final)
    except FileNotFoundError:
        return
    if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
        _discard(target, final)


def upload(topic: Topic, target: Tier, segs: list[SegmentState], rows: np.ndarray,
            throttle: Callable[[int], None] | None, final: str) -> list[ChunkRecord]:
    """Write the segment whole to a remote tier, then read it back (one read) to verify.
    The chunks come from :func:`.bundles.source_chunks`, checked before the upload."""
    p, seq = segs[0].partition, segs[0].seq
    out = pa.BufferOutputStream()
    out.write(b"\0" * HEADER_SIZE)
    chunks, end = layout(rows, p, seq, target.number)
    pos = HEADER_SIZE
    # Each checked against its checksum: on a shared store from bundles, by ranged reads.
    for c, buf in zip(chunks, source_chunks(topic, segs, rows), strict=True):
        if c.pos > pos:
            out.write(b"\0" * (c.pos - pos))
        out.write(buf)
        pos = c.pos + c.length
        if throttle is not None:
            throttle(c.length)
    data = out.getvalue()
    header = SegmentHeader(p, seq, end, True, int(time.time() * 1000)).pack()
    data = pa.py_buffer(header + data.slice(HEADER_SIZE).to_pybytes())
    crash_point("move.copied")
    if target.exists(final):
        raise CommitConflict(f"topic {topic.name!r}: {final} already exists (another move of "
                             "the segment is under way or was interrupted)")
    # Object stores have no exclusive rename: the name was free a moment ago, and a write
    # becomes visible only once complete.
    target.write_whole(final, data)
    try:
        # One read of the whole object back, not one per chunk.
        back = read_range(final, 0, len(data))
        if len(back) != len(data):
            raise CorruptSegment(f"{final}: {len(back)} bytes read back after upload, "
                                 f"{len(data)} written; move abandoned")
        for c in chunks:
            if checksum(back.slice(c.pos, c.length)) != c.checksum:
                raise CorruptSegment(f"{final}: chunk with offsets [{c.base}, "
                                     f"{c.base + c.records}) does not match its checksum "
                                     "after upload; move abandoned")
        crash_point("move.verified")
    except BaseException:
        target.release_segment(final)
        raise
    return chunks


def _target_full(topic: Topic, target: Tier, segs: list[SegmentState], e: OSError
                 ) -> StoreFull:
    """The error of a copy that found the target tier's filesystem full (its temporary copy
    is gone already); placement skips that tier for new segments until space returns."""
    topic.store.mark_out_of_space(target, e)
    free = target.free_bytes()
    return StoreFull(f"topic {topic.name!r}: moving {', '.join(s.id for s in segs)} to tier "
                     f"{target.number} ({target.path}) failed: its filesystem is full "
                     f"({os.strerror(e.errno or 0)}, {free} bytes free) though the tier is "
                     f"configured for {target.capacity or 'unbounded'} bytes; the copy was "
                     "removed and the segments stay where they are. Free space there, or "
                     "shrink the tier to what its filesystem holds (pafka resize)")


def _read_source(topic: Topic, p: int, seq: int, path: str, pos: int, length: int
                 ) -> pa.Buffer:
    """A committed chunk of a source segment; :class:`DataLoss` naming it if its file is
    gone (a tier on RAM after a reboot): that segment cannot move, the others still can."""
    try:
        return read_range(path, pos, length)
    except FileNotFoundError:
        raise DataLoss(f"topic {topic.name!r}: segment {segment_id(p, seq)} cannot move, its "
                       f"file {path} is missing") from None


def _touch(topic: Topic, tmp: str) -> None:
    """Refresh the mtime of a move's temporary copy, so that only an abandoned one ages."""
    try:
        os.utime(tmp)
    except FileNotFoundError:
        raise PafkaError(f"topic {topic.name!r}: the temporary copy {tmp} of a move was "
                         "reclaimed by garbage collection (the move stalled longer than "
                         "log.cleanup.grace.ms); move abandoned") from None


def _discard(tier: Tier, path: str) -> None:
    if tier.has_pool:
        tier.release_segment(path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _copy(topic: Topic, target: Tier, segs: list[SegmentState], rows: np.ndarray,
          need: int, throttle: Callable[[int], None] | None
          ) -> tuple[str, list[ChunkRecord], int]:
    """Copy the committed chunks into a temporary file on ``target``; return it, the chunks
    at their new positions, and the descriptor holding the copy's lock (see
    :func:`_create_locked`; the caller closes it)."""
    store = topic.store
    p = segs[0].partition
    d = os.path.dirname(target.segment_path(topic.name, p, segs[0].seq))
    makedirs_durable(d)  # <tier>/<topic>/<p> and their entries in their parents
    tmp = os.path.join(d, f"{TMP_PREFIX}move-{os.getpid()}-{os.urandom(4).hex()}")
    tiers = {s.seq: s.tier for s in segs}
    # Touch the copy at least this often: garbage collection reclaims a temporary file
    # untouched for the grace period (and unlocked: a live move's copy ages only if the
    # move stalls that long with its lock lost, which the touch then reports).
    touch_every = min(1.0, topic.setting("log.cleanup.grace.ms") / 4000.0)
    if target.has_pool:
        if need > target.segment_bytes:
            raise StoreFull(f"merged segment of {need} bytes does not fit a pool file of "
                            f"{target.segment_bytes} bytes on tier {target.number}")
    else:
        used = store.used_bytes().get(target.number, 0)
        if target.capacity > 0 and used + need > target.capacity:
            raise StoreFull(f"tier {target.number} ({target.path}): {used} of "
                            f"{target.capacity} bytes used, {need} more do not fit")
    chunks, end = layout(rows, p, segs[0].seq, target.number)
    writer, lock = _create_locked(topic, target, p, tmp)
    fd = lock if writer is None else -1  # a plain file is written through its lock's fd
    try:
        touched = time.monotonic()
        if writer is not None:
            mapping = writer.mapping
            mapping.populate(0, need)
            out = mapping.buffer(0, mapping.length)
        for r, c in zip(rows, chunks, strict=True):
            if time.monotonic() - touched >= touch_every:
                _touch(topic, tmp)
                touched = time.monotonic()
            seq, pos, length = int(r["seq"]), c.pos, c.length
            src = store.tier(tiers[seq]).segment_path(topic.name, p, seq)
            buf = _read_source(topic, p, seq, src, int(r["pos"]), length)
            target.charge_write(length)
            if writer is not None:
                out[pos:pos + length] = memoryview(buf)
            else:
                view = memoryview(buf)
                half = length // 2
                os.pwrite(fd, view[:half], pos)
                crash_point("move.copy")
                os.pwrite(fd, view[half:], pos + half)
            if throttle is not None:
                throttle(length)
        header = SegmentHeader(p, segs[0].seq, end, True, int(time.time() * 1000)).pack()
        if writer is not None:
            out[0:HEADER_SIZE] = header
            mapping.flush(0, end)
        else:
            os.pwrite(fd, header, 0)
            os.fsync(fd)
    except BaseException:
        if writer is not None:
            writer.close()
        _discard(target, tmp)
        os.close(lock)
        raise
    if writer is not None:
        writer.close()
    return tmp, chunks, lock


def _create_locked(topic: Topic, target: Tier, p: int, tmp: str
                   ) -> tuple[PmemSegmentWriter | None, int]:
    """Create the move's temporary copy ``tmp`` (a plain file, or on a pool tier a pool file
    renamed to it) and take the ``flock`` that marks it as a live move's copy; return the
    pool file's writer (None for a plain file) and the descriptor holding the lock (for a
    plain file, the one it was created with, open for writing).

    Garbage collection and other services never release a locked file
    (:func:`.garbage.release_file`); the lock is held until the ``move`` entry is published or
    the copy discarded, and the kernel drops it if we die. The copy is created and locked
    under the partition's lock, which garbage collection takes (without waiting) before it
    releases any file of the partition: it never finds the copy unlocked, however long this
    process is descheduled between the two steps (a pool file keeps the mtime of its last
    use, so with a short grace period it is a candidate the moment it has its new name)."""
    writer: PmemSegmentWriter | None = None
    fd = -1
    with topic.store.partition_lock(topic.name, p):
        try:
            if target.has_pool:
                writer = target.take_pool_file(tmp)
                if writer is None:
                    raise StoreFull(f"tier {target.number} ({target.path}) has no free pool "
                                    "file")
                fd = target.open_inside(tmp, os.O_RDONLY)
            else:  # never through a linked <topic>/ or <partition>/ directory
                fd = target.open_inside(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A fresh mtime: a pool file's is that of its last use.
            _touch(topic, tmp)
        except BaseException:
            if writer is not None:
                writer.close()
            if fd >= 0:
                os.close(fd)
            if writer is not None or fd >= 0:
                _discard(target, tmp)
            raise
    return writer, fd


def _verify(path: str, chunks: list[ChunkRecord]) -> None:
    with pa.memory_map(path, "r") as mm:
        buf = mm.read_buffer()
        for c in chunks:
            if checksum(buf.slice(c.pos, c.length)) != c.checksum:
                raise CorruptSegment(f"{path}: chunk with offsets [{c.base}, {c.base + c.records}) "
                                     "does not match its checksum after copying; move abandoned")


__all__ = ["discard_own", "place_local", "upload"]
