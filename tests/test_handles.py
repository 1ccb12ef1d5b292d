"""Handles: a store or topic handle dropped without close() releases what it holds (segment
writers' descriptors, PMEM mappings, their pins) once the cycle collector frees it, so a
process that opens the store again for each append does not run out of descriptors.

Counted in a child process, from /proc/self/fd, /proc/self/maps and /proc/locks; the
process's own caches (the read mappings, one descriptor per partition's lock file) are not
the handles'."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import threading
import time

import pytest

from .conftest import PYTHON, ROOT
from .support import pmem_hdd_config

HANDLES = 300

_CHILD = """
import gc, json, os, sys, time
from tier_store import MAPS, Store
from tests.conftest import SCHEMA, make_batch

root, config, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])

def count():
    pid = str(os.getpid())
    with open("/proc/locks") as f:
        locks = sum(1 for line in f if pid in line.split())
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    return {"fds": len(os.listdir("/proc/self/fd")), "maps": maps, "locks": locks}

def held(settled=None):
    # The process's cache of read mappings (at most 256, each dropped after 5 s unused) is
    # the same whatever the handles: emptied, to count what the handles hold. Collected
    # handles' writers are closed on a thread of their own (tier_store.dropped): counted
    # once that is done, or after 10 s.
    MAPS.clear()
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        now = count()
        if settled is None or all(now[k] <= settled[k] + 5 for k in now) \
                or time.monotonic() > deadline:
            return now
        time.sleep(0.05)

s = Store.open(root, config)
s.create_topic("t", SCHEMA, partitions=2)
s.close()
def cycle(i):
    s = Store.open(root)  # and never closed
    t = s.topic("t")
    t.append(make_batch(i * 10, 10), partition=i % 2)
    if i % 3 == 0:
        assert sum(b.num_rows for b in t.read(i % 2, 0)) > 0

# Once first: what the process loads or starts once (libraries, its threads) is not counted.
for i in range(3):
    cycle(i)
before = held()
for i in range(3, n):
    cycle(i)
after = held(before)
rows = sum(b.num_rows for p in (0, 1) for b in Store.open(root).topic("t").read(p, 0))
print(json.dumps({"before": before, "after": after, "rows": rows}))
"""


@pytest.mark.parametrize("tier", ["file", "pmem", "pmem-forced"])
def test_handles_dropped_without_close_release_descriptors_mappings_and_locks(
        tier, tmp_path, shm_dir):
    config = {"log.segment.bytes": "64k"} if tier == "file" else \
        pmem_hdd_config(shm_dir, **{"storage.tiers.first.sizes": "4m"})
    # A checkpoint every other commit: the warm-up starts the maintenance thread that writes
    # them (a thread the process starts once), and dropped handles meet pending checkpoints.
    config["log.checkpoint.interval"] = 2
    env = dict(os.environ)
    if tier == "pmem-forced":  # libpmem's PMem path: the writer holds a mapping, no fd
        env["PMEM_IS_PMEM_FORCE"] = "1"
    r = subprocess.run([PYTHON, "-c", _CHILD, str(tmp_path / "store"), json.dumps(config),
                        str(HANDLES)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    print(tier, got)
    assert got["rows"] == HANDLES * 10
    for what in ("fds", "maps", "locks"):
        assert got["after"][what] <= got["before"][what] + 5, (what, got)


def test_a_dropped_handle_is_released_off_the_collecting_thread(tmp_path, monkeypatch):
    """The collector finalizes a dropped handle on whatever thread it runs: that thread does
    not wait for the flush of the handle's unsynced chunks, another thread does it."""
    from tier_store import Store

    from .conftest import SCHEMA, make_batch
    from .support import fds_on, record_fsyncs

    s = Store.open(tmp_path / "s", {"log.segment.bytes": "64k"})
    s.create_topic("t", SCHEMA, partitions=1).write_chunks(make_batch(0, 100), durable=False)
    seg = os.path.join(s.tier(1).path, "t", "0", "00000000000000000000.seg")

    def open_on_segment() -> int:
        return fds_on(seg)

    assert open_on_segment() == 1
    calls = record_fsyncs(monkeypatch)
    del s
    gc.collect()
    deadline = time.monotonic() + 10
    while open_on_segment() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert open_on_segment() == 0
    assert (threading.current_thread().name, seg) not in calls
    assert ("pafka-release", seg) in calls  # the unsynced chunk was flushed, there


def _limited(soft: int, hard: int):
    def preexec():
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return preexec


def test_store_wide_commands_work_past_a_low_soft_limit_of_open_files(tmp_path):
    # A handle holds a descriptor per topic it opens (its log directory): with the common
    # soft limit of 1,024, `pafka topics` failed on a store of some hundreds of topics.
    import resource

    import pyarrow as pa

    from tier_store import Store
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit of open files is {hard} here")
    store = Store.open(str(tmp_path / "s"))
    schema = pa.schema([("key", pa.int64())])
    for i in range(300):
        store.create_topic(f"t{i}", schema, partitions=1).close()
    store.close()
    pafka = os.path.join(os.path.dirname(PYTHON), "pafka")
    ok = subprocess.run([pafka, "topics", str(tmp_path / "s")], capture_output=True, text=True,
                        preexec_fn=_limited(64, hard), timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert len(ok.stdout.splitlines()) == 300
    # A hard limit that low stays a limit: the error says which one to raise.
    low = subprocess.run([pafka, "topics", str(tmp_path / "s")], capture_output=True,
                         text=True, preexec_fn=_limited(64, 64), timeout=300)
    assert low.returncode == 1
    assert "Too many open files" in low.stderr and "hard limit, now 64" in low.stderr
