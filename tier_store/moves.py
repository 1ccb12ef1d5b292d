"""Moving sealed segments between tiers: copy, verify, commit, delete after a grace period.

A move of one segment, or a merge of adjacent sealed segments of one partition into one:

1. **Plan** against the refreshed state: the sources exist, are sealed (never a partition's
   active segment), belong to one partition and are adjacent in its offset order, and the
   target tier has room.
2. **Copy** the committed chunks, in offset order, into a temporary file on the target tier
   (on a pmem tier, a pool file): holes left by uncommitted chunks are dropped, so a merged
   segment holds only what the log references. The new file is flushed and its header says
   sealed.
3. **Verify** every chunk's checksum at its new position.
4. **Commit** one ``move`` entry (optimistic: it conflicts with any entry touching a source
   segment since the plan; then the copy is discarded and the move retried against the new
   state). The temporary file gets the segment's name on the target tier first; until the
   entry is published nothing references it.
5. The old files become tombstones, **deleted after** ``log.cleanup.grace.ms`` by garbage
   collection, so a reader that planned against the old location finishes.

The copy's mtime is kept fresh (touched while copying and right before its name is claimed):
garbage collection, and another service moving the same segment, release an unreferenced file
only once it is untouched for the grace period, so a live move's copy is never taken from it.

A crash at any step loses nothing: before the commit, the log still names the old files (the
copy is an unreferenced file that garbage collection reclaims); after it, the new ones.

**Re-adoption.** A segment that moves back to a tier it lived on while its old file there is
still in its grace period (demoted, promoted, demoted again) finds that file under its name.
(On a pool tier an old file no reader pins is released at once instead, so this serves file
and remote tiers.)
Moves lay a segment out deterministically (:func:`_layout`: the header, then the committed
chunks in offset order, each at the next aligned position), and a sealed segment's chunks
never change, so when the old file is laid out exactly as the copy would be, the move adopts
it instead of copying: it takes the file's exclusive ``flock`` (as a copy's lock: garbage
collection and other services release no locked file), checks that the name still leads to
it, that its header names the segment and ends where the layout does, that its size is the
one a copy would have, and every chunk's checksum at its position in the layout; then seals
the header if needed, touches and syncs the file, and publishes the same ``move`` entry a copy
would (same conflict rules and relocation checks). Its bytes at those positions are the bytes
a reader that planned against the old file reads, so no grace period is needed. Anything
different, and the move goes on as without it (the old file waits for its grace period). Until
the entry is published the file is as unreferenced as before, so a crash changes nothing
garbage collection relies on; a lost race leaves it in place. On a remote tier the same checks
run by ranged reads under the partition's remote-name lock (the file is not touched there).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import mmap
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from .chunk import checksum
from .crash import crash_point
from .entries import ChunkRecord, MoveEntry
from .errors import CommitConflict, CorruptSegment, DataLoss, PafkaError, StoreFull
from .garbage import release_file
from .layout import REMOTE_LOCK, TMP_PREFIX, fsync_dir, makedirs_durable, segment_id
from .reading import MAPS, read_range
from .segment import HEADER_SIZE, SEALED_OFFSET, WORD, SegmentHeader, align
from .state import NO_TIME, SegmentState, TopicState
from .tiers import Tier
from .tiers.pmem import PmemSegmentWriter
from .topic import is_settled

if TYPE_CHECKING:
    from .topic import Topic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveResult:
    """What one move did."""

    topic: str
    segment: str  # id of the resulting segment
    sources: tuple[str, ...]
    partition: int
    from_tiers: tuple[int, ...]
    to_tier: int
    bytes: int
    records: int
    seconds: float
    # True when the move adopted the segment's old file on the target tier (laid out as the
    # copy would be, verified) instead of copying.
    adopted: bool = False


class OldCopyInGrace(CommitConflict):
    """A move is refused because the segment's old file on the target tier (left when it
    moved away) is in its grace period and could not be re-adopted: it goes, and the move can
    be made, once ``log.cleanup.grace.ms`` has passed."""


def _sources(st: TopicState, topic: Topic, ids: Sequence[str]) -> list[SegmentState]:
    segs = []
    for sid in ids:
        seg = st.segments.get(sid)
        if seg is None:
            raise PafkaError(f"topic {topic.name!r} has no committed segment {sid!r}")
        segs.append(seg)
    parts = {s.partition for s in segs}
    if len(parts) != 1:
        raise PafkaError(f"segments {list(ids)} of topic {topic.name!r} belong to several "
                         f"partitions {sorted(parts)}: only one partition's segments merge")
    p = segs[0].partition
    order = [s.seq for s in st.partition_segments(p)]
    seqs = sorted(s.seq for s in segs)
    at = order.index(seqs[0])
    if order[at:at + len(seqs)] != seqs:
        raise PafkaError(f"segments {list(ids)} of topic {topic.name!r} are not adjacent in "
                         f"partition {p}")
    active = topic.active_segment(p)
    for s in segs:
        if (s.seq, s.tier) == active and not _header_sealed(topic, s) or \
                (active is None and s.seq == max(order)):
            raise PafkaError(f"segment {s.id} of topic {topic.name!r} is the active segment of "
                             f"partition {p}: only sealed segments move")
    return sorted(segs, key=lambda s: s.seq)


def _header_sealed(topic: Topic, seg: SegmentState) -> bool:
    tier = topic.store.tier(seg.tier)
    hdr = tier.read_header(tier.segment_path(topic.name, seg.partition, seg.seq))
    return hdr is not None and hdr.sealed


def _rows(st: TopicState, segs: list[SegmentState]) -> np.ndarray:
    rows = st.chunks[segs[0].partition].rows()
    return rows[np.isin(rows["seq"], [s.seq for s in segs])]


def move_segment(topic: Topic, segment_ids: Sequence[str], tier_number: int,
                 throttle: Callable[[int], None] | None = None,
                 attempts: int = 5) -> MoveResult:
    """Move (and merge) sealed segments of ``topic`` to tier ``tier_number``."""
    store = topic.store
    target = store.tier(tier_number)
    # Before any file there is written or freed: a remote tier may be another store's.
    store.claim_remote(target)
    for _ in range(attempts):
        t0 = time.perf_counter()
        # refresh() applies new entries to the state's own SegmentState objects, in place,
        # and another thread may refresh this handle at any time: plan under the handle's
        # lock, from copies, and keep what the plan saw as plain values so that the publish
        # below sees a chunk committed to a source segment meanwhile (a conflict).
        with topic._lock:
            st = topic.state()
            segs = [dataclasses.replace(s) for s in _sources(st, topic, segment_ids)]
            version = st.version
            planned = {s.id: (s.tier, s.chunks, s.bytes) for s in segs}
            rows = _rows(st, segs)
            p, seq = segs[0].partition, segs[0].seq
            tomb = st.tombstone(segment_id(p, seq), tier_number)
        if len(segs) == 1 and segs[0].tier == tier_number:
            raise PafkaError(f"segment {segs[0].id} of topic {topic.name!r} is already on "
                             f"tier {tier_number}")
        grace_s = topic._setting("log.cleanup.grace.ms") / 1000.0
        for s in segs:
            src = store.tier(s.tier)
            path = src.segment_path(topic.name, s.partition, s.seq)
            span = int(sum(align(int(n)) for n in rows["len"][rows["seq"] == s.seq]))
            if src.local and not is_settled(path, src.read_header(path), span, grace_s,
                                            time.time()):
                raise PafkaError(f"segment {s.id} of topic {topic.name!r} holds chunks written "
                                 "but not committed yet: it moves once they are committed or "
                                 "older than log.cleanup.grace.ms")
        final = target.segment_path(topic.name, p, seq)
        need = HEADER_SIZE + sum(align(int(n)) for n in rows["len"])
        if final in (store.tier(s.tier).segment_path(topic.name, p, s.seq) for s in segs):
            raise PafkaError("a merge onto the tier a source segment is on is not supported")
        names = contextlib.ExitStack()
        if not target.local:
            # No flock on an object store: the partition's remote-name lock keeps garbage
            # collection from deleting this name from before the old copy is released until
            # the entry naming the new one is published (and two services from uploading it
            # at once).
            names.enter_context(store.partition_lock(topic.name, p, kind=REMOTE_LOCK))
            # Another service may have moved these segments while we waited: its upload
            # holds the name now, and the old copy's tombstone read at planning is stale.
            with topic._lock:
                fresh = topic.state()
                changed = [sid for sid, was in planned.items()
                           if (s := fresh.segments.get(sid)) is None
                           or (s.tier, s.chunks, s.bytes) != was]
                tomb = fresh.tombstone(segment_id(p, seq), tier_number)
            if changed:
                names.close()
                raise CommitConflict(f"topic {topic.name!r}: segment {changed[0]} changed "
                                     "since the move was planned")
        with names:
            lock = -1  # holds our copy's flock until the entry is published (or discarded)
            adopted = False
            if target.exists(final):
                try:
                    _release_old_copy(topic, target, segment_id(p, seq), final, tomb,
                                      tier_number, grace_s)
                except CommitConflict:
                    # The old file stays: adopt it if it is laid out as our copy would be.
                    if len(segs) != 1:
                        raise
                    chunks, end = _layout(rows, p, seq, tier_number)
                    if target.local:
                        lock = _adopt_local(topic, target, final, p, seq, chunks, end)
                        adopted = lock >= 0
                    else:
                        adopted = _adopt_remote(topic, target, final, p, seq, chunks, end)
                    if not adopted and target.exists(final):
                        raise
                    # (Released by garbage collection meanwhile: the name is free, copy.)
            if not adopted and target.local:
                chunks, lock = _place_local(topic, target, segs, rows, st, need, throttle, final)
            elif not adopted:
                chunks = _upload(topic, target, segs, rows, throttle, final)
            entry = MoveEntry(0, p, tuple(s.seq for s in segs), seq, tier_number, tuple(chunks))

            def make(state: TopicState, entry: MoveEntry = entry, version: int = version,
                     planned: dict[str, tuple[int, int, int]] = planned) -> MoveEntry | None:
                if state.version != version:
                    # Conflict rule: a move conflicts with any entry that touched its segments.
                    for sid, was in planned.items():
                        s = state.segments.get(sid)
                        if s is None or (s.tier, s.chunks, s.bytes) != was:
                            raise CommitConflict(f"topic {topic.name!r}: segment {sid} changed "
                                                 "since the move was planned")
                return MoveEntry(max(state.last_ts, int(time.time() * 1000)), entry.p,
                                 entry.sources, entry.seq, entry.tier, entry.chunks)

            try:
                # The copy is written under this handle's view of the target tier and read
                # from its view of the sources' tiers: refused if any was relocated since.
                used = {tier_number, *(s.tier for s in segs)}
                topic._publish_retrying(make, tiers={(n, store.relocation(n)) for n in used})
            except CommitConflict as e:
                log.info("topic %s: move of %s lost a race (%s); retrying", topic.name,
                         [s.id for s in segs], e)
                now = topic.state().segments.get(segment_id(p, seq))
                # An adopted file stays what it was: the old copy, left to its grace period.
                if lock >= 0 and not adopted and (now is None or now.tier != tier_number):
                    _discard_own(target, final, lock)
                continue
            finally:
                if lock >= 0:
                    os.close(lock)
        crash_point("move.committed")
        # Our reads of the sources pinned their files: unpin, so they can be released.
        MAPS.drop({store.tier(s.tier).segment_path(topic.name, p, s.seq) for s in segs})
        result = MoveResult(topic.name, segment_id(p, seq), tuple(s.id for s in segs), p,
                            tuple(s.tier for s in segs), tier_number, int(rows["len"].sum()),
                            int(rows["n"].sum()), time.perf_counter() - t0, adopted)
        log.info("moved %s/%s (%s) from tier %s to tier %d: %d bytes, %d records in %.3f s%s",
                 topic.name, result.segment, ", ".join(result.sources),
                 "/".join(map(str, result.from_tiers)), tier_number, result.bytes,
                 result.records, result.seconds,
                 " (re-adopted its old file there, nothing copied)" if adopted else "")
        return result
    raise CommitConflict(f"topic {topic.name!r}: gave up moving {list(segment_ids)} after "
                         f"{attempts} lost races")


def _release_old_copy(topic: Topic, target: Tier, seg_id: str, final: str,
                      tomb: list[int] | None, tier_number: int, grace_s: float) -> None:
    """Free the name ``final``, held by the segment's old file on the target tier (it lived
    there before and waits for garbage collection), or raise :class:`CommitConflict`.

    Only that old file goes: unlocked, unreferenced by the state read once its lock is ours,
    and its tombstone and its own mtime both older than the grace period. Anything else is
    another service's copy, linked a moment ago and about to be (or just) committed."""
    now = time.time()
    moved_away = tomb is not None and tomb[0] == tier_number
    since = tomb[1] / 1000.0 if tomb is not None and moved_away else now
    # On a pool tier readers pin what they map: the old file goes once no pin is left.
    pinned = target.pinned_by_readers and moved_away
    if moved_away and not pinned and now - since <= grace_s:
        raise OldCopyInGrace(f"topic {topic.name!r}: {final} still exists (the segment's old "
                             "copy there is in its grace period, log.cleanup.grace.ms); try "
                             "later")
    if pinned or now - since > grace_s:
        if not target.local:
            target.release_segment(final)
            return

        def old(s: os.stat_result) -> bool:
            seg = topic.state().segments.get(seg_id)
            return (seg is None or seg.tier != tier_number) and \
                (pinned or now - max(s.st_mtime, since) > grace_s)

        if release_file(target, final, old):
            return
    raise CommitConflict(f"topic {topic.name!r}: {final} still exists (a move of the segment "
                         "is under way, or its old copy is in its grace period); try later")


