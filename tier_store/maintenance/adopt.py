"""Adopt: a move takes back a segment's old file on the target tier instead of copying.

What it does: a segment that moves back to a tier it lived on while its old file there is
still in its grace period (demoted, promoted, demoted again) finds that file under its
name. (On a pool tier an old file no reader pins is released at once instead, so this
serves file and remote tiers.) Moves lay a segment out deterministically (:func:`layout`:
the header, then the committed chunks in offset order, each at the next aligned position),
and a sealed segment's chunks never change, so when the old file is laid out exactly as
the copy would be, the move adopts it (:func:`adopt_local`, :func:`adopt_remote`) and
publishes the same ``move`` entry a copy would (same conflict rules and relocation checks).

Steps, each crash-safe:

1. Take the file's exclusive ``flock`` without waiting (as a copy's lock: garbage
   collection and other services release no locked file); on a remote tier the caller
   holds the partition's remote-name lock instead.
2. Check that the name still leads to it, that its header names the segment and ends
   where the layout does, that its size is the one a copy would have, and every chunk's
   checksum at its position in the layout. Anything different, and the move copies as
   without it (the old file waits for its grace period).
3. Seal its header if needed, touch and sync the file (a local tier; an object is never
   written). Until the move's entry is published the file is as unreferenced as before,
   so a crash changes nothing garbage collection relies on; a lost race leaves it in place.

DANGER: it rewrites one word of the old file (the ``sealed`` flag of its header) and its
mtime, never a chunk's bytes. Readers are protected because the bytes at the chunks'
positions are the bytes a reader that planned against the old file reads, so no grace
period is needed; a file a reader pins, a live move holds or a release is taking is locked,
and left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import mmap
import os
import stat
from typing import TYPE_CHECKING

import numpy as np

from ..chunk import checksum
from ..crash import crash_point
from ..entries import ChunkRecord
from ..errors import CorruptSegment
from ..layout import fsync_dir
from ..reading import read_range
from ..segment import HEADER_SIZE, SEALED_OFFSET, WORD, SegmentHeader, align
from ..state import NO_TIME
from ..stats import parsed

if TYPE_CHECKING:
    from ..tiers import Tier
    from ..topic import Topic

log = logging.getLogger(__name__)


def layout(rows: np.ndarray, p: int, seq: int, tier: int) -> tuple[list[ChunkRecord], int]:
    """Where a move puts the committed chunks ``rows`` (in offset order) in segment ``seq``'s
    file on ``tier``: after the header, each at the next aligned position. Returns the chunks
    at their positions and the file's end. The one layout of every copy and upload, so that
    an old file of the segment laid out by it can be adopted (:func:`adopt_local`)."""
    chunks: list[ChunkRecord] = []
    pos = HEADER_SIZE
    for r in rows:
        pos = align(pos)
        chunks.append(chunk_record(r, p, seq, tier, pos))
        pos += int(r["length"])
    return chunks, pos


BLOCK = 4096
"""A file tier's direct writes end on a block: a segment file may run this far past its end."""


