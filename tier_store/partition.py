"""One partition's log as one topic handle writes it: the active pointer, the open segment
writer, rolling and sealing, appending and syncing.

Kafka keeps one object per partition that owns its segments (``LocalLog``); here the
commit log owns which segments are committed, and :class:`PartitionLog` owns what only a
writer sees: which segment is active, its open writer, and when to roll to the next.

Contract:

* **One writer at a time.** Every append, roll and seal runs under the partition's lock
  (:meth:`PartitionLog.locked`), which orders threads and processes.
* **A chunk is durable before ``end`` advances past it**: a durable append flushes the
  chunk, then the header's ``end``; a deferred one leaves both to :meth:`PartitionLog.sync`.
* **The pointer is durable before any commit names the segment.** A roll writes the
  partition's pointer (``<p>.active``) atomically; a durable append makes it durable before
  returning, a deferred one in :meth:`PartitionLog.sync`, which a writer calls before
  handing its chunks to the committer. After a crash an older pointer would lead the next
  writer to create the segment again, empty, under chunks a commit names.
* **Segment numbers only grow**: a new segment follows the highest number the log has used
  (committed or tombstoned), so it never takes the name of one a commit names.
* **Never below the committed end.** The header's ``end`` says where the next chunk goes,
  but the commit log says what is acknowledged. Before every append the writer reads where
  the segment's last committed chunk ends (:meth:`TopicLog.committed_extent`, a probe of the
  next version) and the end it last wrote itself. A header ``end`` above both is legal
  (chunks of other writers not committed yet, or a hole a crash left) and is appended after.
  Below either, the header is damaged: nothing is written there; ``end`` is restored to the
  committed end (readers, moves and checks see a truthful header), the segment is sealed,
  the error logged naming the file, and the append goes to a new segment. A header that is
  not a segment's (bad magic or version) is left untouched and rolled away from. Chunks
  written but not committed are known only to the header: a commit refuses one whose place
  the header no longer covers (:class:`~tier_store.conflicts.ChunkWithinEnd`).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .chunk import EncodedChunk
from .crash import crash_point
from .errors import CorruptSegment, CorruptState, StoreFull
from .flusher import Flusher
from .layout import (
    fsync_dir,
    fsync_file,
    open_regular,
    parse_segment_id,
    segment_id,
    write_atomic,
)
from .segment import HEADER_SIZE, SegmentHeader, align
from .tiers import NO_SPACE, SegmentWriter, Tier

if TYPE_CHECKING:
    from .host import TopicHost
    from .topic_log import TopicLog

log = logging.getLogger(__name__)


class PartitionLog:
    """Partition ``number`` of topic ``topic``, for one handle's writes (see the module
    docstring for the contract)."""

    def __init__(self, topic: str, number: int, host: TopicHost,
                 setting: Callable[[str], Any], log: TopicLog, flusher: Flusher):
        self.topic = topic
        self.number = number
        self.host = host
        self._setting = setting
        self._state = log.refresh
        self._log = log
        self._flusher = flusher
        self.pointer_dir = host.pointer_dir(topic, log.current.topic_id)
        self._pointer = os.path.join(self.pointer_dir, f"{number}.active")
        self._writer: tuple[tuple[int, int], SegmentWriter] | None = None
        self._flags = threading.Lock()
        self._deferred = False  # chunks written with durable=False and not synced since
        # The pointer this handle relies on is not known durable: it rolled with
        # durable=False, or appends to a segment another handle rolled to.
        self._pointer_unsynced = False
        # (partition, seq, tier) -> where its last committed chunk ends, read fresh.
        self._extent = log.committed_extent
        self._wrote: tuple[tuple[int, int], int] | None = None  # (segment, end) set last

    def __repr__(self) -> str:
        return f"PartitionLog({self.topic!r}, {self.number})"

    @property
    def writer(self) -> SegmentWriter | None:
        """The open writer of the active segment, if this handle has one."""
        return None if self._writer is None else self._writer[1]

    def locked(self, blocking: bool = True) -> AbstractContextManager[bool]:
        """The partition's lock (threads and processes); yields whether it is held."""
        return self.host.partition_lock(self.topic, self.number, blocking)

    def should_roll(self, hdr: SegmentHeader, need: int, capacity: int, now_ms: int) -> bool:
        """Whether the next chunk (``need`` bytes) goes to a new segment: the active one is
        sealed, older than ``log.segment.ms`` and not empty, or has no room for it (as
        Kafka's ``LogSegment.shouldRoll``)."""
        aged = hdr.end > HEADER_SIZE and now_ms - hdr.created_ms > self._setting(
            "log.segment.ms")
        return hdr.sealed or aged or align(hdr.end) + need > capacity

    def active_segment(self) -> tuple[int, int] | None:
        """(sequence, tier) named by the partition's pointer; None if it has none."""
        return read_pointer(self._pointer, self.topic, self.number)

    # -- appending ------------------------------------------------------------------------
    def append(self, chunk: EncodedChunk, durable: bool, now_ms: int,
               check: Callable[[], None]) -> tuple[int, Tier, int, int]:
        """Write ``chunk`` to the active segment, rolling first if :meth:`should_roll`;
        ``check`` runs first under the lock (the topic still is the one this handle
        opened). Returns (segment sequence, tier, position, checksum)."""
        with self.locked():
            check()
            seq, tier, w = self._active_writer(chunk.size, durable)
            hdr = self._checked_header(seq, tier, w)
            if hdr is not None and self.host.shared is not None and self._moved(seq, tier):
                hdr = None  # compacted to the shared tier: appends there would be refused
            if hdr is None or self.should_roll(hdr, chunk.size, w.capacity(), now_ms):
                # A segment whose header must not be trusted is not sealed by the roll.
                seq, tier, w = self._roll(seq, w if hdr else None, chunk.size, durable)
                hdr = w.header()
            pos = align(hdr.end)
            tiers = len(self.host.tiers)
            for attempt in range(tiers + 1):
                try:
                    crc = w.write_chunk(pos, chunk)
                    w.set_end(pos + chunk.size, durable)
                    self._wrote = ((seq, tier.number), pos + chunk.size)
                    break
                except OSError as e:
                    if e.errno not in NO_SPACE:
                        raise
                    if attempt == tiers:
                        raise StoreFull(f"topic {self.topic!r} partition {self.number}: every "
                                        f"local tier answered {os.strerror(e.errno)} for a "
                                        f"chunk of {chunk.size} bytes; free space or run the "
                                        "migration service") from e
                    # The tier's filesystem is full (until space returns): the chunk goes to
                    # a new segment on the next local tier with room (StoreFull if none).
                    self.host.mark_out_of_space(tier, e)
                    seq, tier, w = self._roll(seq, w, chunk.size, durable)
                    pos = align(w.header().end)
            if durable:
                self._sync_pointer(with_dir=True)
            else:
                with self._flags:
                    self._deferred = True
        return seq, tier, pos, crc

    def _checked_header(self, seq: int, tier: Tier, w: SegmentWriter) -> SegmentHeader | None:
        """The active segment's header, checked against the commit log and this handle's
        last write (see the module docstring); None when it must not be written to: not a
        segment's header, or damaged (then restored from the log and sealed here)."""
        try:
            hdr = w.header()
        except CorruptSegment as e:
            log.error("topic %s partition %d: active segment %s: %s; nothing is written to it, "
                      "appends go to a new segment", self.topic, self.number, w.path, e)
            return None
        committed = max(self._extent(self.number, seq, tier.number), HEADER_SIZE)
        own = self._wrote[1] if self._wrote and self._wrote[0] == (seq, tier.number) else 0
        if hdr.end >= max(committed, own):
            return hdr
        log.error("topic %s partition %d: the header of active segment %s says it ends at "
                  "byte %d, below %s at byte %d: the header is damaged. Nothing is written to "
                  "it; its end is restored to byte %d, it is sealed, and appends go to a new "
                  "segment", self.topic, self.number, w.path, hdr.end,
                  "the end of its last committed chunk" if committed >= own else
                  "the end of a chunk this handle wrote", max(committed, own),
                  max(hdr.end, committed))
        if hdr.end < committed:
            w.set_end(committed, durable=True)
        w.seal(durable=True)
        return None

    def _moved(self, seq: int, tier: Tier) -> bool:
        """Whether the log has segment ``seq`` on another tier than ``tier`` (moved), as
        the header check just read it."""
        seg = self._log.current.part(self.number).segments.get(seq)
        return seg is not None and seg.tier != tier.number

    def sync(self) -> bool:
        """Make durable what deferred appends wrote here, and the pointer; True if the
        pointer was synced (the caller then syncs :attr:`pointer_dir`, once for all)."""
        with self._flags:
            if not self._deferred:
                return False
            self._deferred = False
        with self.locked():
            if self._writer is not None:
                self._writer[1].sync()
            return self._sync_pointer(with_dir=False)

    def seal_idle(self, active: tuple[int, int]) -> bool:
        """Seal segment ``active`` ((sequence, tier)) if it still is the active one and the
        partition is not being written to; True if this sealed it. Appends that come later
        find it sealed and start the next segment (:meth:`should_roll`)."""
        with self.locked(blocking=False) as held:
            if not held or self.active_segment() != active:
                return False
            seq, tier_no = active
            tier = self.host.tier(tier_no)
            path = tier.segment_path(self.topic, self.number, seq)
            try:
                w = tier.open_segment(path)
            except OSError as e:
                # Gone with a tier on RAM (reboot): reads of it fail, the rest still migrates.
                log.warning("topic %s: active segment %s of partition %d (%s) cannot be "
                            "opened, not sealed: %s", self.topic, segment_id(self.number, seq),
                            self.number, path, e)
                return False
            try:
                if w.header().sealed:
                    return False
                w.seal()
                return True
            finally:
                w.close()

    def close(self) -> None:
        """Flush and release the open writer."""
        if self._writer is not None:
            self._writer[1].close()
            self._writer = None

    # -- the active segment -------------------------------------------------------------
    def _sync_pointer(self, with_dir: bool) -> bool:
        with self._flags:
            if not self._pointer_unsynced:
                return False
            self._pointer_unsynced = False
        try:
            fsync_file(self._pointer)
            if with_dir:
                fsync_dir(self.pointer_dir)
        except BaseException:
            with self._flags:
                self._pointer_unsynced = True
            raise
        return True

    def _last_seq(self) -> int | None:
        """The highest segment number the partition is known to have used (on a shared
        store, of those in this host's range: the next is this host's too)."""
        st = self._state()
        seqs = list(st.part(self.number).segments)
        for key in st.tombstones:
            p, seq = parse_segment_id(key.split("@")[0])
            if p == self.number:
                seqs.append(seq)
        shared = self.host.shared
        if shared is None:
            return max(seqs, default=None)
        mine = shared.seqs
        return max((q for q in seqs if q in mine), default=mine.start - 1)

    def _active_writer(self, need: int, durable: bool) -> tuple[int, Tier, SegmentWriter]:
        ptr = self.active_segment()
        if ptr is None:
            return self._roll(self._last_seq(), None, need, durable)
        seq, tier_no = ptr
        shared = self.host.shared
        if shared is not None and seq not in shared.seqs:
            # Another host's number (a tier 1 copied from there): never append to its segment.
            log.warning("topic %s partition %d: active pointer %s names segment %s, not one "
                        "of this host's; the next append starts a new segment", self.topic,
                        self.number, self._pointer, segment_id(self.number, seq))
            return self._roll(self._last_seq(), None, need, durable)
        tier = self.host.tier(tier_no)
        held = self._writer  # kept unless its file left its directory (removed by hand)
        if held is not None and held[0] == ptr and not held[1].unlinked():
            return seq, tier, held[1]
        if held is not None:
            self._retire(held[1], durable)
            self._writer = None
        try:
            w = tier.open_segment(tier.segment_path(self.topic, self.number, seq))
        except FileNotFoundError:
            # The active segment's file is gone (tier 1 on RAM after a reboot, or removed by
            # hand): start the next segment; readers report what was lost as DataLoss.
            log.warning("topic %s partition %d: active segment %s is missing; rolling",
                        self.topic, self.number, segment_id(self.number, seq))
            return self._roll(max(seq, self._last_seq() or 0), None, need, durable)
        # Created by another handle, which may not have made it and the pointer durable yet.
        w.defer_entry(os.path.dirname(w.path))
        with self._flags:
            self._pointer_unsynced = True
        self._writer = (ptr, w)
        return seq, tier, w

    def _retire(self, w: SegmentWriter, durable: bool) -> None:
        """Close a writer that is no longer the active segment's; one rolled out by a
        deferred append is closed by the flusher (:meth:`sync` of the topic waits)."""
        if durable:
            w.close()
        else:
            self._flusher.submit(w)

    def _roll(self, seq: int | None, old: SegmentWriter | None, need: int,
              durable: bool) -> tuple[int, Tier, SegmentWriter]:
        """Seal the active segment and start the next one (under the partition's lock)."""
        if old is not None:
            try:
                old.seal(durable)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                # The pointer, not this flag, says which segment is active: the roll stands.
                log.warning("topic %s partition %d: sealing %s failed (%s); rolling anyway",
                            self.topic, self.number, old.path, e)
            crash_point("segment.roll.sealed")
        new_seq = 0 if seq is None else seq + 1
        tier, w = self.host.place_segment(self.topic, self.number, new_seq, need, durable)
        crash_point("segment.roll.created")
        # Deferred: the new segment's file and the pointer are made durable by sync(), before
        # any chunk in the segment can be committed.
        try:
            write_atomic(self._pointer,
                         json.dumps({"seq": new_seq, "tier": tier.number}).encode(), durable)
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            # The root's filesystem is full: the new segment is never named, so it goes.
            w.close()
            tier.release_segment(w.path)
            raise StoreFull(f"topic {self.topic!r} partition {self.number}: no space in "
                            f"{self.pointer_dir} for the active pointer: free some") from e
        with self._flags:
            self._pointer_unsynced = not durable
        if self._writer is not None:
            self._retire(self._writer[1], durable)
        self._writer = ((new_seq, tier.number), w)
        log.debug("topic %s partition %d: rolled to segment %s on tier %d", self.topic,
                  self.number, segment_id(self.number, new_seq), tier.number)
        return new_seq, tier, w


