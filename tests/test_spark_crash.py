"""Spark jobs in their own processes: a streaming query killed with SIGKILL mid-batch and
restarted from its checkpoint, and a job on local-cluster with two executor processes."""

import os
import signal
import subprocess
import time

from tier_store import Store

from .conftest import PYTHON, ROOT, SCHEMA, read_all
from .support import fill_keyed

N = 120_000


def _job(*args, env=None):
    return subprocess.Popen([PYTHON, "-m", "tests.spark_job", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)


def _kill_group(p):
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(30)


def _fill(root):
    fill_keyed(root, "src", N, partitions=3, per_append=5000)


def _dst_keys(root):
    t = Store.open(root).topic("dst")
    keys = []
    for p in range(t.partitions):
        keys += read_all(t, p)
        assert t.latest_offsets()[p] == len(read_all(t, p))  # gapless
    return sorted(keys)


def test_streaming_query_killed_mid_batch_and_restarted_ends_with_output_equal_to_input(
        tmp_path):
    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    _fill(root)
    p = _job("stream", root, ckpt, "local[2]", "processingTime")
    deadline = time.time() + 180
    while time.time() < deadline and p.poll() is None:
        s = Store.open(root)
        if "dst" in s.topics() and sum(s.topic("dst").latest_offsets().values()) >= 20_000:
            _kill_group(p)  # the driver JVM and its Python workers, mid-stream
            break
        time.sleep(0.05)
    assert p.returncode == -signal.SIGKILL
    partial = _dst_keys(root)
    assert 20_000 <= len(partial) < N
    r = _job("stream", root, ckpt, "local[2]", "availableNow")
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err[-3000:]
    assert _dst_keys(root) == list(range(N))  # no loss, no duplicate


def test_a_batch_whose_sink_commit_landed_before_a_crash_is_not_appended_twice(tmp_path):
    root, ckpt = tmp_path / "store", tmp_path / "ckpt"
    _fill(root)
    Store.open(root).create_topic("dst", SCHEMA, partitions=3)
    # The first entry any process publishes is the sink's commit of batch 0: it dies right
    # after the entry is linked, before Spark records the batch as committed.
    env = dict(os.environ, PAFKA_CRASH_POINT="log.publish.linked", PAFKA_CRASH_AFTER="0")
    p = _job("stream", root, ckpt, "local[2]", "processingTime", env=env)
    try:
        p.wait(180)
    except subprocess.TimeoutExpired:
        _kill_group(p)
    assert p.returncode != 0
    assert sum(Store.open(root).topic("dst").latest_offsets().values()) == 5_000
    r = _job("stream", root, ckpt, "local[2]", "availableNow")
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err[-3000:]
    assert _dst_keys(root) == list(range(N))


def test_local_cluster_with_two_executor_processes(tmp_path):
    r = _job("cluster", tmp_path / "store")
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULT"))
    got = dict(kv.split("=") for kv in line.split()[1:])
    assert got["executors"] == "2" and int(got["pids"]) >= 2  # Python workers of 2 JVMs
    n = 40_000
    assert (int(got["count"]), int(got["sum"])) == (n, n * (n - 1) // 2)
    assert (int(got["copied_count"]), int(got["copied_sum"])) == (n, n * (n - 1) // 2)
