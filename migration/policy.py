"""Migration policy: a pure function from the store's state to a list of moves.

Pafka's rule, between each pair of adjacent tiers (upper = faster):

* When the upper tier holds more than ``high`` × its capacity, its **oldest** sealed segments
  (across all topics, by the time their newest record was committed) move down until it is
  back at or under ``high`` × capacity.
* When it holds less than ``low`` × capacity, the **newest** sealed segments of the lower tier
  move up while they fit under ``low`` × capacity (fresh data is what consumers read next).
* ``low`` and ``high`` default to ``storage.migrate.threshold`` (Pafka's single threshold);
  a band (``low < high``) keeps a segment that just moved up from being the first to move
  down again. A threshold of -1 disables migration. Active segments never move.
* Moving down merges adjacent sealed segments of one partition (consecutive in its offset
  order) while the merged segment stays within ``log.segment.bytes``: micro-batches make many
  small segments and the slow tier wants few big files.

On a pmem tier capacity is its pool and a segment occupies one whole pool file, as in Pafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SegmentView:
    """What the policy needs to know of a segment."""

    topic: str
    id: str
    partition: int
    seq: int
    tier: int
    bytes: int
    last_ts: int
    sealed: bool


@dataclass(frozen=True)
class TierView:
    """What the policy needs to know of a tier: capacity and usage in its own terms."""

    number: int
    capacity: int  # bytes; 0 = unbounded
    used: int
    pool_file: int = 0  # > 0 on a pmem tier: every segment there takes a file of this size

    def cost(self, nbytes: int) -> int:
        """Bytes of this tier a segment of ``nbytes`` takes."""
        return self.pool_file if self.pool_file else nbytes


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


def plan_moves(segments: Sequence[SegmentView], tiers: Sequence[TierView], low: float,
               high: float, segment_bytes: int, merge: bool = True) -> list[Move]:
    """The moves that bring each upper tier back into its band ``[low, high]``."""
    if high < 0 or low < 0:
        return []
    used = {t.number: t.used for t in tiers}
    where = {(s.topic, s.id): s.tier for s in segments}
    moves: list[Move] = []
    moved: set[tuple[str, str]] = set()  # a segment moves at most once per plan
    ordered = sorted(tiers, key=lambda t: t.number)
    for upper, lower in zip(ordered, ordered[1:], strict=False):
        if upper.capacity <= 0:
            continue
        on_upper = [s for s in segments if where[(s.topic, s.id)] == upper.number
                    and (s.topic, s.id) not in moved]
        if used[upper.number] > high * upper.capacity:
            # Oldest first; each partition's segments in offset order so that neighbours merge.
            candidates = sorted((s for s in on_upper if s.sealed),
                                key=lambda s: (s.last_ts, s.topic, s.partition, s.seq))
            chosen: list[SegmentView] = []
            freed = 0
            for s in candidates:
                if used[upper.number] - freed <= high * upper.capacity:
                    break
                chosen.append(s)
                freed += upper.cost(s.bytes)
            for group in _merge_groups(chosen, segments, segment_bytes, merge):
                nbytes = sum(s.bytes for s in group)
                moves.append(Move(group[0].topic, tuple(s.id for s in group), upper.number,
                                  lower.number, nbytes))
                used[upper.number] -= sum(upper.cost(s.bytes) for s in group)
                used[lower.number] += lower.cost(nbytes)
                for s in group:
                    where[(s.topic, s.id)] = lower.number
                    moved.add((s.topic, s.id))
        elif used[upper.number] < low * upper.capacity:
            on_lower = [s for s in segments if where[(s.topic, s.id)] == lower.number
                        and s.sealed and (s.topic, s.id) not in moved]
            for s in sorted(on_lower, key=lambda s: (-s.last_ts, s.topic, s.partition, -s.seq)):
                cost = upper.cost(s.bytes)
                if upper.pool_file and s.bytes > upper.pool_file:
                    continue  # a merged segment bigger than a pool file cannot go back up
                if used[upper.number] + cost > low * upper.capacity:
                    break
                moves.append(Move(s.topic, (s.id,), lower.number, upper.number, s.bytes))
                used[upper.number] += cost
                used[lower.number] -= lower.cost(s.bytes)
                where[(s.topic, s.id)] = upper.number
                moved.add((s.topic, s.id))
    return moves


def _merge_groups(chosen: list[SegmentView], everything: Sequence[SegmentView],
                  segment_bytes: int, merge: bool) -> list[list[SegmentView]]:
    """Group chosen segments into runs adjacent in their partition, each within a segment."""
    if not merge:
        return [[s] for s in chosen]
    order: dict[tuple[str, int], list[int]] = {}
    for s in everything:
        order.setdefault((s.topic, s.partition), []).append(s.seq)
    for seqs in order.values():
        seqs.sort()
    by_part: dict[tuple[str, int], list[SegmentView]] = {}
    for s in chosen:
        by_part.setdefault((s.topic, s.partition), []).append(s)
    groups: list[list[SegmentView]] = []
    for key, segs in by_part.items():
        segs.sort(key=lambda s: s.seq)
        seqs = order[key]
        run: list[SegmentView] = []
        for s in segs:
            adjacent = run and seqs.index(s.seq) == seqs.index(run[-1].seq) + 1
            fits = run and sum(x.bytes for x in run) + s.bytes <= segment_bytes
            if run and adjacent and fits:
                run.append(s)
            else:
                if run:
                    groups.append(run)
                run = [s]
        if run:
            groups.append(run)
    # Keep the oldest-first order of the runs.
    return sorted(groups, key=lambda g: min(s.last_ts for s in g))
