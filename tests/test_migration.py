"""The migration policy on states built in memory, and the service on real stores."""

import logging
import os
import threading
import time

import pytest

from migration import MigrationService
from migration.policy import SegmentView, TierView, plan_moves
from migration.service import read_stats
from tier_store import DataLoss, Store, relocate_tier
from tier_store.moves import seal_idle

from .conftest import SCHEMA, make_batch, read_all

MB = 1 << 20


def seg(i, tier, nbytes=MB, ts=None, topic="t", p=0, sealed=True):
    return SegmentView(topic, f"{p}-{i}", p, i, tier, nbytes, i if ts is None else ts, sealed)


def tiers(used1, used2=0, cap1=10 * MB):
    return [TierView(1, cap1, used1), TierView(2, 0, used2)]


def test_above_threshold_the_oldest_sealed_segments_move_down_until_back_under():
    segs = [seg(i, 1) for i in range(8)]
    moves = plan_moves(segs, tiers(8 * MB), 0.5, 0.5, 4 * MB, merge=False)
    assert [m.segments for m in moves] == [("0-0",), ("0-1",), ("0-2",)]
    assert all(m.source == 1 and m.target == 2 for m in moves)


def test_below_threshold_the_newest_segments_of_tier_two_move_up_while_they_fit():
    segs = [seg(i, 2) for i in range(6)] + [seg(10, 1)]
    moves = plan_moves(segs, tiers(1 * MB, 6 * MB), 0.5, 0.5, 4 * MB)
    assert [m.segments for m in moves] == [("0-5",), ("0-4",), ("0-3",), ("0-2",)]
    assert all(not m.down for m in moves)


def test_at_the_threshold_nothing_moves():
    segs = [seg(i, 1) for i in range(5)] + [seg(10, 2)]
    assert plan_moves(segs, tiers(5 * MB, MB), 0.5, 0.5, 4 * MB) == []


def test_threshold_minus_one_disables_migration():
    segs = [seg(i, 1) for i in range(10)]
    assert plan_moves(segs, tiers(10 * MB), -1, -1, 4 * MB) == []


def test_empty_tier_two_and_nothing_to_promote():
    assert plan_moves([seg(0, 1)], tiers(MB), 0.5, 0.5, 4 * MB) == []


def test_active_segments_never_move():
    segs = [seg(i, 1, sealed=False) for i in range(10)]
    assert plan_moves(segs, tiers(10 * MB), 0.5, 0.5, 4 * MB) == []
    segs = [seg(i, 2, sealed=False) for i in range(3)]
    assert plan_moves(segs, tiers(0, 3 * MB), 0.5, 0.5, 4 * MB) == []