def read_pointer(path: str, topic: str, number: int) -> tuple[int, int] | None:
    """(sequence, tier) named by partition ``number``'s pointer file ``path``; None if there
    is none, or it cannot be trusted (logged: the next append starts a new segment).
    :class:`CorruptState` naming it if it is not a file (a directory, a FIFO, a device)."""
    try:
        # A directory there would stop the next roll (its rename), a FIFO's read would
        # never end: CorruptState naming it, not "no pointer".
        fd = open_regular(path, CorruptState,
                          f"topic {topic!r} partition {number}: active pointer", follow=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        # Never read through a link: the next roll replaces it (a rename, not a write
        # through it) with a pointer of its own.
        log.warning("topic %s partition %d: active pointer %s is a symbolic link, not "
                    "followed; the next append starts a new segment", topic,
                    number, path)
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read()
    try:
        ptr = json.loads(raw)
        seq, tier = ptr["seq"], ptr["tier"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62
                   for v in (seq, tier)):
            raise ValueError(f"seq and tier must be integers in [0, 2**62): {ptr!r}")
        return seq, tier
    except (ValueError, KeyError, TypeError):
        # A machine crash after a deferred roll can leave the renamed pointer empty. No
        # commit names that roll's segment (sync makes the pointer durable first).
        log.warning("topic %s partition %d: active pointer %s is unreadable (%r); "
                    "the next append starts a new segment", topic, number,
                    path, raw[:64])
        return None


def is_settled(path: str, hdr: SegmentHeader | None, committed_span: int, grace_s: float,
               now: float) -> bool:
    """Whether every chunk of a segment file is committed, or the rest is older than the grace
    period (abandoned). ``committed_span`` is the aligned length of its committed chunks.
    A damaged ``end`` misleads it safely: too low, a move copies the committed chunks and
    commits of the others are refused (the segment moved); too high, it waits the grace."""
    if hdr is None or align(hdr.end) - HEADER_SIZE <= committed_span:
        return True
    try:
        return now - os.stat(path).st_mtime > grace_s
    except FileNotFoundError:
        return True


__all__ = ["PartitionLog", "is_settled", "read_pointer"]
