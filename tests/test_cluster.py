"""Spark on two simulated hosts writing and reading a store shared through a real radosgw.

Each executor runs on its own host (tests/hosts.py): its own network namespace, its own tier 1
at the path every host uses. The driver is host 0. The store's root and its shared tier are on
a Ceph radosgw listening on the hosts' bridge. Jobs are in tests/cluster_pafka.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

import pytest

from tier_store import Store

from .hosts import SimulatedHosts, missing_tools
from .s3server import S3Server, missing_binaries

pytestmark = pytest.mark.skipif(
    bool(missing_tools() or missing_binaries()),
    reason=f"two simulated hosts need root, ip, unshare, mount and Ceph: "
           f"{', '.join(missing_tools() + missing_binaries())}")


# Longer than any batch here (a commit of chunks shared longer ago is refused), short enough
# to wait for what a killed task left to be reclaimed.
GRACE_MS = 12_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(hosts, the server's AWS variables, a store root and its configuration)."""
    with SimulatedHosts(2) as hosts:
        server = S3Server.start(host=hosts.bridge_address)
        try:
            bucket = server.new_bucket()
            base = tmp_path_factory.mktemp("cluster")
            conf = {"storage.tiers.types": "NVME,REMOTE",
                    "storage.tiers.first.paths": hosts.tier1,
                    "storage.tiers.second.paths": f"s3://{bucket}/shared",
                    "log.segment.bytes": "1m", "log.cleanup.grace.ms": str(GRACE_MS)}
            yield hosts, server.env, f"s3://{bucket}/store", conf, base
        finally:
            server.close()


def _run(cluster, target: str, *args: str, timeout: float = 300) -> dict:
    hosts, env, _, _, base = cluster
    stats = os.path.join(base, "stats")
    os.makedirs(stats, exist_ok=True)
    # Executors get the S3 variables as a cluster gives them: through spark.executorEnv.
    conf = {"spark.executorEnv.PAFKA_READ_STATS": stats,
            **{f"spark.executorEnv.{k}": v for k, v in env.items()}}
    return hosts.run_driver(f"tests.cluster_pafka:{target}", list(args), env=env, conf=conf,
                            timeout=timeout)


def _read(cluster, topic: str) -> dict:
    _, _, root, conf, base = cluster
    return _run(cluster, "read", root, json.dumps(conf), topic, os.path.join(base, "stats"))


def test_a_batch_and_a_streaming_write_read_back_exact_from_both_hosts(cluster):
    hosts, _, root, conf, base = cluster
    n = 20_000
    _run(cluster, "write", root, json.dumps(conf), "clicks", str(n))
    _run(cluster, "stream_copy", root, json.dumps(conf), "clicks", "copy",
         os.path.join(base, "ckpt"))
    expect = {"rows": n, "sum": n * (n - 1) // 2}
    for topic in ("clicks", "copy"):
        got = _read(cluster, topic)
        assert {k: got[k] for k in expect} == expect, got
        # Both hosts read; each found some chunks on its own tier 1 and read the rest from
        # the shared tier (no locality hint: about half and half).
        assert got["hosts"] == ["host-1", "host-2"], got
        assert got["local_chunks"] > 0 and got["remote_chunks"] > 0, got
    # The streaming copy's checkpoint makes a second run append nothing.
    _run(cluster, "stream_copy", root, json.dumps(conf), "clicks", "copy",
         os.path.join(base, "ckpt"))
    got = _read(cluster, "copy")
    assert {k: got[k] for k in expect} == expect, got


def test_a_host_that_loses_its_tier_1_leaves_every_read_exact(cluster):
    hosts, _, root, conf, _ = cluster
    n = 8_000
    _run(cluster, "write", root, json.dumps(conf), "wiped", str(n))
    for name in os.listdir(hosts.tier1_dir(1)):
        shutil.rmtree(os.path.join(hosts.tier1_dir(1), name), ignore_errors=True)
    got = _read(cluster, "wiped")
    assert (got["rows"], got["sum"]) == (n, n * (n - 1) // 2), got


def _executor_pids(host: int) -> list[int]:
    """Java executors whose environment names simulated host ``host``."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if f"PAFKA_HOST_ID=host-{host}".encode() in env and b"CoarseGrainedExecutor" in cmd:
            out.append(int(pid))
    return out


def test_an_executor_killed_mid_write_loses_nothing_committed(cluster, monkeypatch):
    hosts, env, root, conf, _ = cluster
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    n = 600_000
    _run(cluster, "write", root, json.dumps(conf), "killed", "1000")
    result: dict = {}

    def write() -> None:
        try:
            result["value"] = _run(cluster, "write", root, json.dumps(conf), "killed", str(n),
                                   "8", timeout=400)
        except Exception as e:  # noqa: BLE001 (reported below)
            result["error"] = e

    job = threading.Thread(target=write)
    job.start()
    # Kill host 2's executor once its tasks are writing this job's chunks.
    deadline, killed = time.monotonic() + 240, []
    seg_dir = os.path.join(hosts.tier1_dir(2), "killed")
    while time.monotonic() < deadline and not killed:
        sizes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(seg_dir)
                    for f in fs)
        if sizes > 4 << 20:
            for pid in _executor_pids(2):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.2)
    job.join(420)
    assert killed, "host 2's executor was never seen writing"
    # The job either succeeded on the retried tasks, or failed: either way nothing half-done.
    got = _read(cluster, "killed")
    base_sum = 1000 * 999 // 2
    if "value" in result:
        assert (got["rows"], got["sum"]) == (1000 + n, base_sum + n * (n - 1) // 2), got
    else:
        assert (got["rows"], got["sum"]) == (1000, base_sum), (got, result["error"])
    # What the killed tasks uploaded and never committed is reclaimed after the grace period;
    # every object left is one the log names.
    with Store.open(root, {**conf}, create=False) as s:
        topic = s.topic("killed")
        shared = s.shared
        fs = shared.tier.fs
        bundle_dir = shared.bundle_dir("killed", topic.id)
        # Uploaded over a grace period ago, then seen unreferenced for one more: reclaimed.
        time.sleep(GRACE_MS / 1000 + 0.5)
        s.collect_garbage(topic, bundles=True)
        time.sleep(GRACE_MS / 1000 + 0.5)
        s.collect_garbage(topic, bundles=True)
        left = {p.rsplit("/", 1)[-1].split(".")[0] for p in fs.ls(bundle_dir, refresh=True)}
        named = set()
        for p in range(topic.partitions):
            rows = topic.state().part(p).chunks.rows()
            named |= {f"{int(h):016x}{int(lo):016x}" for h, lo, o in
                      zip(rows["obj_hi"], rows["obj_lo"], rows["opos"], strict=True) if o >= 0}
        assert left == named
