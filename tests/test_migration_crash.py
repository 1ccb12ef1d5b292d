"""Moves killed with SIGKILL at each step, and moves under concurrent readers and writers."""

import os
import signal
import subprocess
import textwrap

import pytest

from migration import MigrationService
from tier_store import MAPS, Store, check_topic
from tier_store.crash import MOVE_POINTS

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import pmem_hdd_config

POINTS = MOVE_POINTS


def _conf(shm_dir, **extra):
    return pmem_hdd_config(shm_dir, **{
        "log.cleanup.grace.ms": 0, "storage.migrate.threshold": 0.25, **extra})


def _files(store):
    out = []
    for tier in store.tiers:
        out += [(tier.number, name) for _, name, _, _ in tier.partition_files("t")]
    return out


@pytest.mark.parametrize("point", POINTS)
def test_a_move_killed_at_any_step_loses_and_duplicates_nothing(tmp_path, shm_dir, point):
    s = Store.open(tmp_path, _conf(shm_dir))
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(120):
        t.append(make_batch(i * 200, 200), partition=i % 2)
    want = [read_all(t, p) for p in range(2)]
    MAPS.clear()  # this process's reads pin the pool files it mapped: none may stay pinned
    code = textwrap.dedent(f"""
        from migration import MigrationService
        from tier_store import Store
        MigrationService(Store.open({str(tmp_path)!r})).run_once()
    """)
    env = dict(os.environ, PAFKA_CRASH_POINT=point, PAFKA_CRASH_AFTER="1")
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    after = Store.open(tmp_path).topic("t")
    assert [read_all(after, p) for p in range(2)] == want
    assert check_topic(after).ok
    # The next run finishes the work and removes what the crash left behind.
    s2 = Store.open(tmp_path)
    MigrationService(s2).run_once()
    MigrationService(s2).run_once()
    t2 = s2.topic("t")
    assert [read_all(t2, p) for p in range(2)] == want
    assert check_topic(t2).ok
    live = {(x.tier, os.path.basename(x.path)) for x in t2.segments()}
    leftovers = [f for f in _files(s2) if f not in live]
    assert not leftovers, leftovers
    usage = {u["tier"]: u for u in s2.tier_usage()}
    assert usage[1]["pool_free"] + usage[1]["segments"] == usage[1]["pool_files"]


def test_moves_under_concurrent_readers_and_writers_in_other_processes(tmp_path, shm_dir):
    conf = _conf(shm_dir, **{"log.cleanup.grace.ms": 2000, "storage.tiers.first.sizes": "2m"})
    s = Store.open(tmp_path, conf)
    s.create_topic("t", SCHEMA, partitions=1)
    writer = textwrap.dedent(f"""
        from tier_store import Store
        from tests.conftest import make_batch
        t = Store.open({str(tmp_path)!r}).topic("t")
        for i in range(300):
            t.append(make_batch(i * 100, 100), partition=0)
    """)
    reader = textwrap.dedent(f"""
        import time
        from tier_store import Store
        t = Store.open({str(tmp_path)!r}).topic("t")
        pos, seen = 0, []
        deadline = time.time() + 120
        while pos < 30000 and time.time() < deadline:
            for b in t.read(0, pos):
                keys = b.column("key").to_pylist()
                seen.extend(keys)
                pos += len(keys)
        assert seen == list(range(30000)), (len(seen), seen[:5])
        print("ok", len(seen))
    """)
    procs = [subprocess.Popen([PYTHON, "-c", c], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in (writer, reader)]
    svc = MigrationService(Store.open(tmp_path, {"storage.migrate.interval.ms": 20}))
    moved = 0
    while procs[0].poll() is None:
        moved += len(svc.run_once())
    moved += len(svc.run_once())
    outs = [p.communicate(timeout=180) for p in procs]
    assert procs[0].returncode == 0, outs[0][1][-2000:]
    assert procs[1].returncode == 0 and "ok 30000" in outs[1][0], outs[1][1][-2000:]
    assert moved > 0
    t = Store.open(tmp_path).topic("t")
    assert read_all(t, 0) == list(range(30000)) and check_topic(t).ok