def test_demotion_merges_adjacent_small_segments_of_a_partition():
    segs = [seg(i, 1, nbytes=MB // 2) for i in range(16)] + \
        [seg(100 + i, 1, nbytes=MB // 2, p=1, ts=i) for i in range(4)]
    moves = plan_moves(segs, tiers(10 * MB), 0.2, 0.2, 2 * MB)
    assert all(m.down for m in moves)
    assert all(sum(1 for _ in m.segments) <= 4 for m in moves)
    assert any(len(m.segments) > 1 for m in moves)
    for m in moves:  # each merge is one partition, consecutive sequence numbers
        seqs = [int(s.split("-")[1]) for s in m.segments]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert len({s.split("-")[0] for s in m.segments}) == 1


def test_more_than_two_tiers_apply_the_rule_between_each_adjacent_pair():
    segs = [seg(i, 1) for i in range(8)] + [seg(20 + i, 2) for i in range(8)]
    ts = [TierView(1, 10 * MB, 8 * MB), TierView(2, 10 * MB, 8 * MB), TierView(3, 0, 0)]
    moves = plan_moves(segs, ts, 0.5, 0.5, MB, merge=False)
    down12 = [m for m in moves if (m.source, m.target) == (1, 2)]
    down23 = [m for m in moves if (m.source, m.target) == (2, 3)]
    assert len(down12) == 3 and down23
    # Tier 2 receives tier 1's oldest and passes on its own oldest.
    assert down23[0].segments == ("0-20",)


def test_pmem_capacity_is_counted_in_pool_files():
    t1 = TierView(1, 8 * MB, 6 * MB, pool_file=MB)
    segs = [seg(i, 1, nbytes=MB // 10) for i in range(6)]
    moves = plan_moves(segs, [t1, TierView(2, 0, 0)], 0.5, 0.5, MB, merge=False)
    assert len(moves) == 2  # 6 files of 8 in use; 4 is the threshold


def _simulate(low, high, cycles=20):
    """Tier 1 (10 MB) holds five 1 MB segments, tier 2 older ones. Each cycle a short-lived
    topic writes one segment to tier 1, the policy runs, retention deletes that segment, the
    policy runs. Returns how many times a segment went back the way it came."""
    segs = {f"{v.topic}-{v.id}": v for v in
            [seg(i, 2, topic="old", ts=-10 + i) for i in range(5)] +
            [seg(i, 1, topic="a", ts=i) for i in range(5)]}
    history: dict[str, list[int]] = {}

    def run_policy():
        views = list(segs.values())
        used1 = sum(v.bytes for v in views if v.tier == 1)
        used2 = sum(v.bytes for v in views if v.tier == 2)
        for m in plan_moves(views, tiers(used1, used2), low, high, MB, merge=False):
            for sid in m.segments:
                old = segs[f"{m.topic}-{sid}"]
                segs[f"{m.topic}-{sid}"] = SegmentView(old.topic, old.id, old.partition,
                                                       old.seq, m.target, old.bytes,
                                                       old.last_ts, old.sealed)
                history.setdefault(f"{m.topic}-{sid}", []).append(m.target)

    for c in range(cycles):
        burst = seg(c, 1, topic="short", ts=100 + c)
        segs[f"short-{burst.id}"] = burst
        run_policy()
        del segs[f"short-{burst.id}"]
        run_policy()
    return sum(max(0, len(h) - 1) for h in history.values())


def test_a_workload_that_thrashes_with_one_threshold_does_not_with_a_band():
    assert _simulate(0.5, 0.5) >= 10
    assert _simulate(0.3, 0.7) == 0


# -- the service on real stores -----------------------------------------------------------------

def _store(tmp_path, shm_dir, **extra):
    return Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
        "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
        "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0, "log.cleanup.grace.ms": 0,
        "storage.migrate.threshold": 0.5, **extra})


def test_service_demotes_above_threshold_and_reads_stay_exact(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA)
    for i in range(120):  # 16 pool files, 8 of them the threshold; 11 segments
        t.append(make_batch(i * 200, 200))
    svc = MigrationService(s)
    done = svc.run_once()
    assert done and all(r.to_tier == 2 for r in done)
    usage = {u["tier"]: u for u in s.tier_usage()}
    assert usage[1]["pool_files"] - usage[1]["pool_free"] <= 8
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(24000))
    stats = read_stats(s.root)
    assert stats["segments_down"] == svc.stats.segments_down > 0
    # Oldest went down: every segment left on tier 1 is newer than every one on tier 2.
    segs = t.segments()
    assert max(x.end_offset for x in segs if x.tier == 2) <= \
        min(x.base_offset for x in segs if x.tier == 1)


def test_service_promotes_the_newest_when_tier_one_is_below_threshold(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir, **{"storage.migrate.threshold": -1})
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    for x in [x for x in t.segments() if x.sealed]:
        s.move_segment(x.id, 2, topic="t")
    s2 = Store.open(s.root, {"storage.migrate.threshold": 0.5})
    done = MigrationService(s2).run_once()
    assert done and all(r.to_tier == 1 for r in done)
    segs = s2.topic("t").segments()
    up = [x for x in segs if x.tier == 1]
    assert min(x.base_offset for x in up) >= max(x.end_offset for x in segs if x.tier == 2)
    assert read_all(s2.topic("t"), 0) == list(range(24000))


def test_a_running_service_follows_a_relocated_tier(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    svc = MigrationService(s)
    assert svc.run_once()
    on_disk = len(os.listdir(tmp_path / "store" / "tier-2" / "t" / "0"))
    # Tier 2's directory moves while the service has the store open.
    os.rename(tmp_path / "store" / "tier-2", tmp_path / "hdd")
    relocate_tier(tmp_path / "store", 2, str(tmp_path / "hdd"))
    t2 = Store.open(s.root).topic("t")
    for i in range(120, 180):
        t2.append(make_batch(i * 200, 200))
    done = svc.run_once()
    assert done and all(r.to_tier == 2 for r in done)
    assert svc.store is not s and not svc.store.relocated() and s.relocated()
    assert len(os.listdir(tmp_path / "hdd" / "t" / "0")) > on_disk
    assert not (tmp_path / "store" / "tier-2").exists()
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(36000))
    # Stopping closes the handle the service opened itself (its topics' writers and maps).
    assert svc.store._topics
    svc.stop()
    assert not svc.store._topics


def test_two_services_at_once_never_both_move_a_segment(tmp_path, shm_dir):
    # A grace period longer than a move, as in any real configuration: a copy that another
    # service just linked is unreferenced until its entry is published.
    s = _store(tmp_path, shm_dir, **{"log.cleanup.grace.ms": 60_000})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(160):
        t.append(make_batch(i * 200, 200), partition=i % 2)
    a, b = MigrationService(Store.open(s.root)), MigrationService(Store.open(s.root))
    results = {}
    ths = [threading.Thread(target=lambda n=n, x=x: results.__setitem__(n, x.run_once()))
           for n, x in (("a", a), ("b", b))]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    moved = [src for r in results["a"] + results["b"] for src in r.sources]
    assert len(moved) == len(set(moved))
    for p in range(2):
        assert len(read_all(Store.open(s.root).topic("t"), p)) == 16000
    from tier_store.recovery import check_topic
    assert check_topic(Store.open(s.root).topic("t")).ok


def test_bandwidth_cap_slows_copying(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir, **{"storage.migrate.bytes.per.second": "1m"})
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    t0 = time.perf_counter()
    done = MigrationService(s).run_once()
    took = time.perf_counter() - t0
    moved = sum(r.bytes for r in done)
    assert moved > 200_000 and took >= 0.9 * moved / (1 << 20)


def test_service_thread_starts_and_stops(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir, **{"storage.migrate.interval.ms": 50})
    t = s.create_topic("t", SCHEMA)
    with MigrationService(s) as svc:
        for i in range(120):
            t.append(make_batch(i * 200, 200))
        deadline = time.time() + 20
        while svc.stats.segments_down == 0 and time.time() < deadline:
            time.sleep(0.05)
    assert svc.stats.segments_down > 0 and svc._thread is None
    assert read_all(t, 0) == list(range(24000))


def test_low_above_high_is_a_clear_error(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir, **{"storage.migrate.threshold.low": 0.8,
                                     "storage.migrate.threshold.high": 0.2})
    from tier_store import PafkaError
    with pytest.raises(PafkaError, match="threshold.low=0.8 is above"):
        MigrationService(s).run_once()
    assert os.path.isdir(s.root)


def test_a_missing_segment_file_stops_only_that_segment_from_migrating(tmp_path, shm_dir,
                                                                        caplog):
    s = _store(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    lost = t.segments()[0]  # the oldest: the first the policy moves down
    os.unlink(lost.path)  # as /dev/shm after a reboot
    svc = MigrationService(s)
    with caplog.at_level(logging.WARNING, logger="migration.service"):
        done = svc.run_once()
    warned = [r.getMessage() for r in caplog.records if lost.path in r.getMessage()]
    assert len(warned) == 1 and "t/" + lost.id in warned[0], warned
    assert done and lost.id not in [x for r in done for x in r.sources]
    assert read_stats(s.root)["runs"] == 1 and svc.stats.runs == 1
    after = Store.open(s.root).topic("t")
    assert read_all(after, 0, lost.end_offset) == list(range(lost.end_offset, 24000))
    with pytest.raises(DataLoss, match="missing"):
        read_all(after, 0, 0, lost.end_offset)
    # The next runs do not try it again at once (no warning each run, no hot loop).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="migration.service"):
        svc.run_once()
        svc.run_once()
    assert not [r for r in caplog.records if lost.path in r.getMessage()]
    assert svc.stats.runs == 3


def test_a_merge_holding_a_missing_segment_file_moves_its_other_segments(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA)
    for i in range(12):  # 12 small segments (12 of 16 pool files): the oldest merge down
        t.append(make_batch(i * 200, 200))
        seal_idle(t, 0, now_ms=t.state().last_ts + 1)
    t.append(make_batch(2400, 200))
    lost = t.segments()[1]
    os.unlink(lost.path)
    done = MigrationService(s).run_once()
    moved = [x for r in done for x in r.sources]
    assert "0-0" in moved and lost.id not in moved and len(moved) >= 4
    after = Store.open(s.root).topic("t")
    assert next(x for x in after.segments() if x.id == lost.id).tier == 1
    assert read_all(after, 0, lost.end_offset) == list(range(lost.end_offset, 2600))
    assert read_all(after, 0, 0, lost.base_offset) == list(range(lost.base_offset))


def test_a_missing_active_segment_file_does_not_stop_idle_sealing(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA, partitions=2)
    for p in range(2):
        t.append(make_batch(p * 100, 100), partition=p)
    os.unlink(next(x for x in t.segments() if x.partition == 0).path)
    assert seal_idle(t, 0, now_ms=t.state().last_ts + 1) == ["1-0"]
    assert read_all(t, 1) == list(range(100, 200))
