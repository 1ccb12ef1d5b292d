"""The migration policy on states built in memory: the freshness order across all tiers.

The order, as these tests check it (:func:`order_violations`): once the service has settled,
within each partition no sealed segment on a slower tier has a higher sequence number (so
higher offsets) than a sealed segment on a faster tier. The thresholds decide how much each
tier holds, never the order.
"""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from migration.policy import Move, SegmentView, TierView, plan_moves

MB = 1 << 20


def seg(i, tier, nbytes=MB, ts=None, topic="t", p=0, sealed=True, file_bytes=0):
    return SegmentView(topic, f"{p}-{i}", p, i, tier, nbytes, i if ts is None else ts, sealed,
                       file_bytes)


def tier_views(segs, spec):
    """Tiers numbered from 1 with ``spec`` = [(capacity, pool_file), ...]; each one's usage
    counted from the segments on it, as the service counts it."""
    out = []
    for n, (cap, pool) in enumerate(spec, 1):
        t = TierView(n, cap, 0, pool)
        out.append(dataclasses.replace(
            t, used=sum(t.cost(s.bytes) for s in segs if s.tier == n)))
    return out


def two(cap1=10 * MB, pool=0):
    return [(cap1, pool), (0, 0)]


def order_violations(segments):
    """Pairs (slower, faster) of sealed segments of one partition where the one on the slower
    tier is the newer: what the freshness order forbids."""
    out = []
    for a in segments:
        for b in segments:
            if a.sealed and b.sealed and (a.topic, a.partition) == (b.topic, b.partition) \
                    and a.tier > b.tier and a.seq > b.seq:
                out.append((f"{a.topic}/{a.id}@{a.tier}", f"{b.topic}/{b.id}@{b.tier}"))
    return out


def apply(segments, moves, segment_bytes=None):
    """The state after ``moves``, as the store makes it: a merge keeps its first segment's
    id and sequence number, the sum of the bytes and the newest commit time. Checks each
    move is one the store accepts."""
    by_key = {(s.topic, s.id): s for s in segments}
    moved = set()
    for m in moves:
        srcs = [by_key.pop((m.topic, sid)) for sid in m.segments]
        assert not moved & {(m.topic, sid) for sid in m.segments}, "a segment moved twice"
        moved |= {(m.topic, sid) for sid in m.segments}
        assert all(s.sealed and s.tier == m.source for s in srcs), m
        assert len({s.partition for s in srcs}) == 1 and m.target != m.source, m
        if len(srcs) > 1:
            assert m.down, "only demotions merge"
            part = sorted(x.seq for x in segments if (x.topic, x.partition) ==
                          (m.topic, srcs[0].partition))
            at = part.index(srcs[0].seq)
            assert [s.seq for s in srcs] == part[at:at + len(srcs)], "not adjacent"
            if segment_bytes is not None:
                assert sum(s.file_size for s in srcs) <= segment_bytes
        first = srcs[0]
        by_key[(m.topic, first.id)] = dataclasses.replace(
            first, tier=m.target, bytes=sum(s.bytes for s in srcs),
            last_ts=max(s.last_ts for s in srcs),
            file_bytes=sum(s.file_size for s in srcs) if len(srcs) > 1 else first.file_bytes)
    return list(by_key.values())


def settle(segs, spec, low=0.5, high=0.5, segment_bytes=MB, merge=True, runs=5):
    """Plan and apply until a plan has no moves; returns the state and the plans made."""
    plans = []
    for _ in range(runs):
        moves = plan_moves(segs, tier_views(segs, spec), low, high, segment_bytes, merge)
        if not moves:
            return segs, plans
        plans.append(moves)
        segs = apply(segs, moves, segment_bytes if merge else None)
    raise AssertionError(f"not settled after {runs} runs: {plans[-1]}")


def where(segs):
    return {f"{s.topic}/{s.id}": s.tier for s in segs}


# -- two tiers ---------------------------------------------------------------------------------

def test_above_threshold_the_oldest_sealed_segments_move_down_until_back_under():
    segs = [seg(i, 1) for i in range(8)]
    moves = plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB, merge=False)
    assert [m.segments for m in moves] == [("0-0",), ("0-1",), ("0-2",)]
    assert all(m.source == 1 and m.target == 2 for m in moves)


