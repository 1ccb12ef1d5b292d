"""The migration service on real stores (the policy on built states: test_policy.py)."""

import json
import logging
import os
import subprocess
import threading
import time

import pytest

from migration import MigrationService
from migration.service import read_stats
from tier_store import DataLoss, Store, check_topic, relocate_tier, seal_idle
from tier_store.commit_log import CommitLog
from tier_store.entries import ConfigEntry
from tier_store.layout import log_dir

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import open_pmem_hdd


def _store(tmp_path, shm_dir, **extra):
    return open_pmem_hdd(tmp_path, shm_dir, **{
        "log.cleanup.grace.ms": 0, "storage.migrate.threshold": 0.5, **extra})


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


def test_each_demotion_gives_its_pool_file_back_before_the_next_starts(tmp_path, shm_dir):
    # A run of demotions at an HDD's pace lasts many seconds; producers in a burst need the
    # pool files it frees during the run, not at its end. The grace period stays long:
    # only the pins of readers may hold a pool file back.
    s = _store(tmp_path, shm_dir, **{"log.cleanup.grace.ms": 600_000,
                                     "storage.migrate.threads": 1})
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    free_before: list[int] = []
    move = s.move_segment

    def watched(*args, **kwargs):
        free_before.append(next(u for u in s.tier_usage() if u["tier"] == 1)["pool_free"])
        return move(*args, **kwargs)

    s.move_segment = watched
    done = MigrationService(s).run_once()
    assert len(done) >= 3 and all(r.to_tier == 2 for r in done)
    assert free_before == list(range(free_before[0], free_before[0] + len(done)))
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(24000))


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
    from tier_store import check_topic
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


# -- the freshness order on real stores ---------------------------------------------------------

def order_violations(topic):
    """Pairs of sealed segments of one partition where the one on the slower tier holds the
    higher offsets (what the freshness order forbids)."""
    segs = [x for x in topic.segments() if x.sealed]
    return [(f"{a.id}@{a.tier}", f"{b.id}@{b.tier}") for a in segs for b in segs
            if a.partition == b.partition and a.tier > b.tier
            and a.base_offset > b.base_offset]


def settle(svc, runs=6, pause=0.0):
    """Run the service until a run makes no move; returns the moves of every run."""
    history = []
    for _ in range(runs):
        done = svc.run_once()
        history.append(done)
        if not done:
            return history
        time.sleep(pause)
    raise AssertionError(f"the service did not settle in {runs} runs: {history[-1]}")


def test_after_an_overflow_the_service_swaps_in_one_run_and_then_moves_nothing(tmp_path,
                                                                            shm_dir):
    # Written with migration off: tier 1 (16 pool files) fills with the oldest segments and
    # the newest overflow to tier 2, where Pafka's rule left them.
    s = _store(tmp_path, shm_dir, **{"storage.migrate.threshold": -1})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(240):
        t.append(make_batch(i * 200, 200), partition=i % 2)
    assert {x.tier for x in t.segments()} == {1, 2} and order_violations(t)
    svc = MigrationService(Store.open(s.root, {"storage.migrate.threshold": 0.5}))
    history = settle(svc)
    assert len(history) == 2  # one run swaps, the next finds nothing to do
    first = history[0]
    assert any(r.to_tier == 1 for r in first) and any(r.to_tier == 2 for r in first)
    after = Store.open(s.root).topic("t")
    assert not order_violations(after)
    assert sum(x.tier == 1 for x in after.segments()) <= 8  # the threshold: 8 of 16 files
    for p in range(2):
        assert read_all(after, p) == [k for i in range(p, 240, 2)
                                      for k in range(i * 200, i * 200 + 200)]
    assert check_topic(after).ok


def test_promotions_onto_a_full_pool_wait_for_freed_files_instead_of_failing(tmp_path,
                                                                            shm_dir):
    # Every pool file is taken; those the demotions free may only come back after the grace
    # period (or once no reader pins them): a promotion that finds none waits for a run.
    s = _store(tmp_path, shm_dir, **{"storage.migrate.threshold": -1,
                                     "log.cleanup.grace.ms": 1000})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(240):
        t.append(make_batch(i * 200, 200), partition=i % 2)
    assert next(u for u in s.tier_usage() if u["tier"] == 1)["pool_free"] == 0
    svc = MigrationService(Store.open(s.root, {"storage.migrate.threshold": 0.5}))
    settle(svc, pause=1.1)
    assert svc.stats.failed_moves == 0
    assert svc.stats.segments_up > 0 and not order_violations(Store.open(s.root).topic("t"))


