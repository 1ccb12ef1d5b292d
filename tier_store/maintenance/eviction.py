"""Eviction: each host frees its own tier 1, on a store shared by many hosts.

On a shared store (:mod:`tier_store.sharing`) every committed chunk is in a bundle on the
shared tier, and the writing host's tier-1 copy is a cache. No process can delete another
host's files, so each host evicts its own: :func:`evict_local`, for the segment files
numbered in this host's range (``SharedTier.seqs``) on tier 1:

1. **Garbage** (the rules of :mod:`.garbage`): files of segments the log no longer has on
   tier 1 (compacted to the shared tier, deleted by retention) once their tombstone and
   their mtime are older than ``log.cleanup.grace.ms``, and files no commit names
   (abandoned by a killed task) once untouched for the grace period.
2. **Copies above the threshold**: while this host's files on tier 1 take more than
   ``storage.migrate.threshold.high`` (else ``storage.migrate.threshold``) of the tier's
   capacity (a PMEM tier's: its pool), release the local copies of committed segments,
   oldest first (by their last commit). Never a partition's active segment (this host's
   pointer names it), never one with chunks not committed yet (a write task may still share
   them), never one a chunk of which no bundle holds, never a file a reader maps (its pin)
   or a live move holds (:func:`.garbage.release_file`). Nothing is evicted for the
   threshold when it is -1 or the tier has no capacity.

Reads on this host then find the copy gone and read the chunk's bundle (or, once
compacted, the shared segment); a compaction run here reads the bundles too.

Who calls it (the choice): the **write path**, after a write task, through
``Store.evict_local(every=EVICT_EVERY_S)``: at most once per :data:`EVICT_EVERY_S` seconds
per process, so a host that writes keeps its tier 1 in bounds with no process of its own;
it lists only tier 1 (local) and reads the states of the topics that have files there. A
host that stops writing keeps what it has until ``pafka migrate --local ROOT --follow`` runs
there (the same pass every ``storage.migrate.interval.ms``), or it writes again. The
migration service runs it for its own host on each run.

DANGER: it deletes this host's segment files. What protects data: a copy is released only
when every chunk of it is in a bundle the log names (committed data stays readable from the
shared tier); garbage follows :mod:`.garbage`'s rules; all checks are repeated under the
partition's lock and the file's exclusive ``flock``, against the state read then.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CorruptSegment, PafkaError
from ..layout import SEGMENT_SUFFIX, segment_id
from ..partition import is_settled
from ..segment import align
from .garbage import collect_tier, release_file

if TYPE_CHECKING:
    from ..sharing import SharedTier
    from ..state import TopicState
    from ..store import Store
    from ..tiers import Tier
    from ..topic import Topic

log = logging.getLogger(__name__)

EVICT_EVERY_S = 10.0
"""The write path evicts at most this often per process (``Store.evict_local(every=...)``)."""

_guard = threading.Lock()
_last: dict[str, float] = {}  # store root -> time.monotonic() of this process's last pass


@dataclass
class Evicted:
    """What one pass on this host released."""

    garbage: int = 0  # files of moved, deleted or never committed segments
    copies: int = 0  # local copies of committed segments, above the threshold
    copy_bytes: int = 0
    used: int = 0  # bytes this host's segment files take on tier 1 after the pass
    limit: int | None = None  # the threshold in bytes (None: no eviction for the threshold)


@dataclass(frozen=True)
class _Copy:
    last_ts: int
    topic: Topic
    partition: int
    seq: int
    path: str
    size: int


def evict_local(store: Store, now: float | None = None, every: float = 0.0
                ) -> Evicted | None:
    """One eviction pass over this host's tier 1 (see the module docstring); None when the
    store is not shared, or when this process made a pass less than ``every`` seconds ago.
    One topic's trouble is logged and stops no other."""
    shared = store.shared
    if shared is None:
        return None
    with _guard:
        last = _last.get(store.root)
        if last is not None and time.monotonic() - last < every:
            return None
        _last[store.root] = time.monotonic()
    now = time.time() if now is None else now
    tier = store.tier(1)
    out = Evicted(limit=_limit(store, tier))
    copies: list[_Copy] = []
    for name in _local_topics(store, tier):
        try:
            topic = store.topic(name)
            st = topic.state()
            out.garbage += collect_tier(topic, tier, st, now, shared.seqs)
            out.used += _survey(topic, tier, st, shared, now, copies)
        except (PafkaError, OSError) as e:
            log.warning("topic %s: evicting from tier 1 (%s) failed: %s: %s", name, tier.path,
                        type(e).__name__, e)
    if out.limit is None or out.used <= out.limit:
        return out
    for c in sorted(copies, key=lambda c: (c.last_ts, c.topic.name, c.partition, c.seq)):
        if out.used <= out.limit:
            break
        if _release_copy(c, tier):
            out.used -= c.size
            out.copies += 1
            out.copy_bytes += c.size
    log.info("tier 1 (%s) of host %s: released %d local copies (%d bytes) of committed "
             "segments; %d of %d bytes used", tier.path, shared.host, out.copies,
             out.copy_bytes, out.used, out.limit)
    return out