def test_below_threshold_the_newest_segments_of_tier_two_move_up_while_they_fit():
    segs = [seg(i, 2) for i in range(6)] + [seg(10, 1)]
    moves = plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB)
    assert [m.segments for m in moves] == [("0-5",), ("0-4",), ("0-3",), ("0-2",)]
    assert all(not m.down for m in moves)


def test_in_order_at_the_threshold_nothing_moves():
    segs = [seg(i, 1) for i in range(5)] + [seg(-1, 2)]
    assert plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB) == []


def test_a_newer_segment_below_swaps_with_the_oldest_above_in_one_run():
    # Pafka's rule saw tier 1 at its threshold and moved nothing.
    segs = [seg(i, 1) for i in range(5)] + [seg(10, 2)]
    moves = plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB)
    assert [(m.segments, m.source, m.target) for m in moves] == [(("0-0",), 1, 2),
                                                                  (("0-10",), 2, 1)]
    assert not order_violations(apply(segs, moves))


def test_after_an_overflow_one_run_swaps_older_on_tier_one_with_newer_on_tier_two():
    # Tier 1 (pmem, 16 pool files) filled up; the writer's later segments went to tier 2.
    pool = MB // 4
    segs = [seg(i, 1, nbytes=pool - 4096, p=i % 2) for i in range(16)] + \
        [seg(i, 2, nbytes=pool - 4096, p=i % 2) for i in range(16, 20)] + \
        [seg(20, 2, nbytes=1000, sealed=False), seg(21, 2, nbytes=1000, p=1, sealed=False)]
    spec = [(4 * MB, pool), (0, 0)]
    assert order_violations(segs)
    after, plans = settle(segs, spec, segment_bytes=pool)
    assert len(plans) == 1  # one run
    downs = [m for m in plans[0] if m.down]
    ups = [m for m in plans[0] if not m.down]
    assert {s for m in ups for s in m.segments} == {f"{i % 2}-{i}" for i in range(16, 20)}
    assert {s for m in downs for s in m.segments} == {f"{i % 2}-{i}" for i in range(12)}
    assert not order_violations(after)
    on1 = [s for s in after if s.tier == 1]
    assert len(on1) == 8 and min(s.seq for s in on1) == 12  # 8 of 16 files: the threshold


def test_after_a_burst_the_newest_of_every_topic_come_up_and_the_oldest_go_down():
    # A burst of topic b filled tier 1 past its threshold; topic a's newest went to tier 2.
    segs = [seg(i, 1, topic="a", ts=i) for i in range(3)] + \
        [seg(i, 1, topic="b", ts=10 + i) for i in range(5)] + \
        [seg(i, 2, topic="a", ts=20 + i) for i in range(3, 6)]
    after, plans = settle(segs, two(), segment_bytes=MB)
    assert len(plans) == 1
    assert not order_violations(after)
    assert {f"{s.topic}/{s.id}" for s in after if s.tier == 1} == \
        {"a/0-3", "a/0-4", "a/0-5", "b/0-3", "b/0-4"}


def test_threshold_minus_one_disables_migration():
    segs = [seg(i, 1) for i in range(10)] + [seg(20, 2)]
    assert plan_moves(segs, tier_views(segs, two()), -1, -1, 4 * MB) == []


def test_one_tier_plans_nothing():
    segs = [seg(i, 1) for i in range(10)]
    assert plan_moves(segs, tier_views(segs, [(MB, 0)]), 0.5, 0.5, 4 * MB) == []


def test_empty_tier_two_and_nothing_to_promote():
    segs = [seg(0, 1)]
    assert plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB) == []


# -- three tiers -------------------------------------------------------------------------------