def test_a_band_on_file_tiers_settles_in_order_and_stays_settled(tmp_path):
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
            "storage.tiers.first.sizes": "1m", "log.segment.bytes": "64k",
            "log.cleanup.grace.ms": 0, "storage.migrate.threshold.low": 0.3,
            "storage.migrate.threshold.high": 0.6, "storage.migrate.threshold": 0.5}
    s = Store.open(tmp_path / "store", {**conf, "storage.migrate.threshold": -1})
    a = s.create_topic("a", SCHEMA, partitions=2)
    b = s.create_topic("b", SCHEMA)
    for i in range(150):  # unequal segments: two topics, batches of three sizes
        a.append(make_batch(i * 300, 100 + 100 * (i % 3)), partition=i % 2)
        if i % 3 == 0:
            b.append(make_batch(i * 300, 250))
    assert order_violations(a) and order_violations(b)  # the newest overflowed to tier 2
    svc = MigrationService(Store.open(s.root, conf))
    settle(svc)
    assert settle(svc) == [[]]
    for name in ("a", "b"):
        assert not order_violations(Store.open(s.root).topic(name))
    tier1 = next(v for v in svc.store.tier_usage() if v["tier"] == 1)
    assert tier1["used"] <= 0.6 * tier1["capacity"] + 2 * 64 * 1024  # + the active segments
    # Newer data on tier 1 than on tier 2 across topics too: age is the last commit time.
    segs = [x for name in ("a", "b") for x in Store.open(s.root).topic(name).segments()
            if x.sealed]
    assert min(x.last_timestamp for x in segs if x.tier == 1) >= \
        max(x.last_timestamp for x in segs if x.tier == 2)


def test_three_tiers_the_remote_tier_receives_only_the_oldest(tmp_path):
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD,REMOTE",
            "storage.tiers.first.sizes": "512k", "storage.tiers.2.sizes": "512k",
            "storage.tiers.3.paths": f"file://{tmp_path}/remote", "log.segment.bytes": "64k",
            "log.cleanup.grace.ms": 0, "storage.migrate.threshold": 0.5}
    s = Store.open(tmp_path / "store", conf)
    t = s.create_topic("t", SCHEMA)
    svc = MigrationService(s)
    for i in range(200):
        t.append(make_batch(i * 200, 200))
        if i % 20 == 19:
            svc.run_once()
    settle(svc)
    segs = [x for x in t.segments() if x.sealed]
    assert {x.tier for x in segs} == {1, 2, 3} and not order_violations(t)
    # Pafka's pairwise rule could leave the newest on the remote tier: one run fixes it.
    newest = sorted(segs, key=lambda x: x.base_offset)[-2:]
    for x in newest:
        s.move_segment(x.id, 3, topic="t")
    assert order_violations(t)
    history = settle(svc)
    assert len(history) == 2 and not order_violations(t)
    assert {x.id: x.tier for x in t.segments() if x.id in {n.id for n in newest}} == \
        {n.id: 1 for n in newest}
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(40000))


