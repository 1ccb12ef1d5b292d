"""Garbage: reclaiming segment files that no commit-log entry references any more.

What it does: :func:`collect_garbage` releases a topic's segment files on every tier that
no entry references (moved away, deleted by retention) and the temporary copies of
interrupted moves; :func:`release_file` is the one way any operation releases a local file.

Steps, each crash-safe (a file is released or it is not; nothing references what goes):

1. List each tier's files of the topic; keep the candidates: unreferenced by the state and
   past the grace period (or, on a pool tier, tombstoned).
2. Per partition, take its lock without waiting (and, on a remote tier, its remote-name
   lock); a busy partition is left for the next pass.
3. Per file, take its exclusive ``flock`` without waiting, check it again against the state
   read then, and release it (pool files back to the pool).

DANGER: it deletes segment files. What protects readers and moves is below.

Rules (run by writers after a checkpoint, and by the migration service; never by a reader or
an ``open``):

* A file is reclaimed only when nothing references it: not a committed segment of the topic's
  state, not a partition's active segment.
* On a tier whose files are reused (a pmem pool), readers pin every file they map with a
  shared ``flock`` (:mod:`tier_store.reading`): a moved or deleted segment's file goes back
  to the pool as soon as an exclusive lock on it succeeds, with no grace period.
* Elsewhere a file is reclaimed only once it has been untouched (by its own mtime) for
  ``log.cleanup.grace.ms``, and, for a segment deleted by retention or replaced by a move,
  only once its ``delete`` or ``move`` entry is that old too, so a reader that planned against
  it still finishes. The tombstone alone is not enough: a segment that lived on a tier before
  has an old tombstone there while a move links a fresh copy under the same name, which its
  ``move`` entry references a moment later (moves keep the mtime of their copies fresh).
* Never a file a live move holds (its ``flock``, :func:`release_file`): a move's copy is
  unreferenced until its ``move`` entry is published, however long the move stalls.
* A remote tier (an object store) has no ``flock``: its files are reclaimed under the
  partition's remote-name lock (``_partitions/<p>.remote.lock``, taken without waiting),
  which a move to that tier holds from freeing the name until its entry is published, and
  checked against the state read under it.
* Only under the partition's lock, taken without waiting: a busy partition is left for the
  next pass. Each file is checked again against the state read after taking the file's lock,
  so a move published while we looked keeps its file. Pool files go back to the pool, never
  deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from ..crash import crash_point
from ..errors import ConfigError, CorruptSegment
from ..layout import REMOTE_LOCK, SEGMENT_SUFFIX, TMP_PREFIX, segment_id

if TYPE_CHECKING:
    from ..host import TopicHost
    from ..state import TopicState
    from ..tiers import Tier
    from ..topic import Topic

log = logging.getLogger(__name__)


def release_file(tier: Tier, path: str, may_release: Callable[[os.stat_result], bool]) -> bool:
    """Release the file at ``path`` on a local ``tier`` if no live move holds it and
    ``may_release(its stat)`` holds; return whether it was released. Thread- and
    process-safe.

    A move holds an ``flock`` on its copy from the copy's creation until its ``move`` entry is
    published or the copy is discarded (the kernel drops it when the process dies), so a
    locked file is never released. The check runs while we hold that lock ourselves, and the
    file released is the one checked (the name still leads to the locked file): a move
    cannot claim, link or publish it meanwhile."""
    try:
        # Never through a link (at the name, or for a directory on the way): a link is not
        # the segment, and what it leads to is not the store's to release.
        fd = tier.open_inside(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except CorruptSegment as e:
        log.warning("not releasing %s, left alone: %s", path, e)
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live move's copy
        held = os.fstat(fd)
        if not may_release(held):
            return False
        try:
            named = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
            return False  # released and replaced by another process since we opened it
        try:
            if held.st_nlink > 1:
                # Another name still holds the file (a move that died between linking its
                # copy to the segment's name and unlinking its temporary name): drop only
                # this name, so that a pool file never goes back to the pool while a name
                # still maps it.
                tier.unlink_inside(path)
            else:
                tier.release_segment(path)
        except CorruptSegment as e:  # a link put there since we opened the file
            log.warning("not releasing %s, left alone: %s", path, e)
            return False
        return True
    finally:
        os.close(fd)


def _tombstone_s(st: TopicState, sid: str, tier: int) -> float:
    tomb = st.tombstone(sid, tier)
    return tomb[1] / 1000.0 if tomb is not None else 0.0


def _may_reclaim(topic: Topic, tier: Tier, sid: str | None, mtime: float, now: float,
                 grace_s: float) -> bool:
    """Segment ``sid``'s file on ``tier`` (None: a temporary file) is not referenced by the
    state as it is now (a move that published while we looked has dropped its lock by then),
    and the file (``mtime``) and its tombstone are both older than the grace period — or, on
    a tier whose readers pin the files they map, the segment has a tombstone there: the
    caller holds the file's exclusive lock, so no reader maps it now, and one that planned
    against it finds the name gone and plans again."""
    since = 0.0
    if sid is not None:
        st = topic.state()
        seg = st.segments.get(sid)
        if seg is not None and seg.tier == tier.number:
            return False
        since = _tombstone_s(st, sid, tier.number)
        if since and tier.pinned_by_readers:
            return True
    return now - max(mtime, since) > grace_s


@contextlib.contextmanager
def _remote_names(store: TopicHost, tier: Tier, topic: str, p: int) -> Iterator[bool]:
    """The partition's remote-name lock, without waiting, for a remote tier; nothing to take
    (True) for a local one, whose files carry their own ``flock``."""
    if tier.local:
        yield True
        return
    with store.partition_lock(topic, p, blocking=False, kind=REMOTE_LOCK) as free:
        yield free


def collect_garbage(topic: Topic, now: float | None = None,
                    tiers: Sequence[Tier] | None = None) -> int:
    """Reclaim ``topic``'s unreferenced segment files past the grace period (on ``tiers``,
    or every tier); return the count."""
    store = topic.store
    now = time.time() if now is None else now
    st = topic.state()
    reclaimed = 0
    for tier in store.tiers if tiers is None else tiers:
        if tier.is_lake:  # the table keeps what the log drops
            continue
        try:
            store.claim_remote(tier)
        except ConfigError as e:
            # Its files may be another store's: reclaim nothing there.
            log.warning("topic %s: no garbage collection on tier %d: %s", topic.name,
                        tier.number, e)
            continue
        reclaimed += collect_tier(topic, tier, st, now)
    return reclaimed


def collect_tier(topic: Topic, tier: Tier, st: TopicState, now: float,
                 seqs: range | None = None) -> int:
    """Reclaim ``topic``'s unreferenced files on ``tier`` (``st``: its state, read before
    listing) past the grace period; with ``seqs``, only segment files numbered in it (and
    temporary files): one host's, on a store shared by many. Returns the count."""
    store = topic.store
    grace_s = topic.setting("log.cleanup.grace.ms") / 1000.0
    reclaimed = 0
    candidates: dict[int, list[tuple[str, str, float]]] = {}
    actives: dict[int, tuple[int, int] | None] = {}
    for p, name, path, mtime in tier.partition_files(topic.name):
        if p not in actives:
            actives[p] = topic.active_segment(p) if p < st.partitions else None
        if name.startswith(TMP_PREFIX):
            # A copy of an interrupted move (a live move keeps touching its copy).
            if now - mtime > grace_s:
                candidates.setdefault(p, []).append((name, path, mtime))
            continue
        if not name.endswith(SEGMENT_SUFFIX) or not name[: -len(SEGMENT_SUFFIX)].isdigit():
            continue
        seq = int(name[: -len(SEGMENT_SUFFIX)])
        if seqs is not None and seq not in seqs:
            continue
        sid = segment_id(p, seq)
        seg = st.segments.get(sid)
        if (seg is not None and seg.tier == tier.number) or actives[p] == (seq, tier.number):
            continue
        tomb = _tombstone_s(st, sid, tier.number)
        if (tomb and tier.pinned_by_readers) or now - max(mtime, tomb) > grace_s:
            candidates.setdefault(p, []).append((name, path, mtime))
    for p, files in candidates.items():
        with store.partition_lock(topic.name, p, blocking=False) as held, \
                _remote_names(store, tier, topic.name, p) as free:
            if not held or not free:
                continue
            # The active pointer may have moved while we looked: re-check under the lock.
            active = topic.active_segment(p)
            for name, path, mtime in files:
                of: str | None = None  # the segment it is a file of; None: a temp file
                if name.endswith(SEGMENT_SUFFIX):
                    seq = int(name[: -len(SEGMENT_SUFFIX)])
                    if active == (seq, tier.number):
                        continue
                    of = segment_id(p, seq)
                if tier.local:
                    if not release_file(tier, path, lambda s, of=of, t=tier:
                                        _may_reclaim(topic, t, of, s.st_mtime, now,
                                                     grace_s)):
                        continue
                else:
                    # Checked again under the remote-name lock: a move that uploaded
                    # this name since it was listed has published its entry by now.
                    if not _may_reclaim(topic, tier, of, mtime, now, grace_s):
                        continue
                    tier.release_segment(path)
                crash_point("gc.release")
                reclaimed += 1
                log.info("reclaimed unreferenced segment file %s", path)
    return reclaimed


__all__ = ["collect_garbage", "collect_tier", "release_file"]