def test_three_tiers_the_newest_on_tier_one_the_oldest_on_the_last():
    # Pafka's rule balanced each pair: tier 2 passed its own oldest down, and kept newer
    # segments than tier 1 held.
    segs = [seg(i, 1) for i in range(8)] + [seg(20 + i, 2) for i in range(8)]
    spec = [(10 * MB, 0), (10 * MB, 0), (0, 0)]
    after, plans = settle(segs, spec, merge=False)
    assert len(plans) == 1
    assert not order_violations(after)
    assert sorted(s.seq for s in after if s.tier == 1) == list(range(23, 28))
    assert sorted(s.seq for s in after if s.tier == 2) == [6, 7, *range(20, 23)]
    assert sorted(s.seq for s in after if s.tier == 3) == list(range(6))


def test_the_newest_never_end_up_on_the_remote_tier():
    # PMEM, HDD, REMOTE: the newest sat on REMOTE (as Pafka's pairwise rule left them).
    pool = MB
    segs = [seg(i, 1, ts=i) for i in range(4)] + [seg(i, 2, ts=i) for i in range(4, 8)] + \
        [seg(i, 3, ts=i) for i in range(8, 12)]
    spec = [(8 * MB, pool), (8 * MB, 0), (0, 0)]
    after, plans = settle(segs, spec, merge=False)
    assert len(plans) == 1 and not order_violations(after)
    assert where(after) == {**{f"t/0-{i}": 3 for i in range(4)},
                            **{f"t/0-{i}": 2 for i in range(4, 8)},
                            **{f"t/0-{i}": 1 for i in range(8, 12)}}


def test_the_last_local_tier_demotes_to_remote_at_its_own_threshold():
    segs = [seg(i, 2) for i in range(7)] + [seg(i, 1) for i in range(7, 11)]
    spec = [(8 * MB, 0), (8 * MB, 0), (0, 0)]
    moves = plan_moves(segs, tier_views(segs, spec), 0.5, 0.5, MB, merge=False)
    assert [(m.segments, m.source, m.target) for m in moves] == \
        [(("0-0",), 2, 3), (("0-1",), 2, 3), (("0-2",), 2, 3)]


def test_an_unbounded_middle_tier_keeps_its_amount_but_not_an_out_of_order_segment():
    spec = [(8 * MB, 0), (0, 0), (0, 0)]
    segs = [seg(i, 1) for i in range(5, 9)] + [seg(i, 2) for i in range(2, 5)] + \
        [seg(i, 3) for i in range(2)]
    assert plan_moves(segs, tier_views(segs, spec), 0.5, 0.5, MB) == []
    segs = [seg(i, 1) for i in range(5, 9)] + [seg(i, 2) for i in range(1, 4)] + \
        [seg(0, 3), seg(4, 3)]
    moves = plan_moves(segs, tier_views(segs, spec), 0.5, 0.5, MB, merge=False)
    assert [(m.segments, m.source, m.target) for m in moves] == [(("0-1",), 2, 3),
                                                                  (("0-4",), 3, 2)]


# -- the band ----------------------------------------------------------------------------------

def _simulate(low, high, cycles=20):
    """Tier 1 (10 MB) holds five 1 MB segments, tier 2 older ones. Each cycle a short-lived
    topic writes one segment to tier 1, the policy runs, retention deletes that segment, the
    policy runs. Returns how many times a segment went back the way it came."""
    segs = [seg(i, 2, topic="old", ts=-10 + i) for i in range(5)] + \
        [seg(i, 1, topic="a", ts=i) for i in range(5)]
    history: dict[str, list[int]] = {}

    def run_policy(segs):
        moves = plan_moves(segs, tier_views(segs, two()), low, high, MB, merge=False)
        for m in moves:
            for sid in m.segments:
                history.setdefault(f"{m.topic}-{sid}", []).append(m.target)
        return apply(segs, moves)

    for c in range(cycles):
        segs = run_policy(segs + [seg(c, 1, topic="short", ts=100 + c)])
        segs = run_policy([s for s in segs if s.topic != "short"])
    return sum(max(0, len(h) - 1) for h in history.values())


def test_a_workload_that_thrashes_with_one_threshold_does_not_with_a_band():
    assert _simulate(0.5, 0.5) >= 10
    assert _simulate(0.3, 0.7) == 0


def test_a_state_inside_the_band_in_order_plans_no_moves():
    for n in range(3, 8):  # 3 to 7 MB of 10 MB: inside the band 0.3..0.7
        segs = [seg(i, 2) for i in range(20)] + [seg(20 + i, 1) for i in range(n)]
        assert plan_moves(segs, tier_views(segs, two()), 0.3, 0.7, MB) == []


