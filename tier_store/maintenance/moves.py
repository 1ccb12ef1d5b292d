"""Moving sealed segments between tiers: copy, verify, commit, delete after a grace period.

A move of one segment, or a merge of adjacent sealed segments of one partition into one:

1. **Plan** against the refreshed state: the sources exist, are sealed (never a partition's
   active segment), belong to one partition and are adjacent in its offset order, and the
   target tier has room.
2. **Copy** (:mod:`.copy`) the committed chunks, in offset order, into a temporary file on
   the target tier (on a pmem tier, a pool file): holes left by uncommitted chunks are
   dropped, so a merged segment holds only what the log references. The new file is flushed
   and its header says sealed.
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

**Compaction**, on a store shared by many hosts (:mod:`tier_store.sharing`): a move of a
segment on some host's tier 1 to the shared tier. The writing host's pointer and header are
not visible here, so a source must be sealed as far as the log tells
(:func:`compactable_ids`), and its chunks are read from this host's own file only when the
segment is this host's, else from their bundles (:func:`.bundles.source_chunks`).

**Re-adoption** (:mod:`.adopt`): a segment going back to a tier where its old file is still
in its grace period takes that file back, when it is laid out exactly as a copy would be,
instead of copying; anything else and the move waits (:class:`OldCopyInGrace`).

DANGER: a move rewrites where a segment's records live, and frees the name of the
segment's old file on the target tier (:func:`_release_old_copy`). It never deletes a
source: the sources' files become tombstones, released by :mod:`.garbage` after
``log.cleanup.grace.ms`` (or, on a pool tier, once no reader pins them), so a reader that
planned against the old location finishes. An old copy is released only when it is
unlocked (no live move, no reader of a pool tier), unreferenced by the state read under
its lock, and both it and its tombstone are older than the grace period. The entry is
published only if its sources are unchanged since the plan
(:class:`~tier_store.conflicts.SegmentsUnchanged`) and no tier it touched was relocated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..conflicts import SegmentsUnchanged, planned
from ..crash import crash_point
from ..entries import ChunkRecord
from ..errors import CommitConflict, InvalidArgument, SegmentNotMovable
from ..ids import SEQ_SPAN
from ..layout import REMOTE_LOCK, segment_id
from ..partition import is_settled
from ..pins import MAPS
from ..segment import HEADER_SIZE, align
from ..state import SegmentState, TopicState
from .adopt import adopt_local, adopt_remote, layout
from .copy import discard_own, place_local, upload
from .demote import demote_and_publish
from .garbage import release_file

if TYPE_CHECKING:
    from ..tiers import Tier
    from ..topic import Topic

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


@dataclass(frozen=True)
class _Plan:
    """What a move planned from, as plain values: refresh() updates the state's own
    objects in place, and a chunk committed to a source meanwhile must show as a conflict."""

    segs: list[SegmentState]  # copies, in sequence order
    seen: SegmentsUnchanged
    rows: np.ndarray  # their committed chunks, in offset order
    tomb: list[int] | None  # the tombstone of the segment's old file on the target tier

    @property
    def partition(self) -> int:
        return self.segs[0].partition

    @property
    def seq(self) -> int:
        return self.segs[0].seq


def _check_arguments(segment_ids: Sequence[str], tier_number: int, attempts: int) -> None:
    if isinstance(segment_ids, str) or not segment_ids or \
            not all(isinstance(s, str) for s in segment_ids):
        raise InvalidArgument(f"a move names a list of segment ids, got {segment_ids!r}")
    if len(set(segment_ids)) != len(segment_ids):
        raise InvalidArgument(f"segments {list(segment_ids)} name a segment twice")
    if isinstance(tier_number, bool) or not isinstance(tier_number, int):
        raise InvalidArgument(f"tier must be a tier number, got {tier_number!r}")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidArgument(f"attempts must be a positive integer, got {attempts!r}")


def _sources(st: TopicState, topic: Topic, ids: Sequence[str]) -> list[SegmentState]:
    segs = []
    for sid in ids:
        seg = st.segments.get(sid)
        if seg is None:
            raise SegmentNotMovable(f"topic {topic.name!r} has no committed segment {sid!r}")
        segs.append(seg)
    parts = {s.partition for s in segs}
    if len(parts) != 1:
        raise SegmentNotMovable(f"segments {list(ids)} of topic {topic.name!r} belong to "
                                f"several partitions {sorted(parts)}: only one partition's "
                                "segments merge")
    p = segs[0].partition
    order = [s.seq for s in st.partition_segments(p)]
    seqs = sorted(s.seq for s in segs)
    at = order.index(seqs[0])
    if order[at:at + len(seqs)] != seqs:
        raise SegmentNotMovable(f"segments {list(ids)} of topic {topic.name!r} are not "
                                f"adjacent in partition {p}")
    if topic.store.shared is not None:
        # The writing hosts' pointers and headers are not visible here: the log decides.
        ready = compactable_ids(topic, st)
        for s in segs:
            if topic.store.tier(s.tier).local and s.id not in ready:
                raise SegmentNotMovable(
                    f"segment {s.id} of topic {topic.name!r} may still be host {s.host}'s "
                    f"active segment of partition {p}: it moves once that host has rolled, "
                    "or log.segment.ms + log.cleanup.grace.ms after its first commit")
        return sorted(segs, key=lambda s: s.seq)
    active = topic.active_segment(p)
    for s in segs:
        if (s.seq, s.tier) == active and not _header_sealed(topic, s) or \
                (active is None and s.seq == max(order)):
            raise SegmentNotMovable(f"segment {s.id} of topic {topic.name!r} is the active "
                                    f"segment of partition {p}: only sealed segments move")
    return sorted(segs, key=lambda s: s.seq)


def compactable_ids(topic: Topic, st: TopicState, now: float | None = None) -> set[str]:
    """On a store shared by many hosts, the ids of the segments on a local tier (some
    host's tier 1) that are sealed as far as the log can tell: the host that writes it has
    rolled (a later segment of the partition in that host's range is committed), or its
    first commit is older than ``log.segment.ms`` + ``log.cleanup.grace.ms`` (the host's
    next append rolls, and a write still in flight older than that is refused at commit as
    "moved"). A compaction copies such a segment to the shared tier."""
    now_ms = int((time.time() if now is None else now) * 1000)
    age_ms = topic.setting("log.segment.ms") + topic.setting("log.cleanup.grace.ms")
    out: set[str] = set()
    for part in st.parts:
        newest: dict[int, int] = {}  # host range -> its highest committed segment number
        for q in part.segments:
            newest[q // SEQ_SPAN] = max(newest.get(q // SEQ_SPAN, q), q)
        for q, seg in part.segments.items():
            if not topic.store.tier(seg.tier).local:
                continue
            if q < newest[q // SEQ_SPAN] or now_ms - seg.first_ts > age_ms:
                out.add(seg.id)
    return out


def _header_sealed(topic: Topic, seg: SegmentState) -> bool:
    tier = topic.store.tier(seg.tier)
    hdr = tier.read_header(tier.segment_path(topic.name, seg.partition, seg.seq))
    return hdr is not None and hdr.sealed


def _rows(st: TopicState, segs: list[SegmentState]) -> np.ndarray:
    rows = st.part(segs[0].partition).chunks.rows()
    return rows[np.isin(rows["seq"], [s.seq for s in segs])]


def _plan(topic: Topic, segment_ids: Sequence[str], tier_number: int) -> _Plan:
    """Plan against the refreshed state, under the handle's lock (another thread may
    refresh it at any time), from copies."""
    with topic.snapshot() as st:
        segs = [dataclasses.replace(s) for s in _sources(st, topic, segment_ids)]
        rows = _rows(st, segs)
        tomb = st.tombstone(segs[0].id, tier_number)
    return _Plan(segs, SegmentsUnchanged(topic.name, planned(segs)), rows, tomb)


def _check_movable(topic: Topic, plan: _Plan, tier_number: int, final: str,
                   grace_s: float) -> None:
    """:class:`SegmentNotMovable` unless the planned sources can move to ``final``."""
    segs, rows = plan.segs, plan.rows
    lake = next((s for s in segs if topic.store.tier(s.tier).is_lake), None)
    if lake is not None:
        raise SegmentNotMovable(f"segment {lake.id} of topic {topic.name!r} is in the lake "
                                f"(tier {lake.tier}): nothing moves out of it")
    if len(segs) == 1 and segs[0].tier == tier_number:
        raise SegmentNotMovable(f"segment {segs[0].id} of topic {topic.name!r} is already on "
                                f"tier {tier_number}")
    shared = topic.store.shared
    for s in segs:
        src = topic.store.tier(s.tier)
        if shared is not None and s.seq not in shared.seqs:
            continue  # another host's file: compactable_ids decided from the log
        path = src.segment_path(topic.name, s.partition, s.seq)
        span = int(sum(align(int(n)) for n in rows["length"][rows["seq"] == s.seq]))
        if src.local and not is_settled(path, src.read_header(path), span, grace_s,
                                        time.time()):
            raise SegmentNotMovable(f"segment {s.id} of topic {topic.name!r} holds chunks "
                                    "written but not committed yet: it moves once they are "
                                    "committed or older than log.cleanup.grace.ms")
    sources = (topic.store.tier(s.tier).segment_path(topic.name, s.partition, s.seq)
               for s in segs)
    if final in sources:
        raise SegmentNotMovable("a merge onto the tier a source segment is on is not supported")


def move_segment(topic: Topic, segment_ids: Sequence[str], tier_number: int,
                 throttle: Callable[[int], None] | None = None,
                 attempts: int = 5) -> MoveResult:
    """Move (and merge) sealed segments of ``topic`` to tier ``tier_number`` (see the module
    docstring). ``throttle(nbytes)`` is called for each chunk copied; a race lost to an entry
    that touched the sources is planned again, up to ``attempts`` times."""
    _check_arguments(segment_ids, tier_number, attempts)
    store = topic.store
    if not 1 <= tier_number <= len(store.tiers):
        raise InvalidArgument(f"cannot move to tier {tier_number}: the store at {store.root} "
                              f"has tiers 1..{len(store.tiers)}")
    target = store.tier(tier_number)
    # Before any file there is written or freed: a remote tier may be another store's.
    store.claim_remote(target)
    for _ in range(attempts):
        t0 = time.perf_counter()
        plan = _plan(topic, segment_ids, tier_number)
        segs, rows, p, seq = plan.segs, plan.rows, plan.partition, plan.seq
        grace_s = topic.setting("log.cleanup.grace.ms") / 1000.0
        final = target.segment_path(topic.name, p, seq)
        _check_movable(topic, plan, tier_number, final, grace_s)
        # The layout's end: each chunk aligned but the last, as a writer fills a file.
        if target.is_lake:
            moved = demote_and_publish(topic, target, plan.segs, plan.rows,  # type: ignore
                                       plan.seen)
            if moved is None:
                continue
            if len(moved) < len(plan.segs):  # the run the table held already, alone
                kept = np.isin(plan.rows["seq"], [s.seq for s in moved])
                plan = dataclasses.replace(plan, segs=moved, rows=plan.rows[kept])
            return _moved(topic, plan, tier_number, t0, False)
        need = HEADER_SIZE + sum(align(int(n)) for n in rows["length"][:-1]) + int(
            rows["length"][-1])
        tomb = plan.tomb
        names = contextlib.ExitStack()
        if not target.local:
            # No flock on an object store: the partition's remote-name lock keeps garbage
            # collection from deleting this name from before the old copy is released until
            # the entry naming the new one is published (and two services from uploading it
            # at once).
            names.enter_context(store.partition_lock(topic.name, p, kind=REMOTE_LOCK))
            # Another service may have moved these segments while we waited: its upload
            # holds the name now, and the old copy's tombstone read at planning is stale.
            try:
                with topic.snapshot() as fresh:
                    plan.seen.validate(fresh)
                    tomb = fresh.tombstone(segment_id(p, seq), tier_number)
            except BaseException:
                names.close()
                raise
        with names:
            lock = -1  # holds our copy's flock until the entry is published (or discarded)
            adopted = False
            chunks: list[ChunkRecord] = []
            if target.exists(final):
                try:
                    _release_old_copy(topic, target, segment_id(p, seq), final, tomb,
                                      tier_number, grace_s)
                except CommitConflict:
                    # The old file stays: adopt it if it is laid out as our copy would be.
                    if len(segs) != 1:
                        raise
                    chunks, end = layout(rows, p, seq, tier_number)
                    if target.local:
                        lock = adopt_local(topic, target, final, p, seq, chunks, end)
                        adopted = lock >= 0
                    else:
                        adopted = adopt_remote(topic, target, final, p, seq, chunks, end)
                    if not adopted and target.exists(final):
                        raise
                    # (Released by garbage collection meanwhile: the name is free, copy.)
            if not adopted and target.local:
                chunks, lock = place_local(topic, target, segs, rows, need, throttle, final)
            elif not adopted:
                chunks = upload(topic, target, segs, rows, throttle, final)
            try:
                # The copy is written under this handle's view of the target tier and read
                # from its view of the sources' tiers: refused if any was relocated since.
                topic.replace_segments(p, [s.seq for s in segs], seq, tier_number, chunks,
                                       requirements=[plan.seen],
                                       read_from=[s.tier for s in segs])
            except CommitConflict as e:
                log.info("topic %s: move of %s lost a race (%s); retrying", topic.name,
                         [s.id for s in segs], e)
                now = topic.state().segments.get(segment_id(p, seq))
                # An adopted file stays what it was: the old copy, left to its grace period.
                if lock >= 0 and not adopted and (now is None or now.tier != tier_number):
                    discard_own(target, final, lock)
                continue
            finally:
                if lock >= 0:
                    os.close(lock)
        return _moved(topic, plan, tier_number, t0, adopted)
    raise CommitConflict(f"topic {topic.name!r}: gave up moving {list(segment_ids)} after "
                         f"{attempts} lost races")


def _moved(topic: Topic, plan: _Plan, tier_number: int, t0: float, adopted: bool
           ) -> MoveResult:
    """The result of a published move, its sources' maps dropped."""
    crash_point("move.committed")
    store, segs, rows, p = topic.store, plan.segs, plan.rows, plan.partition
    # Our reads of the sources pinned their files: unpin, so they can be released.
    MAPS.drop({store.tier(s.tier).segment_path(topic.name, p, s.seq) for s in segs})
    result = MoveResult(topic.name, segment_id(p, plan.seq), tuple(s.id for s in segs), p,
                        tuple(s.tier for s in segs), tier_number, int(rows["length"].sum()),
                        int(rows["records"].sum()), time.perf_counter() - t0, adopted)
    log.info("moved %s/%s (%s) from tier %s to tier %d: %d bytes, %d records in %.3f s%s",
             topic.name, result.segment, ", ".join(result.sources),
             "/".join(map(str, result.from_tiers)), tier_number, result.bytes,
             result.records, result.seconds,
             " (re-adopted its old file there, nothing copied)" if adopted else "")
    return result


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


__all__ = ["MoveResult", "OldCopyInGrace", "compactable_ids", "move_segment"]
