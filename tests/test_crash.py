"""Crash tests: a real writer process kills itself with SIGKILL at a named crash point; the
store must reopen readable, with every acknowledged commit and nothing half-visible.

Each runs on a local root and on an ``s3://`` root (the commit log and checkpoints as objects
on the S3 server, the partition pointers in the host directory). On S3 the default run covers
every crash point with one kind of tier; the other kinds on S3 are marked ``s3_full``."""

import json
import os
import signal
import subprocess

import pytest

from tier_store import Store, check_topic
from tier_store.crash import POINTS

from .conftest import PYTHON, ROOT, make_batch
from .support import pmem_hdd_config

N_APPENDS = 40


KINDS = ["file", "file-direct", "pmem", "file-deferred", "pmem-deferred"]


def _cases():
    for point in POINTS:
        for kind in KINDS:
            yield pytest.param(kind, point, "local", id=f"{kind}-{point}-local")
        for kind in KINDS:
            marks = () if kind == "file" else (pytest.mark.s3_full,)
            yield pytest.param(kind, point, "s3", id=f"{kind}-{point}-s3", marks=marks)


def _conf(kind, tmp_path, shm_dir):
    base = {"log.segment.bytes": "64k", "log.checkpoint.interval": 5,
            "log.cleanup.grace.ms": 0}
    if kind == "file-direct":  # every chunk past the page cache, most sharing a block
        base["log.file.direct.bytes"] = "4k"
    if kind.startswith("pmem"):
        base.update(pmem_hdd_config(shm_dir, **{"storage.tiers.first.sizes": "8m"}))
    return base


def _run_writer(root, ack, conf, n, env_extra, start=0, deferred=False):
    env = dict(os.environ, **env_extra, CRASH_WRITER_START=str(start),
               CRASH_WRITER_DEFERRED="1" if deferred else "0")
    return subprocess.run([PYTHON, "-m", "tests.crash_writer", str(root), str(ack),
                           json.dumps(conf), str(n)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def _acknowledged(ack):
    if not os.path.exists(ack):
        return []
    with open(ack) as f:
        return [tuple(map(int, line.split())) for line in f if line.strip()]


def _keys(topic, p, start=0):
    return [k for b in topic.read(p, start) for k in b.column("key").to_pylist()]


@pytest.mark.parametrize("kind,point,store_root", list(_cases()), indirect=["store_root"])
def test_crash_at_each_point_loses_no_acknowledged_commit(tmp_path, shm_dir, kind, point,
                                                         store_root):
    root, ack = store_root.url, tmp_path / "ack"
    conf = store_root.config(_conf(kind, tmp_path, shm_dir))
    # Passes to survive first: past the first appends, and past the creation of each
    # partition's first segment (a roll with nothing to seal).
    after = {"checkpoint.write": 2, "checkpoint.pointer": 2, "segment.roll.sealed": 1,
             "segment.roll.created": 4}.get(point, 12)
    deferred = kind.endswith("-deferred")
    r = _run_writer(root, ack, conf, N_APPENDS,
                    {"PAFKA_CRASH_POINT": point, "PAFKA_CRASH_AFTER": str(after)},
                    deferred=deferred)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    acked = _acknowledged(ack)
    assert 0 < len(acked) < N_APPENDS * 2

    store = Store.open(root)
    topic = store.topic("t")
    latest = topic.latest_offsets()
    # Every acknowledged chunk is present with its exact records at its offsets.
    for p, base, n, first in acked:
        got = [k for b in topic.read(p, base, base + n) for k in b.column("key").to_pylist()]
        assert len(got) == n and all(first <= k < first + 300 for k in got)
    # Offsets are gapless and nothing is half-visible: every append is all there or absent.
    seen = {}
    for p in range(topic.partitions):
        keys = _keys(topic, p)
        assert len(keys) == latest[p]
        for k in keys:
            seen.setdefault(k, 0)
            seen[k] += 1
    assert all(v == 1 for v in seen.values())
    firsts = {k // 300 * 300 for k in seen}
    for f in firsts:
        assert all(seen.get(k) == 1 for k in range(f, f + 300)), f"append {f} is half visible"
    acked_firsts = {a[3] for a in acked}
    assert acked_firsts <= firsts and len(firsts - acked_firsts) <= 1
    report = check_topic(topic)
    assert report.ok, report.problems
    # The store keeps working after the crash: more appends, in a new process too.
    topic.append(make_batch(10**6, 300), key="key")
    r = _run_writer(root, tmp_path / "ack2", conf, 3, {}, start=2 * 10**6, deferred=deferred)
    assert r.returncode == 0, r.stderr[-2000:]
    again = Store.open(root).topic("t")
    total = sum(len(_keys(again, p)) for p in range(again.partitions))
    assert total == len(seen) + 4 * 300
    assert check_topic(again).ok


def test_a_crash_inside_a_multi_partition_write_makes_none_of_it_visible(tmp_path, shm_dir,
                                                                         store_root):
    root, ack = store_root.url, tmp_path / "ack"
    conf = store_root.config(_conf("file", tmp_path, shm_dir))
    # Survive 5 chunk copies, die in the 6th: inside the third append's chunks (two
    # partitions per append), after some of its chunks were written.
    r = _run_writer(root, ack, conf, 10, {"PAFKA_CRASH_POINT": "chunk.copy",
                                          "PAFKA_CRASH_AFTER": "5"})
    assert r.returncode == -signal.SIGKILL
    acked = _acknowledged(ack)
    assert len({a[3] for a in acked}) == 2
    topic = Store.open(root).topic("t")
    keys = sorted(k for p in range(topic.partitions) for k in _keys(topic, p))
    assert keys == list(range(600))