def test_a_settled_state_plans_no_moves_with_the_band_and_unequal_sizes():
    sizes = [MB // 3, 2 * MB, MB // 2, 3 * MB, MB // 5, MB, 2 * MB // 3, MB // 7] * 3
    segs = [seg(i, 1 if i % 3 else 2, nbytes=n, p=i % 2) for i, n in enumerate(sizes)]
    for low, high in ((0.3, 0.7), (0.5, 0.5), (0.1, 0.9), (0.0, 1.0)):
        after, plans = settle(segs, two(), low, high, segment_bytes=4 * MB)
        assert len(plans) <= 1 and not order_violations(after)
        held = sum(s.bytes for s in after if s.tier == 1)
        assert held <= high * 10 * MB


def test_below_low_fills_to_low_and_above_high_drains_to_high():
    segs = [seg(i, 2) for i in range(10)] + [seg(10, 1)]
    after, _ = settle(segs, two(), 0.3, 0.7)
    assert sum(s.tier == 1 for s in after) == 3
    segs = [seg(i, 1) for i in range(9)]
    after, _ = settle(segs, two(), 0.3, 0.7, merge=False)
    assert sum(s.tier == 1 for s in after) == 7


# -- pool files, unmovable segments, sizes -----------------------------------------------------

def test_pmem_capacity_is_counted_in_pool_files():
    segs = [seg(i, 1, nbytes=MB // 10) for i in range(6)]
    moves = plan_moves(segs, tier_views(segs, [(8 * MB, MB), (0, 0)]), 0.5, 0.5, MB,
                       merge=False)
    assert len(moves) == 2  # 6 files of 8 in use; 4 is the threshold


def test_small_segments_below_come_up_one_pool_file_each():
    segs = [seg(i, 2, nbytes=MB // 10) for i in range(10)]
    moves = plan_moves(segs, tier_views(segs, [(8 * MB, MB), (0, 0)]), 0.5, 0.5, MB)
    assert [m.segments for m in moves] == [("0-9",), ("0-8",), ("0-7",), ("0-6",)]


def test_active_segments_never_move():
    segs = [seg(i, 1, sealed=False) for i in range(10)]
    assert plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB) == []
    segs = [seg(i, 2, sealed=False) for i in range(3)]
    assert plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, 4 * MB) == []


def test_unmovable_segments_count_in_their_tier_but_not_in_the_order():
    # Three segments held on tier 1 (active, or waiting for a writer's commit) take three of
    # its five threshold megabytes: two movable ones may stay.
    segs = [seg(i, 1) for i in range(6)] + [seg(10 + p, 1, p=p, sealed=False)
                                            for p in range(1, 4)]
    after, _ = settle(segs, two(), merge=False)
    assert sorted(s.seq for s in after if s.tier == 1 and s.sealed) == [4, 5]
    assert all(s.tier == 1 for s in after if not s.sealed)
    # A held segment on tier 2, newer than everything, does not pull its partition down.
    segs = [seg(i, 1) for i in range(4)] + [seg(9, 2, sealed=False)]
    assert plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, MB) == []


def test_a_segment_too_big_for_a_pool_file_keeps_its_partition_older_ones_off_that_tier():
    pool = MB
    segs = [seg(9, 2, nbytes=2 * MB, ts=9),  # newest of partition 0: no pool file holds it
            seg(8, 2, nbytes=MB // 2, ts=8), seg(7, 1, nbytes=MB // 2, ts=7),
            seg(1, 2, nbytes=MB // 2, ts=1, p=1), seg(2, 2, nbytes=MB // 2, ts=2, p=1)]
    after, plans = settle(segs, [(8 * MB, pool), (0, 0)], merge=False)
    assert where(after) == {"t/0-9": 2, "t/0-8": 2, "t/0-7": 2, "t/1-1": 1, "t/1-2": 1}
    assert not order_violations(after)
    # Seen through file_bytes too (a header and aligned chunks): the same.
    segs = [dataclasses.replace(s, bytes=MB - 100, file_bytes=MB + 10) if s.id == "0-9" else s
            for s in segs]
    after, _ = settle(segs, [(8 * MB, pool), (0, 0)], merge=False)
    assert where(after)["t/0-9"] == 2 and where(after)["t/0-8"] == 2


def test_a_segment_on_a_pool_tier_stays_possible_there_whatever_its_estimate():
    segs = [seg(i, 1, nbytes=MB - 100, file_bytes=MB + 10) for i in range(3)]
    assert plan_moves(segs, tier_views(segs, [(8 * MB, MB), (0, 0)]), 0.5, 0.5, MB) == []


def test_a_late_commit_to_an_older_segment_does_not_break_the_partition_order():
    # Two writers: segment 1's last chunk was committed after segment 2's.
    segs = [seg(0, 2, ts=0), seg(1, 2, ts=50), seg(2, 2, ts=40), seg(3, 2, ts=45),
            seg(0, 2, ts=47, p=1), seg(1, 2, ts=48, p=1)]
    after, _ = settle(segs, two(6 * MB), merge=False)  # room for three
    assert not order_violations(after)
    assert sorted(s.id for s in after if s.tier == 1) == ["0-1", "0-2", "0-3"]


# -- merging -----------------------------------------------------------------------------------

def test_demotion_merges_adjacent_small_segments_of_a_partition():
    segs = [seg(i, 1, nbytes=MB // 2) for i in range(16)] + \
        [seg(100 + i, 1, nbytes=MB // 2, p=1, ts=i) for i in range(4)]
    moves = plan_moves(segs, tier_views(segs, two()), 0.2, 0.2, 2 * MB)
    assert all(m.down for m in moves)
    assert all(sum(1 for _ in m.segments) <= 4 for m in moves)
    assert any(len(m.segments) > 1 for m in moves)
    for m in moves:  # each merge is one partition, consecutive sequence numbers
        seqs = [int(s.split("-")[1]) for s in m.segments]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert len({s.split("-")[0] for s in m.segments}) == 1
    after = apply(segs, moves, 2 * MB)
    assert not order_violations(after)
    assert plan_moves(after, tier_views(after, two()), 0.2, 0.2, 2 * MB) == []


def test_merges_join_only_segments_going_to_the_same_tier_and_fit_a_pool_file():
    segs = [seg(i, 1, nbytes=MB // 8, file_bytes=MB // 4) for i in range(12)]
    spec = [(4 * MB, MB), (MB, 0), (0, 0)]
    moves = plan_moves(segs, tier_views(segs, spec), 0.5, 0.5, MB)
    for m in moves:
        assert len(m.segments) <= 4  # four files of a quarter pool file each
    targets = {m.target for m in moves}
    assert targets == {2, 3}
    after = apply(segs, moves, MB)
    assert not order_violations(after)
    assert plan_moves(after, tier_views(after, spec), 0.5, 0.5, MB) == []


def test_moves_name_demotions_oldest_first_then_promotions_newest_first():
    segs = [seg(i, 1) for i in range(5)] + [seg(10 + i, 2) for i in range(3)]
    moves = plan_moves(segs, tier_views(segs, two()), 0.5, 0.5, MB, merge=False)
    assert [m.segments[0] for m in moves] == ["0-0", "0-1", "0-2", "0-12", "0-11", "0-10"]
    assert all(isinstance(m, Move) for m in moves)


# -- any state ---------------------------------------------------------------------------------

SEG = 1 << 16  # log.segment.bytes of the random states: the pool file size too


@st.composite
def states(draw):
    ntiers = draw(st.integers(2, 3))
    spec = [(draw(st.integers(2, 12)) * SEG, SEG if draw(st.booleans()) else 0)]
    if ntiers == 3:
        spec.append((draw(st.sampled_from([0, 4 * SEG, 8 * SEG, 16 * SEG])), 0))
    spec.append((0, 0))
    low = draw(st.sampled_from([0.0, 0.2, 0.3, 0.5, 0.7]))
    high = draw(st.sampled_from([x for x in (0.3, 0.5, 0.7, 0.9, 1.0) if x >= low]))
    segs = []
    clock = 0
    for topic in ("a", "b")[:draw(st.integers(1, 2))]:
        for p in range(draw(st.integers(1, 3))):
            n = draw(st.integers(0, 8))
            for i in range(n):
                clock += draw(st.integers(0, 3))
                late = draw(st.integers(0, 4)) if draw(st.integers(0, 5)) == 0 else 0
                # SEG - 2048: a pool file holds it, but its estimated file size is above.
                nbytes = draw(st.sampled_from([SEG // 16, SEG // 4, SEG // 2, SEG - 4096,
                                               SEG - 2048, SEG + 1000, 2 * SEG]))
                file_bytes = nbytes + 4096
                tier = draw(st.integers(1, ntiers))
                if spec[tier - 1][1] and nbytes > SEG - 2048:
                    tier = ntiers  # a pool file cannot hold it
                sealed = i < n - 1 or draw(st.booleans())
                sealed = sealed and draw(st.integers(0, 9)) > 0
                segs.append(SegmentView(topic, f"{p}-{i}", p, i, tier, nbytes, clock + late,
                                        sealed, file_bytes))
    return segs, spec, low, high, draw(st.booleans())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states())
def test_any_state_after_one_plan_is_in_order_and_plans_nothing_more(state):
    segs, spec, low, high, merge = state
    moves = plan_moves(segs, tier_views(segs, spec), low, high, SEG, merge)
    after = apply(segs, moves, SEG if merge else None)
    assert not order_violations(after)
    assert plan_moves(after, tier_views(after, spec), low, high, SEG, merge) == []
    # Each bounded tier but the last holds at most high × capacity, or only what may not
    # move; segments on a pool tier fit a pool file.
    for t in tier_views(after, spec)[:-1]:
        held = [s for s in after if s.tier == t.number]
        fixed = sum(t.cost(s.bytes) for s in held if not s.sealed)
        if t.capacity:
            assert t.used <= max(high * t.capacity, fixed) + 1e-6
        if t.pool_file:
            moved_in = {(m.topic, m.segments[0]) for m in moves if m.target == t.number}
            assert all(s.file_size <= t.pool_file for s in held
                       if (s.topic, s.id) in moved_in)


# -- the order of a run's demotions ----------------------------------------------------------

def test_tier_one_drains_first_when_tier_two_has_room_and_the_lake_waits():
    from migration.policy import demotion_phases
    # Tier 1 (4 MB) full, tier 2 (8 MB) over its threshold with room for two more segments,
    # tier 3 unbounded (a lake): the plan moves 2 down from each of tiers 1 and 2.
    segs = [seg(i, 3) for i in range(2)] + [seg(i, 2) for i in range(2, 8)] + \
        [seg(i, 1) for i in range(8, 12)]
    tiers = tier_views(segs, [(4 * MB, 0), (8 * MB, 0), (0, 0)])
    moves = plan_moves(segs, tiers, 0.5, 0.5, MB, merge=False)
    assert {(m.source, m.target) for m in moves} == {(1, 2), (2, 3)}
    phases = demotion_phases(moves, tiers)
    assert [[(m.source, m.target) for m in p] for p in phases] == [
        [(1, 2), (1, 2)], [(2, 3)] * 4]
    assert sorted(map(repr, (m for p in phases for m in p))) == sorted(map(repr, moves))


def test_a_demotion_without_room_on_its_target_waits_for_the_slower_tier_to_make_it():
    from migration.policy import demotion_phases
    # Tier 2 is full: tier 1's demotions wait until tier 2 passed its oldest to tier 3.
    segs = [seg(i, 2) for i in range(8)] + [seg(i, 1) for i in range(8, 12)]
    tiers = tier_views(segs, [(4 * MB, 0), (8 * MB, 0), (0, 0)])
    moves = plan_moves(segs, tiers, 0.5, 0.5, MB, merge=False)
    phases = demotion_phases(moves, tiers)
    assert [{(m.source, m.target) for m in p} for p in phases] == [{(2, 3)}, {(1, 2)}]
    # A promotion is never a demotion's batch.
    assert demotion_phases([Move("t", ("0-1",), 2, 1, MB)], tiers) == []