def _limit(store: Store, tier: Tier) -> int | None:
    """Bytes this host's files may take on ``tier`` before copies are evicted."""
    c = store.config
    threshold = c["storage.migrate.threshold"]
    if threshold == -1:
        return None
    high = c["storage.migrate.threshold.high"]
    high = threshold if high is None else high
    capacity = (tier.pool_size or 0) * tier.segment_bytes if tier.has_pool else tier.capacity
    return int(high * capacity) if capacity > 0 else None


def _local_topics(store: Store, tier: Tier) -> list[str]:
    """The topics that have a directory on this host's ``tier``."""
    try:
        here = set(os.listdir(tier.path))
    except FileNotFoundError:
        return []
    return [n for n in store.topics() if n in here]


def _survey(topic: Topic, tier: Tier, st: TopicState, shared: SharedTier, now: float,
            copies: list[_Copy]) -> int:
    """Bytes this host's segment files of ``topic`` take on ``tier``; appends to ``copies``
    the local copies of committed segments that may go."""
    grace_s = topic.setting("log.cleanup.grace.ms") / 1000.0
    used = 0
    actives: dict[int, tuple[int, int] | None] = {}
    for p, name, path, _mtime in tier.partition_files(topic.name):
        stem = name[: -len(SEGMENT_SUFFIX)] if name.endswith(SEGMENT_SUFFIX) else ""
        if not stem.isdigit() or int(stem) not in shared.seqs:
            continue
        seq = int(stem)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            continue
        used += size
        if p not in actives:
            actives[p] = topic.active_segment(p) if p < st.partitions else None
        seg = st.segments.get(segment_id(p, seq))
        if seg is None or seg.tier != tier.number or actives[p] == (seq, tier.number):
            continue
        rows = st.part(p).chunks.rows()
        mine = rows[rows["seq"] == seq]
        if not _in_bundles(mine):
            continue
        span = int(sum(align(int(n)) for n in mine["length"]))
        try:
            if not is_settled(path, tier.read_header(path), span, grace_s, now):
                continue  # chunks a write task may still share
        except CorruptSegment as e:
            log.warning("not evicting %s: %s", path, e)
            continue
        copies.append(_Copy(seg.last_ts, topic, p, seq, path, size))
    return used


def _in_bundles(rows: np.ndarray) -> bool:
    return len(rows) > 0 and bool((rows["opos"] >= 0).all())


def _release_copy(c: _Copy, tier: Tier) -> bool:
    """Release the local copy ``c`` if, under the partition's lock and the file's own, it
    still is a committed segment on this tier, not the active one, every chunk in a bundle."""
    topic, p, seq = c.topic, c.partition, c.seq
    with topic.store.partition_lock(topic.name, p, blocking=False) as held:
        if not held or topic.active_segment(p) == (seq, tier.number):
            return False

        def still(_: os.stat_result) -> bool:
            st = topic.state()
            seg = st.segments.get(segment_id(p, seq))
            if seg is None or seg.tier != tier.number:
                return False  # moved or deleted since: garbage's rules apply
            rows = st.part(p).chunks.rows()
            return _in_bundles(rows[rows["seq"] == seq])

        return release_file(tier, c.path, still)


__all__ = ["EVICT_EVERY_S", "Evicted", "evict_local"]
