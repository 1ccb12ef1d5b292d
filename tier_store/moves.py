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
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
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
from .segment import HEADER_SIZE, SegmentHeader, align
from .state import NO_TIME, SegmentState, TopicState
from .tiers import PmemTier, Tier
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
            if target.exists(final):
                _release_old_copy(topic, target, segment_id(p, seq), final, tomb, tier_number,
                                  grace_s)
            lock = -1  # holds our copy's flock until the entry is published (or discarded)
            if target.local:
                chunks, lock = _place_local(topic, target, segs, rows, st, need, throttle, final)
            else:
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
                if lock >= 0 and (now is None or now.tier != tier_number):
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
                            int(rows["n"].sum()), time.perf_counter() - t0)
        log.info("moved %s/%s (%s) from tier %s to tier %d: %d bytes, %d records in %.3f s",
                 topic.name, result.segment, ", ".join(result.sources),
                 "/".join(map(str, result.from_tiers)), tier_number, result.bytes,
                 result.records, result.seconds)
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
    chunks: list[ChunkRecord] = []
    pos = HEADER_SIZE
    for r in rows:
        length = int(r["len"])
        src = store.tier(tiers[int(r["seq"])]).segment_path(topic.name, p, int(r["seq"]))
        buf = _read_source(topic, p, int(r["seq"]), src, int(r["pos"]), length)
        if align(pos) > pos:
            out.write(b"\0" * (align(pos) - pos))
            pos = align(pos)
        out.write(buf)
        chunks.append(_record(r, p, seq, target.number, pos))
        pos += length
        if throttle is not None:
            throttle(length)
    data = out.getvalue()
    header = SegmentHeader(p, seq, pos, True, int(time.time() * 1000)).pack()
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
    if isinstance(tier, PmemTier):
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
    if isinstance(target, PmemTier):
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
    chunks: list[ChunkRecord] = []
    pos = HEADER_SIZE
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
        for r in rows:
            if time.monotonic() - touched >= touch_every:
                _touch(topic, tmp)
                touched = time.monotonic()
            seq, length = int(r["seq"]), int(r["len"])
            src = store.tier(tiers[seq]).segment_path(topic.name, p, seq)
            buf = _read_source(topic, p, seq, src, int(r["pos"]), length)
            pos = align(pos)
            if writer is not None:
                out[pos:pos + length] = memoryview(buf)
            else:
                view = memoryview(buf)
                half = length // 2
                os.pwrite(fd, view[:half], pos)
                crash_point("move.copy")
                os.pwrite(fd, view[half:], pos + half)
            chunks.append(_record(r, p, segs[0].seq, target.number, pos))
            pos += length
            if throttle is not None:
                throttle(length)
        header = SegmentHeader(p, segs[0].seq, pos, True, int(time.time() * 1000)).pack()
        if writer is not None:
            out[0:HEADER_SIZE] = header
            mapping.flush(0, pos)
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
    fd = os.open(tmp, os.O_RDONLY)
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


__all__ = ["MoveResult", "move_segment", "seal_idle"]