def _size_differs(target: Tier, size: int, end: int) -> bool:
    """Whether a file of ``size`` bytes whose layout ends at ``end`` is not what a copy on
    ``target`` would be: a pool file is the pool's size; a file tier's file ends at ``end``,
    or in the block holding it (a direct write's padding); a remote object ends at it."""
    if target.has_pool:
        return size != target.segment_bytes
    if target.local:
        return not end <= size <= -(-end // BLOCK) * BLOCK
    return size != end


def _header_differs(hdr: SegmentHeader, p: int, seq: int, end: int) -> str | None:
    if (hdr.partition, hdr.seq) != (p, seq):
        return f"its header names segment {hdr.partition}-{hdr.seq}"
    if hdr.end != end:
        return f"its header ends at byte {hdr.end}, the layout at byte {end}"
    return None


def adopt_local(topic: Topic, target: Tier, final: str, p: int, seq: int,
                 chunks: list[ChunkRecord], end: int) -> int:
    """Adopt the file at ``final`` (the segment's old file on the local tier ``target``) as
    the move's result if it is laid out as :func:`layout` says, ``chunks`` and ``end``:
    return the descriptor holding its exclusive ``flock`` (as a copy's is held, see
    :mod:`.copy`; the caller closes it once the entry is published), or -1 to copy instead.

    The lock is taken without waiting: a file locked by a live move (its copy), by garbage
    collection releasing it, or pinned by a reader is left alone. Under it the name must
    still lead to the file, and its header, size and every chunk's checksum must be what a
    copy would write; then its header is sealed if it is not, its mtime refreshed (a file left
    by a crash ages from here, as a copy does) and it is synced with its directory entries.
    The chunks' bytes are never written: a reader that planned against the old file reads
    the same bytes."""
    try:
        fd = os.open(final, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return -1  # released meanwhile (or not a plain file: never adopted)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.debug("topic %s: %s is locked (a live move, a release or a reader): not "
                      "adopted", topic.name, final)
            os.close(fd)
            return -1
        why = _local_differs(fd, final, target, p, seq, chunks, end)
        if why is not None:
            log.debug("topic %s: the old file %s is not adopted: %s", topic.name, final, why)
            os.close(fd)
            return -1
        crash_point("move.verified")
        hdr = SegmentHeader.unpack(os.pread(fd, HEADER_SIZE, 0), final)
        if not hdr.sealed:
            os.pwrite(fd, WORD.pack(1), SEALED_OFFSET)  # one aligned word, as seal() writes
        os.utime(fd)
        os.fsync(fd)
        # Its entries were made durable when it was linked, unless that mover died first.
        fsync_dir(os.path.dirname(final))
        for parent in target.entry_dirs(os.path.dirname(final)):
            fsync_dir(parent)
        crash_point("move.linked")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _local_differs(fd: int, final: str, target: Tier, p: int, seq: int,
                   chunks: list[ChunkRecord], end: int) -> str | None:
    """Why the file ``fd`` (locked by us) is not what a copy to ``final`` would be; None if
    it is, chunk for chunk."""
    held = os.fstat(fd)
    try:
        named = os.stat(final, follow_symlinks=False)
    except FileNotFoundError:
        return "it was released"
    if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
        return "the name leads to another file now"
    if not stat.S_ISREG(held.st_mode):
        return "not a regular file"
    if _size_differs(target, held.st_size, end):
        return f"{held.st_size} bytes, a copy would end at byte {end}"
    try:
        hdr = SegmentHeader.unpack(os.pread(fd, HEADER_SIZE, 0), final)
    except CorruptSegment as e:
        return str(e)
    why = _header_differs(hdr, p, seq, end)
    if why is not None:
        return why
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    try:
        with contextlib.suppress(OSError, AttributeError):
            m.madvise(mmap.MADV_SEQUENTIAL)
        for c in chunks:
            with memoryview(m)[c.pos:c.pos + c.length] as view:
                if checksum(view) != c.checksum:
                    return (f"the chunk with offsets [{c.base}, {c.base + c.records}) does not "
                            f"match its checksum at byte {c.pos}")
    finally:
        m.close()
    return None


def adopt_remote(topic: Topic, target: Tier, final: str, p: int, seq: int,
                  chunks: list[ChunkRecord], end: int) -> bool:
    """Whether the object at ``final`` on the remote tier ``target`` (the segment's old copy)
    is laid out as :func:`layout` says and sealed, checked by ranged reads: then the move
    names it instead of uploading. The caller holds the partition's remote-name lock, under
    which alone objects of the partition are written or deleted, until its entry is
    published. Nothing is written (an object store cannot touch or patch an object)."""
    why: str | None
    try:
        hdr = target.read_header(final)
        if hdr is None:
            return False
        why = _header_differs(hdr, p, seq, end)
        if why is None and not hdr.sealed:
            why = "its header is not sealed"
        if why is None and _size_differs(target, target.file_size(final), end):
            why = f"its size is not {end} bytes"
        for c in chunks if why is None else ():
            if checksum(read_range(final, c.pos, c.length)) != c.checksum:
                why = (f"the chunk with offsets [{c.base}, {c.base + c.records}) does not match "
                       f"its checksum at byte {c.pos}")
                break
    except (OSError, CorruptSegment) as e:
        why = str(e)
    if why is not None:
        log.debug("topic %s: the old copy %s is not adopted: %s", topic.name, final, why)
        return False
    crash_point("move.verified")
    crash_point("move.linked")
    return True



def chunk_record(r: np.void, p: int, seq: int, tier: int, pos: int) -> ChunkRecord:
    return ChunkRecord(p, seq, tier, pos, int(r["length"]), int(r["base"]), int(r["records"]),
                       int(r["checksum"]), None if r["tmin"] == NO_TIME else int(r["tmin"]),
                       None if r["tmax"] == NO_TIME else int(r["tmax"]), st=parsed(r["st"]))


__all__ = ["BLOCK", "adopt_local", "adopt_remote", "chunk_record", "layout"]