def _layout(rows: np.ndarray, p: int, seq: int, tier: int) -> tuple[list[ChunkRecord], int]:
    """Where a move puts the committed chunks ``rows`` (in offset order) in segment ``seq``'s
    file on ``tier``: after the header, each at the next aligned position. Returns the chunks
    at their positions and the file's end. The one layout of every copy and upload, so that
    an old file of the segment laid out by it can be adopted (:func:`_adopt_local`)."""
    chunks: list[ChunkRecord] = []
    pos = HEADER_SIZE
    for r in rows:
        pos = align(pos)
        chunks.append(_record(r, p, seq, tier, pos))
        pos += int(r["len"])
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


def _adopt_local(topic: Topic, target: Tier, final: str, p: int, seq: int,
                 chunks: list[ChunkRecord], end: int) -> int:
    """Adopt the file at ``final`` (the segment's old file on the local tier ``target``) as
    the move's result if it is laid out as :func:`_layout` says, ``chunks`` and ``end``: return
    the descriptor holding its exclusive ``flock`` (as :func:`_lock_copy` returns a copy's; the
    caller closes it once the entry is published), or -1 to copy instead.

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
            with memoryview(m)[c.pos:c.pos + c.len] as view:
                if checksum(view) != c.crc:
                    return (f"the chunk with offsets [{c.base}, {c.base + c.n}) does not "
                            f"match its checksum at byte {c.pos}")
    finally:
        m.close()
    return None


def _adopt_remote(topic: Topic, target: Tier, final: str, p: int, seq: int,
                  chunks: list[ChunkRecord], end: int) -> bool:
    """Whether the object at ``final`` on the remote tier ``target`` (the segment's old copy)
    is laid out as :func:`_layout` says and sealed, checked by ranged reads: then the move
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
            if checksum(read_range(final, c.pos, c.len)) != c.crc:
                why = (f"the chunk with offsets [{c.base}, {c.base + c.n}) does not match "
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


def _place_local(topic: Topic, target: Tier, segs: list[SegmentState], rows: np.ndarray,
                 st: TopicState, need: int, throttle: Callable[[int], None] | None, final: str
                 ) -> tuple[list[ChunkRecord], int]:
    """Copy into a temporary file on a local tier, verify, and claim the final name; return
    the chunks and the descriptor holding the copy's lock (the caller closes it once the
    ``move`` entry is published or the copy discarded)."""
    tmp, chunks, lock = _copy(topic, target, segs, rows, st, need, throttle)
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
    except BaseException:
        _discard(target, tmp)
        os.close(lock)
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


def _discard_own(target: Tier, final: str, lock: int) -> None:
    """Release ``final`` if it still is our copy (the file ``lock`` holds): a move that lost
    its publish race; the name was claimed by our link."""
    held = os.fstat(lock)
    try:
        named = os.stat(final)
    except FileNotFoundError:
        return
    if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
        _discard(target, final)


def _upload(topic: Topic, target: Tier, segs: list[SegmentState], rows: np.ndarray,
            throttle: Callable[[int], None] | None, final: str) -> list[ChunkRecord]:
    """Write the segment whole to a remote tier, then read it back to verify."""
    store = topic.store
    p, seq = segs[0].partition, segs[0].seq
    tiers = {s.seq: s.tier for s in segs}
    out = pa.BufferOutputStream()
    out.write(b"\0" * HEADER_SIZE)
    chunks, end = _layout(rows, p, seq, target.number)
    pos = HEADER_SIZE
    for r, c in zip(rows, chunks, strict=True):
        src = store.tier(tiers[int(r["seq"])]).segment_path(topic.name, p, int(r["seq"]))
        buf = _read_source(topic, p, int(r["seq"]), src, int(r["pos"]), c.len)
        if c.pos > pos:
            out.write(b"\0" * (c.pos - pos))
        out.write(buf)
        pos = c.pos + c.len
        if throttle is not None:
            throttle(c.len)
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
        for c in chunks:
            if checksum(read_range(final, c.pos, c.len)) != c.crc:
                raise CorruptSegment(f"{final}: chunk with offsets [{c.base}, {c.base + c.n}) "
                                     "does not match its checksum after upload; move abandoned")
        crash_point("move.verified")
    except BaseException:
        target.release_segment(final)
        raise
    return chunks


def _record(r: np.void, p: int, seq: int, tier: int, pos: int) -> ChunkRecord:
    return ChunkRecord(p, seq, tier, pos, int(r["len"]), int(r["base"]), int(r["n"]),
                       int(r["crc"]), None if r["tmin"] == NO_TIME else int(r["tmin"]),
                       None if r["tmax"] == NO_TIME else int(r["tmax"]))


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
          st: TopicState, need: int, throttle: Callable[[int], None] | None
          ) -> tuple[str, list[ChunkRecord], int]:
    """Copy the committed chunks into a temporary file on ``target``; return it, the chunks
    at their new positions, and the descriptor holding the copy's lock (see
    :func:`_lock_copy`; the caller closes it)."""
    store = topic.store
    p = segs[0].partition
    d = os.path.dirname(target.segment_path(topic.name, p, segs[0].seq))
    makedirs_durable(d)  # <tier>/<topic>/<p> and their entries in their parents
    tmp = os.path.join(d, f"{TMP_PREFIX}move-{os.getpid()}-{os.urandom(4).hex()}")
    tiers = {s.seq: s.tier for s in segs}
    # Touch the copy at least this often: garbage collection reclaims a temporary file
    # untouched for the grace period (and unlocked: a live move's copy ages only if the
    # move stalls that long with its lock lost, which the touch then reports).
    touch_every = min(1.0, topic._setting("log.cleanup.grace.ms") / 4000.0)
    writer: PmemSegmentWriter | None = None
    fd = -1
    if target.has_pool:
        if need > target.segment_bytes:
            raise StoreFull(f"merged segment of {need} bytes does not fit a pool file of "
                            f"{target.segment_bytes} bytes on tier {target.number}")
        writer = target.take_pool_file(tmp)
        if writer is None:
            raise StoreFull(f"tier {target.number} ({target.path}) has no free pool file")
    else:
        used = store.used_bytes().get(target.number, 0)
        if target.capacity > 0 and used + need > target.capacity:
            raise StoreFull(f"tier {target.number} ({target.path}): {used} of "
                            f"{target.capacity} bytes used, {need} more do not fit")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    chunks, end = _layout(rows, p, segs[0].seq, target.number)
    lock = -1
    try:
        # Before the first byte is written: a pool file keeps the mtime of its last use, and
        # garbage collection may have taken it back to the pool before we locked it.
        lock = _lock_copy(topic, tmp)
        touched = time.monotonic()
        if writer is not None:
            mapping = writer._map
            mapping.populate(0, need)
            out = mapping.buffer(0, mapping.length)
        for r, c in zip(rows, chunks, strict=True):
            if time.monotonic() - touched >= touch_every:
                _touch(topic, tmp)
                touched = time.monotonic()
            seq, pos, length = int(r["seq"]), c.pos, c.len
            src = store.tier(tiers[seq]).segment_path(topic.name, p, seq)
            buf = _read_source(topic, p, seq, src, int(r["pos"]), length)
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
        _close_copy(writer, fd)
        _discard(target, tmp)
        if lock >= 0:
            os.close(lock)
        raise
    _close_copy(writer, fd)
    return tmp, chunks, lock


def _close_copy(writer: PmemSegmentWriter | None, fd: int) -> None:
    if writer is not None:
        writer.close()
    else:
        os.close(fd)


def _lock_copy(topic: Topic, tmp: str) -> int:
    """Take the ``flock`` that marks ``tmp`` as a live move's copy and make its mtime fresh;
    return the descriptor that holds it. Garbage collection and other services never release
    a locked file (:func:`~tier_store.garbage.release_file`), so the lock is held until the
    ``move`` entry is published or the copy discarded; the kernel drops it if we die."""
    try:
        fd = os.open(tmp, os.O_RDONLY)
    except FileNotFoundError:  # reclaimed between its creation and here
        raise PafkaError(f"topic {topic.name!r}: the temporary copy {tmp} of a move was "
                         "reclaimed by garbage collection before it was locked; move "
                         "abandoned") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = os.fstat(fd)
        try:
            named = os.stat(tmp)
        except FileNotFoundError:
            named = None
        if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            raise PafkaError(f"topic {topic.name!r}: the temporary copy {tmp} of a move was "
                             "reclaimed by garbage collection before it was locked; move "
                             "abandoned")
        _touch(topic, tmp)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _verify(path: str, chunks: list[ChunkRecord]) -> None:
    with pa.memory_map(path, "r") as mm:
        buf = mm.read_buffer()
        for c in chunks:
            if checksum(buf.slice(c.pos, c.len)) != c.crc:
                raise CorruptSegment(f"{path}: chunk with offsets [{c.base}, {c.base + c.n}) "
                                     "does not match its checksum after copying; move abandoned")


def seal_idle(topic: Topic, idle_ms: int, now_ms: int | None = None) -> list[str]:
    """Seal active segments whose newest commit is older than ``idle_ms`` so that quiet
    topics migrate too; returns the ids sealed. Under the partition's lock."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    st = topic.state()
    sealed = []
    for p in range(st.partitions):
        active = topic.active_segment(p)
        if active is None:
            continue
        seq, tier_no = active
        seg = st.segments.get(segment_id(p, seq))
        if seg is None or seg.tier != tier_no or now - seg.last_ts < idle_ms:
            continue
        with topic.store.partition_lock(topic.name, p, blocking=False) as held:
            if not held or topic.active_segment(p) != active:
                continue
            tier = topic.store.tier(tier_no)
            path = tier.segment_path(topic.name, p, seq)
            try:
                w = tier.open_segment(path)
            except OSError as e:
                # Gone with a tier on RAM (reboot): reads of it fail, the rest still migrates.
                log.warning("topic %s: active segment %s of partition %d (%s) cannot be "
                            "opened, not sealed: %s", topic.name, seg.id, p, path, e)
                continue
            try:
                if not w.header().sealed:
                    w.seal()
                    sealed.append(seg.id)
            finally:
                w.close()
            # Appends that come later start the next segment (they find this one sealed).
    return sealed


__all__ = ["MoveResult", "OldCopyInGrace", "move_segment", "seal_idle"]