def test_a_writer_bursting_in_another_process_while_the_service_runs_ends_in_order(
        tmp_path, shm_dir):
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
            "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
            "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0,
            "log.cleanup.grace.ms": 500, "storage.migrate.threshold.low": 0.3,
            "storage.migrate.threshold.high": 0.6, "storage.migrate.threshold": 0.5}
    root = str(tmp_path / "store")
    Store.open(root, conf).create_topic("t", SCHEMA, partitions=2)
    ack = tmp_path / "acks"
    # A burst: 160 keyed appends of 300 rows (about 1.6 MB, 27 segments) for 16 pool files,
    # written faster than the service may copy (256 KiB/s): tier 1 overflows to tier 2.
    writer = subprocess.Popen([PYTHON, "-m", "tests.crash_writer", root, str(ack),
                               json.dumps(conf), "160", "2"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    svc = MigrationService(Store.open(root, {"storage.migrate.bytes.per.second": "256k",
                                             "storage.migrate.interval.ms": 50}))
    with svc:
        _, err = writer.communicate(timeout=60)
        assert writer.returncode == 0, err[-2000:]
        # Settled: two runs in a row without a move or a failed one (a promotion waits for
        # the pool files freed by demotions: they return to the pool after the grace period).
        deadline = time.time() + 30
        last, since = None, 0
        while time.time() < deadline:
            s = svc.stats
            now = (s.segments_down, s.segments_up, s.failed_moves)
            if now != last:
                last, since = now, s.runs
            elif s.runs >= since + 2:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the service did not settle after the burst: {svc.stats}")
    assert svc.plan() == []
    assert svc.stats.segments_down > 0
    assert svc.stats.segments_up > 0, "no overflow: the newest never sat on tier 2"
    t = Store.open(root).topic("t")
    assert not order_violations(t)
    acked = {0: 0, 1: 0}
    for line in ack.read_text().splitlines():
        p, _, n, _ = map(int, line.split())
        acked[p] += n
    keys = [read_all(t, p) for p in range(2)]
    assert [len(k) for k in keys] == [acked[0], acked[1]]
    assert sorted(keys[0] + keys[1]) == list(range(160 * 300))
    assert check_topic(t).ok


# -- retention ------------------------------------------------------------------------------

@pytest.mark.parametrize("threshold", [0.5, -1])
def test_the_service_applies_retention_to_an_idle_topic(tmp_path, threshold, caplog):
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k", "log.cleanup.grace.ms": 0,
                                        "storage.migrate.threshold": threshold})
    idle = s.create_topic("idle", SCHEMA, config={"log.retention.ms": 2500})
    kept = s.create_topic("kept", SCHEMA)  # the store's retention: seven days
    for i in range(8):  # about 4 segments each
        idle.append(make_batch(i * 1000, 1000))
        kept.append(make_batch(i * 1000, 1000))
    paths = {x.id: x.path for x in idle.segments()}
    n_idle, n_kept = len(paths), len(kept.segments())
    assert n_idle >= 3 and n_kept >= 3 and idle.earliest_offsets() == {0: 0}
    # A topic whose saved retention setting is unusable (a damaged config entry): its
    # retention fails, and must not keep the others from theirs.
    broken = s.create_topic("a-broken", SCHEMA, config={"log.retention.ms": 2500})
    broken.append(make_batch(0, 1000))
    CommitLog(log_dir(s.root, "a-broken"), "a-broken").publish(
        broken.version + 1, ConfigEntry(int(time.time() * 1000), {"log.retention.ms": "soon"}))
    last = idle.state().last_ts
    time.sleep(max(0.0, (last + 2600) / 1000 - time.time()))
    version = Store.open(s.root).topic("idle").version  # nothing committed since
    svc = MigrationService(Store.open(s.root))
    with caplog.at_level(logging.INFO, logger="migration.service"):
        svc.run_once()
    after = Store.open(s.root).topic("idle")
    segs = after.segments()
    assert len(segs) == 1 and after.version == version + 1  # the delete entry alone
    assert svc.stats.segments_deleted == n_idle - 1
    assert read_stats(s.root)["segments_deleted"] == n_idle - 1
    assert after.earliest_offsets() == {0: segs[0].base_offset} and segs[0].base_offset > 0
    assert read_all(after, 0, segs[0].base_offset) == list(range(segs[0].base_offset, 8000))
    with pytest.raises(DataLoss):
        read_all(after, 0, 0)
    assert [x.id for x in idle.segments()] == [segs[0].id]  # the caller's handle sees it
    assert len(Store.open(s.root).topic("kept").segments()) == n_kept
    messages = [r.getMessage() for r in caplog.records]
    assert any("retention deleted" in m and "idle/0-0" in m for m in messages), messages
    assert any("a-broken" in m and "retention failed" in m for m in messages), messages
    # The files are gone too (grace period 0): garbage collection ran after retention.
    assert [sid for sid, path in paths.items() if os.path.exists(path)] == [segs[0].id]
