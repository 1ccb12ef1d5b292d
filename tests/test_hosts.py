"""The simulated hosts (tests/hosts.py): namespaces on a bridge, a tier 1 and a /dev/shm per
host, Spark executors on their own hosts, radosgw on the bridge, and no leftovers after a
SIGKILLed run."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from .conftest import ROOT
from .hosts import STATE_DIR, HostsError, SimulatedHosts, cleanup_stale, missing_tools

pytestmark = pytest.mark.skipif(bool(missing_tools()), reason="simulated hosts need root, ip, "
                                f"unshare and mount: {', '.join(missing_tools())}")
log = logging.getLogger(__name__)

# Run on a host: who it is, what its tier 1 and /dev/shm hold, and an echo from the driver.
LOOK = """
import json, os, socket, sys
tier1, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(os.path.join(tier1, "whoami")) as f:
    seen = f.read().strip()
with socket.create_connection((addr, port), timeout=10) as c:
    c.sendall(os.environ["PAFKA_HOST_ID"].encode())
    echo = c.recv(100).decode()
print(json.dumps({"id": os.environ["PAFKA_HOST_ID"], "hostname": socket.gethostname(),
                  "tier1": seen, "shm": sorted(os.listdir("/dev/shm")), "echo": echo}))
"""


@pytest.fixture(scope="module")
def hosts():
    with SimulatedHosts(2) as h:
        with open(os.path.join(h.tier1, "whoami"), "w") as f:
            f.write("host-0")
        for k in (1, 2):
            subprocess.run(h.command(k, ["sh", "-c", f"echo host-{k} > {h.tier1}/whoami && "
                                         f"touch /dev/shm/only-on-{k}"]), check=True)
        yield h


def _echo_server(addr: str) -> tuple[socket.socket, int]:
    server = socket.create_server((addr, 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"echo " + conn.recv(100))
    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]


def test_each_host_has_its_own_tier1_shm_name_and_address(hosts):
    server, port = _echo_server(hosts.bridge_address)
    with server:
        seen = {}
        for k in (1, 2):
            out = subprocess.run(hosts.command(k, [sys.executable, "-c", LOOK, hosts.tier1,
                                                   hosts.bridge_address, str(port)]),
                                 capture_output=True, text=True, timeout=30)
            assert out.returncode == 0, out.stderr
            seen[k] = json.loads(out.stdout)
    for k in (1, 2):
        assert seen[k] == {"id": f"host-{k}", "hostname": f"host-{k}", "tier1": f"host-{k}",
                           "shm": [f"only-on-{k}"], "echo": f"echo host-{k}"}
    with open(os.path.join(hosts.tier1, "whoami")) as f:
        assert f.read() == "host-0"  # the driver's own tier 1, at the same path
    assert not any(n.startswith("only-on-") for n in os.listdir("/dev/shm"))
    assert socket.gethostname() not in ("host-1", "host-2")
    assert len({hosts.address(k) for k in (0, 1, 2)}) == 3


def test_bad_input_is_refused_with_a_clear_error(hosts):
    with pytest.raises(ValueError, match="host 3: no such simulated host"):
        hosts.command(3, ["true"])
    with pytest.raises(ValueError, match="host 0: no such simulated host"):
        hosts.command(0, ["true"])
    with pytest.raises(ValueError, match="needs a program"):
        hosts.command(1, ["A=B", "true"])
    with pytest.raises(ValueError, match="environment 'A=B'"):
        hosts.command(1, ["true"], {"A=B": "x"})
    with pytest.raises(ValueError, match="must be an absolute path"):
        SimulatedHosts(2, tier1="relative/tier1")
    with pytest.raises(HostsError, match="not started"):
        SimulatedHosts(2).command(1, ["true"])


def test_spark_executors_run_on_their_own_hosts(hosts):
    t0 = time.monotonic()
    out = hosts.run_driver("tests.cluster_job:probe", [hosts.tier1, "4"], timeout=180)
    run = hosts.last_run
    log.info("cluster: started in %.1f s, probe job %.1f s, driver wall %.1f s (%s)",
             run["startup_s"], run["job_s"], time.monotonic() - t0, run["app_id"])
    tasks = out["tasks"]
    assert len(tasks) == 4
    by_host = {t["host_id"]: t for t in tasks}
    assert set(by_host) == {"host-1", "host-2"}, tasks  # both executors ran tasks
    for k in (1, 2):
        t = by_host[f"host-{k}"]
        assert (t["hostname"], t["tier1"]) == (f"host-{k}", f"host-{k}")
        assert f"only-on-{k}" in t["shm"] and f"only-on-{3 - k}" not in t["shm"]
    assert {t["pid"] for t in tasks} >= {by_host["host-1"]["pid"], by_host["host-2"]["pid"]}
    # Spark's own view: two executors at the hosts' addresses, the driver on the bridge.
    assert sorted(e.rsplit(":", 1)[0] for e in out["executors"]) == [hosts.address(1),
                                                                     hosts.address(2)]
    assert {m.rsplit(":", 1)[0] for m in out["memory_status"]} == {
        hosts.address(k) for k in (0, 1, 2)}
    with open(hosts.state["java_log"]) as f:
        launches = [json.loads(line) for line in f]
    log.info("executor argv as launched by the worker: %s", launches[0]["argv"][-16:])
    assert sorted(la["host"] for la in launches) == [1, 2]
    assert not os.path.exists(run["work_dir"])  # the workers' directory of the app
    # Nothing of the driver is left: no process carries the run's mark.
    assert [p for p in os.listdir("/proc") if p.isdigit() and _has_mark(p, hosts.prefix)] == []


FAKE_JAVA = """#!/bin/sh
echo "${PAFKA_HOST_ID:-none} $(hostname) ${SPARK_LOCAL_IP:-none} ${JAVA_HOME:-none} $*"
"""


def test_the_java_wrapper_puts_each_worker_on_its_host(hosts, tmp_path):
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(FAKE_JAVA)
    java.chmod(0o755)
    state = {**hosts.state, "java": str(java), "workers": str(tmp_path / "workers.json"),
             "java_log": str(tmp_path / "java.log")}
    (tmp_path / "state.json").write_text(json.dumps(state))
    wrapper = os.path.join(os.path.dirname(__file__), "hosts.py")

    def launch(worker: str, executor: int) -> list[str]:
        args = ["-cp", "x", "org.apache.spark.executor.CoarseGrainedExecutorBackend",
                "--executor-id", str(executor), "--hostname", hosts.bridge_address,
                "--worker-url", f"spark://Worker@{hosts.bridge_address}:{worker}"]
        out = subprocess.run([sys.executable, wrapper, "java", str(tmp_path / "state.json"),
                              *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    first, second, again = launch("7001", 0), launch("7002", 1), launch("7002", 2)
    for k, words in ((1, first), (2, second), (2, again)):
        assert words[:3] == [f"host-{k}", f"host-{k}", hosts.address(k)], words
        assert words[words.index("--hostname") + 1] == hosts.address(k)
        assert words[3] == str(tmp_path / "jdk")  # the real java's home, not the wrapper's
    other = subprocess.run([sys.executable, wrapper, "java", str(tmp_path / "state.json"),
                            "-version"], capture_output=True, text=True, timeout=30)
    words = other.stdout.split()  # not an executor: run as it is, in the root namespace
    assert (words[0], words[1], words[-1]) == ("none", socket.gethostname(), "-version"), words


def _netns_pids(hosts, k: int) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", hosts.state["netns"][k - 1]], text=True,
                          capture_output=True).stdout.split()


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_killed_driver_leaves_no_executor_behind(hosts):
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            hosts.run_driver("tests.cluster_job:hang", ["600"], timeout=150)
        except BaseException as e:  # handed to the test's thread
            errors.append(e)
    thread = threading.Thread(target=drive)
    thread.start()
    deadline = time.monotonic() + 120
    # Each host runs an executor and, once the tasks start, its Python worker.
    while not all(any("pyspark.daemon" in _cmdline(p) for p in _netns_pids(hosts, k))
                  for k in (1, 2)):
        assert thread.is_alive() and time.monotonic() < deadline, errors
        time.sleep(0.2)
    driver = [p for p in os.listdir("/proc") if p.isdigit() and _has_mark(p, hosts.prefix)
              and "tests.cluster_job" in _cmdline(p)]
    assert len(driver) == 1
    os.kill(int(driver[0]), signal.SIGKILL)
    thread.join(60)
    assert len(errors) == 1 and "failed (exit -9)" in str(errors[0]), errors
    assert _netns_pids(hosts, 1) == _netns_pids(hosts, 2) == []
    assert [p for p in os.listdir("/proc") if p.isdigit() and _has_mark(p, hosts.prefix)] == []
    assert errors[0].work_dir and not os.path.exists(errors[0].work_dir)  # the workers' logs


OWNER = """
import subprocess, sys, time
from tests.hosts import SimulatedHosts
h = SimulatedHosts(2, watchdog=sys.argv[1] == "1").__enter__()
subprocess.Popen(h.command(1, ["sleep", "600"]))
subprocess.Popen(h.command(2, ["sleep", "600"]))
print(h.prefix, h.state["dir"], flush=True)
time.sleep(600)
"""


def _leftovers(prefix: str, base: str) -> list[str]:
    out = [f"netns {line}" for line in subprocess.run(["ip", "netns", "list"], text=True,
                                                       capture_output=True).stdout.splitlines()
           if prefix in line]
    out += [f"link {n}" for n in os.listdir("/sys/class/net") if n.startswith(prefix)]
    with open("/proc/mounts") as f:
        out += [f"mount {line.strip()}" for line in f if prefix in line or base in line]
    out += [f"pid {p}" for p in os.listdir("/proc") if p.isdigit() and _has_mark(p, prefix)]
    out += [f"path {p}" for p in (base, os.path.join(STATE_DIR, prefix + ".json"))
            if os.path.exists(p)]
    return out


def _has_mark(pid: str, prefix: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"PAFKA_HOSTS_RUN={prefix}".encode() in f.read()
    except OSError:
        return False


@pytest.mark.parametrize("watchdog", [False, True], ids=["cleanup_stale", "watchdog"])
def test_a_sigkilled_run_leaves_nothing(watchdog):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, "1" if watchdog else "0"], cwd=ROOT,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    prefix, base = owner.stdout.readline().split()
    deadline = time.monotonic() + 10
    while sum(_has_mark(p, prefix) for p in os.listdir("/proc") if p.isdigit()) < 2:
        assert time.monotonic() < deadline, "the hosts' sleepers did not start"
        time.sleep(0.05)
    assert len(_leftovers(prefix, base)) >= 8  # 2 netns, 3 links, 4 mounts, sleepers, files
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait(10)
    if watchdog:
        deadline = time.monotonic() + 15
        while _leftovers(prefix, base) and time.monotonic() < deadline:
            time.sleep(0.1)
    else:
        assert _leftovers(prefix, base)  # nobody cleaned up yet
        assert prefix in cleanup_stale()
    assert _leftovers(prefix, base) == []


def test_radosgw_on_the_bridge_serves_the_hosts(hosts):
    from .s3server import S3Server, missing_binaries
    if missing_binaries():
        pytest.skip(f"no Ceph programs ({', '.join(missing_binaries())}): install ceph-mon "
                    "ceph-osd radosgw ceph-common")
    import tempfile
    t0 = time.monotonic()
    server = S3Server.start(tempfile.mkdtemp(prefix="pafka-ceph-"), host=hosts.bridge_address)
    try:
        log.info("radosgw on %s in %.1f s", server.endpoint, time.monotonic() - t0)
        assert server.endpoint == f"http://{hosts.bridge_address}:{server.state['rgw_port']}"
        bucket = server.new_bucket("hosts")
        put_get = ("import boto3, os, sys; c = boto3.client('s3'); "
                   "c.put_object(Bucket=sys.argv[1], Key=os.environ['PAFKA_HOST_ID'], "
                   "Body=b'from ' + os.environ['PAFKA_HOST_ID'].encode()); "
                   "print(c.get_object(Bucket=sys.argv[1], Key='host-1')['Body'].read().decode())")
        for k in (1, 2):
            out = subprocess.run(hosts.command(k, [sys.executable, "-c", put_get, bucket],
                                               server.env), capture_output=True, text=True,
                                 timeout=60)
            assert (out.returncode, out.stdout.strip()) == (0, "from host-1"), out.stderr
        got = server.client().get_object(Bucket=bucket, Key="host-2")["Body"].read()
        assert got == b"from host-2"
    finally:
        server.close()
