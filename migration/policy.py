"""Migration policy: a pure function from the store's state to a list of moves.

The rule is **freshness order across all tiers** (Pafka's single-threshold rule balanced one
pair of tiers at a time and never swapped, so once tier 1 had overflowed, older segments stayed
on it while newer ones sat below):

* Within each partition, no sealed segment on a slower tier is newer (higher sequence number,
  so higher offsets) than a sealed segment on a faster tier. Across partitions and topics a
  segment's age is the time its newest record was committed (``last_ts``), made monotonic
  along each partition so that the two orders agree. The last tier (a REMOTE one, say)
  receives only the oldest data.
* The thresholds decide only **how much** each tier holds, never the order. For every tier
  with a capacity except the last, the amount of segments it should hold is what it holds
  once the faster tiers are settled (its own segments, plus what they pass down, minus what
  they take up), kept within the band ``[low, high]`` × capacity: inside the band it stays,
  above ``high`` it drains to ``high``, below ``low`` it fills to ``low``. ``low`` and
  ``high`` default to ``storage.migrate.threshold`` (Pafka's single threshold); a band
  (``low < high``) keeps a segment that just moved from moving straight back. A tier without a
  capacity (0, unbounded) that is not the last keeps the amount it holds. The last tier takes
  the rest. A threshold of -1 disables migration.
* Sealed segments are dealt out newest first (by age, then topic, partition, newest sequence
  first): tier 1 takes them while they fit its amount, then tier 2, and so on. A tier stops at
  the first segment that does not fit (skipping it would break the order), except a segment
  that can never go there (bigger than a pool file): that one, and every older segment of its
  partition, go to a slower tier. So demotions of the oldest and promotions of the newest come
  out of the same run when the order needs them.
* Segments that may not move (a partition's active segment, one with chunks a writer may
  still commit, one waiting out a back-off: ``sealed=False``) stay where they are and count in
  their tier's usage; the order ignores them.
* Moves are the segments whose tier changes. Moving down merges adjacent sealed segments of one
  partition going to the same tier (consecutive in its offset order) while the merged file
  stays within ``log.segment.bytes``: micro-batches make many small segments and the slow tier
  wants few big files. Moving up moves one segment at a time.

On a pmem tier capacity is its pool and a segment occupies one whole pool file, as in Pafka.

On a store shared by many hosts (tier 1 per host, then the shared tier) the rule is
:func:`plan_compaction` instead: every tier-1 segment that may move (``sealed``: the service
asks the store which are sealed as far as the log can tell) is copied to the shared tier,
oldest first, and nothing else moves. A host's tier 1 is its own: each host evicts its copies
itself, beyond the thresholds, and never takes segments back from the shared tier.

A settled state (the moves of a plan applied, no new data) plans no moves: the amounts
computed from it are the amounts it holds, or, where it holds less than ``low``, amounts the
next segment did not fit in before either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tier_store import ConfigError


@dataclass(frozen=True)
class SegmentView:
    """What the policy needs to know of a segment."""

    topic: str
    id: str
    partition: int
    seq: int
    tier: int
    bytes: int  # committed chunk bytes: what it costs on a tier without a pool
    last_ts: int
    sealed: bool  # may move (sealed, settled, not held back)
    file_bytes: int = 0  # bytes a file holding it alone needs (header, alignment); 0: bytes

    @property
    def file_size(self) -> int:
        """Bytes a file holding this segment alone needs (at most)."""
        return self.file_bytes or self.bytes


@dataclass(frozen=True)
class TierView:
    """What the policy needs to know of a tier: capacity and usage in its own terms."""

    number: int
    capacity: int  # bytes; 0 = unbounded
    used: int  # in the terms of cost(): the segments on it
    pool_file: int = 0  # > 0 on a pmem tier: every segment there takes a file of this size

    def cost(self, nbytes: int) -> int:
        """Bytes of this tier a segment of ``nbytes`` takes."""
        return self.pool_file if self.pool_file else nbytes

    def takes(self, s: SegmentView) -> bool:
        """Whether segment ``s`` can be on this tier at all (a pool file holds it)."""
        return s.tier == self.number or not self.pool_file or s.file_size <= self.pool_file


@dataclass(frozen=True)
class Move:
    """Move ``segments`` (adjacent, one partition; merged when several) to ``target``."""

    topic: str
    segments: tuple[str, ...]
    source: int
    target: int
    bytes: int

    @property
    def down(self) -> bool:
        return self.target > self.source


Key = tuple[str, str]  # (topic, segment id)


def plan_moves(segments: Sequence[SegmentView], tiers: Sequence[TierView], low: float,
               high: float, segment_bytes: int, merge: bool = True) -> list[Move]:
    """The moves that restore the freshness order and bring each tier's amount into its
    band ``[low, high]``: demotions oldest first, then promotions newest first."""
    if high < 0 or low < 0 or len(tiers) < 2:
        return []
    place = assign_tiers(segments, tiers, low, high)
    by_number = {t.number: t for t in tiers}
    downs: dict[tuple[int, int], list[SegmentView]] = {}
    ups: list[SegmentView] = []
    for s in segments:
        target = place.get((s.topic, s.id), s.tier)
        if target > s.tier:
            downs.setdefault((s.tier, target), []).append(s)
        elif target < s.tier:
            ups.append(s)
    age = freshness(segments)
    moves: list[tuple[int, Move]] = []
    for (source, target), chosen in downs.items():
        # A merge into a pool file would change what the segments cost there.
        joins = merge and not by_number[target].pool_file
        for group in _merge_groups(chosen, segments, segment_bytes, joins):
            moves.append((min(age[(s.topic, s.id)] for s in group), Move(
                group[0].topic, tuple(s.id for s in group), source, target,
                sum(s.bytes for s in group))))
    out = [m for _, m in sorted(moves, key=lambda x: (x[0], x[1].topic, x[1].segments))]
    for s in sorted(ups, key=newest_first(age)):
        out.append(Move(s.topic, (s.id,), s.tier, place[(s.topic, s.id)], s.bytes))
    return out


def demotion_phases(moves: Sequence[Move], tiers: Sequence[TierView]) -> list[list[Move]]:
    """The demotions of a plan in the batches to run them in, one after another.

    First those whose target has room for them now, the fastest source first: tier 1's
    drain is what the next burst needs, and it must not wait for a slower tier's demotions
    (a lake's conversion, say) it does not depend on. Then the rest, the slowest source
    first: what tier 2 passes to tier 3 makes room for what tier 1 passes to tier 2."""
    by_number = {t.number: t for t in tiers}
    room = {t.number: t.capacity - t.used if t.capacity > 0 else None for t in tiers}
    now: dict[int, list[Move]] = {}
    later: dict[int, list[Move]] = {}
    for m in moves:
        if not m.down:
            continue
        free = room.get(m.target)
        cost = by_number[m.target].cost(m.bytes) if m.target in by_number else m.bytes
        if free is None or cost <= free:
            now.setdefault(m.source, []).append(m)
            if free is not None:
                room[m.target] = free - cost
        else:
            later.setdefault(m.source, []).append(m)
    return [now[k] for k in sorted(now)] + [later[k] for k in sorted(later, reverse=True)]


def fill_band(config: Any) -> tuple[float, float]:
    """The (low, high) fill band of a store's ``storage.migrate.threshold[.low/.high]``;
    (-1, -1) when migration is disabled."""
    t = config["storage.migrate.threshold"]
    if t == -1:
        return -1.0, -1.0
    low = config["storage.migrate.threshold.low"]
    high = config["storage.migrate.threshold.high"]
    low = t if low is None else low
    high = t if high is None else high
    if low > high:
        raise ConfigError(f"storage.migrate.threshold.low={low} is above "
                          f"storage.migrate.threshold.high={high}")
    return low, high


def plan_compaction(segments: Sequence[SegmentView], shared: int) -> list[Move]:
    """On a store shared by many hosts: every movable segment on a tier below ``shared`` (some
    host's tier 1) to the shared tier ``shared``, one move each, oldest (by ``last_ts``)
    first."""
    chosen = sorted((s for s in segments if s.sealed and s.tier < shared),
                    key=lambda s: (s.last_ts, s.topic, s.partition, s.seq))
    return [Move(s.topic, (s.id,), s.tier, shared, s.bytes) for s in chosen]


def assign_tiers(segments: Sequence[SegmentView], tiers: Sequence[TierView], low: float,
                 high: float) -> dict[Key, int]:
    """The tier each sealed segment belongs on, by (topic, id)."""
    ordered = sorted(tiers, key=lambda t: t.number)
    movable = [s for s in segments if s.sealed]
    age = freshness(segments)
    remaining = sorted(movable, key=newest_first(age))
    place: dict[Key, int] = {}
    for tier in ordered[:-1]:
        mine = sum(tier.cost(s.bytes) for s in movable if s.tier == tier.number)
        fixed = max(0, tier.used - mine)  # what may not move
        # What the tier holds once the faster tiers are settled.
        natural = fixed + sum(tier.cost(s.bytes) for s in remaining
                              if s.tier <= tier.number and tier.takes(s))
        if tier.capacity > 0:
            target = min(max(natural, low * tier.capacity), high * tier.capacity)
        else:
            target = natural
        budget = target - fixed
        rest: list[SegmentView] = []
        barred: set[tuple[str, int]] = set()  # partitions whose older segments cannot come
        full = False
        for s in remaining:
            part = (s.topic, s.partition)
            if full or part in barred:
                rest.append(s)
            elif not tier.takes(s):
                barred.add(part)
                rest.append(s)
            elif tier.cost(s.bytes) > budget:
                full = True
                rest.append(s)
            else:
                place[(s.topic, s.id)] = tier.number
                budget -= tier.cost(s.bytes)
        remaining = rest
    last = ordered[-1]
    for s in remaining:
        # A segment the last tier cannot hold either stays where it is.
        place[(s.topic, s.id)] = last.number if last.takes(s) else s.tier
    return place


def freshness(segments: Sequence[SegmentView]) -> dict[Key, int]:
    """Each segment's age for the order: its ``last_ts``, raised to the newest ``last_ts`` of
    the older segments of its partition (concurrent writers may commit a segment's last chunk
    after the next segment's), so that newer by age is never older by offset."""
    by_part: dict[tuple[str, int], list[SegmentView]] = {}
    for s in segments:
        by_part.setdefault((s.topic, s.partition), []).append(s)
    out: dict[Key, int] = {}
    for segs in by_part.values():
        newest: int | None = None
        for s in sorted(segs, key=lambda s: s.seq):
            newest = s.last_ts if newest is None else max(newest, s.last_ts)
            out[(s.topic, s.id)] = newest
    return out


def newest_first(age: dict[Key, int]) -> Callable[[SegmentView], tuple[int, str, int, int]]:
    """Sort key: newest first; ties by topic, partition, newest sequence number first."""
    return lambda s: (-age[(s.topic, s.id)], s.topic, s.partition, -s.seq)


def _merge_groups(chosen: list[SegmentView], everything: Sequence[SegmentView],
                  segment_bytes: int, merge: bool) -> list[list[SegmentView]]:
    """Group chosen segments into runs adjacent in their partition, each within a segment
    file (``segment_bytes``, headers and alignment counted)."""
    if not merge:
        return [[s] for s in chosen]
    position: dict[Key, int] = {}
    by_seq: dict[tuple[str, int], list[SegmentView]] = {}
    for s in everything:
        by_seq.setdefault((s.topic, s.partition), []).append(s)
    for segs in by_seq.values():
        for i, s in enumerate(sorted(segs, key=lambda s: s.seq)):
            position[(s.topic, s.id)] = i
    by_part: dict[tuple[str, int], list[SegmentView]] = {}
    for s in chosen:
        by_part.setdefault((s.topic, s.partition), []).append(s)
    groups: list[list[SegmentView]] = []
    for segs in by_part.values():
        segs.sort(key=lambda s: s.seq)
        run: list[SegmentView] = []
        for s in segs:
            adjacent = run and position[(s.topic, s.id)] == \
                position[(run[-1].topic, run[-1].id)] + 1
            fits = run and sum(x.file_size for x in run) + s.file_size <= segment_bytes
            if run and adjacent and fits:
                run.append(s)
            else:
                if run:
                    groups.append(run)
                run = [s]
        if run:
            groups.append(run)
    return groups
