"""Simulated hosts for the tests: network namespaces on a bridge, each with its own tier 1.

As root, ``SimulatedHosts(n)`` builds a Linux bridge holding the driver's address
(``10.X.Y.1/24``, a subnet free on this machine) and one network namespace per host ``k`` in
``1..n``, joined to the bridge by a veth pair, with the address ``10.X.Y.(10+k)`` and loopback
up. ``command(k, argv, env)`` is the argv that runs ``argv`` on host ``k``: in its namespace,
under ``unshare -m -u --propagation private`` with

- the host's own tier-1 directory bind-mounted at ``tier1``, the path every host uses (the
  driver, host 0, runs in the root namespace and its tier 1 is ``tier1`` itself);
- its own tmpfs on ``/dev/shm`` (one per host, kept while the run lasts), the hostname
  ``host-k`` (in a private ``/etc/hosts``);
- ``PAFKA_HOST_ID=host-k`` and ``SPARK_LOCAL_IP`` set to the host's address.

Spark: ``spark_conf()`` is the configuration of a ``local-cluster[n,1,1024]`` whose driver
binds to the bridge address and whose executors start through ``<run>/java/bin/java``, a
wrapper (``main(["java", ...])`` below) that puts the executor of each worker on its own host
and rewrites its ``--hostname``/``--bind-address`` to the host's address. ``run_driver``
runs a driver (``tests/cluster_job.py``) in its own process group, kills the group when it is
done or times out, and returns the job's JSON result::

    with SimulatedHosts(2) as hosts:
        subprocess.run(hosts.command(1, ["ls", hosts.tier1]), check=True)
        out = hosts.run_driver("tests.cluster_job:probe", [hosts.tier1], env=s3.env)
        hosts.last_run  # app id, seconds to start the cluster and to run the job

Each run has a short name prefix (``pfh`` and 5 hex digits: interface names are at most 15
characters) and a state file ``/run/pafka-hosts/<prefix>.json`` naming its owner, written
before anything is built. ``cleanup_stale()`` (called on start) removes what runs whose owner
is dead left: their processes, namespaces, links, mounts and directories. A watchdog process
does the same as soon as the owner exits in any way (SIGKILL too), unless ``watchdog=False``.

Only the standard library is imported at the top: the wrapper and the watchdog run this file.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

log = logging.getLogger(__name__)

STATE_DIR = "/run/pafka-hosts"
MARK = "PAFKA_HOSTS_RUN"  # in the environment of every process a run starts
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Run inside a host's fresh mount and UTS namespaces before the command itself.
ENTER = ('set -e; mount --bind "$1" "$2"; mount --bind "$3" /dev/shm; '
         'mount --bind "$4" /etc/hosts; hostname "$5"; shift 5; exec "$@"')


class HostsError(RuntimeError):
    """The simulated hosts could not be built or used (the failing command included)."""


def missing_tools() -> list[str]:
    """Why this machine cannot simulate hosts (empty when it can): not root, or no programs."""
    why = [] if os.geteuid() == 0 else ["not root"]
    return why + [f"no {p}" for p in ("ip", "unshare", "mount") if shutil.which(p) is None]


def _run(*cmd: str, check: bool = True) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise HostsError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def _start_time(pid: int) -> str | None:
    """The start time of ``pid`` (tells a live owner from a reused pid), None when dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _marked(prefix: str) -> list[int]:
    """The processes whose environment carries ``prefix``'s mark."""
    needle = f"{MARK}={prefix}\0".encode()
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    pids.append(int(name))
    return pids


def _teardown(state: dict[str, Any]) -> None:
    """Remove everything of one run; each step tolerates what is already gone."""
    prefix = state["prefix"]
    for _ in range(3):  # a dying parent may still start a child
        pids = set(_marked(prefix))
        for ns in state["netns"]:
            pids.update(int(p) for p in _run("ip", "netns", "pids", ns, check=False).split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not pids:
            break
        time.sleep(0.2)
    for ns in state["netns"]:
        _run("ip", "netns", "del", ns, check=False)
    for link in [state["bridge"], *state["veths"]]:
        if os.path.exists(f"/sys/class/net/{link}"):
            _run("ip", "link", "del", link, check=False)
    with open("/proc/mounts") as f:
        points = [line.split()[1] for line in f if state["dir"] in line.split()[1]]
    for point in reversed(points):
        _run("umount", "-l", point, check=False)
    shutil.rmtree(state["dir"], ignore_errors=True)
    if state.get("made_tier1"):
        shutil.rmtree(state["tier1"], ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(STATE_DIR, prefix + ".json"))


def _states() -> list[dict[str, Any]]:
    out = []
    for name in sorted(os.listdir(STATE_DIR)) if os.path.isdir(STATE_DIR) else []:
        with contextlib.suppress(OSError, ValueError), open(os.path.join(STATE_DIR, name)) as f:
            out.append(json.load(f))
    return out


def cleanup_stale() -> list[str]:
    """Tear down every run whose owner is dead; returns their prefixes."""
    gone = []
    for state in _states():
        if _start_time(state["pid"]) != state["pid_start"]:
            log.info("removing simulated hosts %s of dead pid %d", state["prefix"], state["pid"])
            _teardown(state)
            gone.append(state["prefix"])
    return gone


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 overlapping no address, route or other run of this machine."""
    used = [ipaddress.ip_network(s["subnet"]) for s in _states()]
    for line in (_run("ip", "-4", "-o", "addr") + _run("ip", "-4", "route")).splitlines():
        for word in line.split():
            with contextlib.suppress(ValueError):
                if "/" in word or word[0].isdigit():
                    used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(100):
        net = ipaddress.ip_network(f"10.{random.randint(200, 207)}.{random.randint(0, 255)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise HostsError("no free /24 in 10.200.0.0/13 for the simulated hosts' bridge")


class SimulatedHosts:
    """``n`` hosts on a bridge, each with its own tier 1 at ``tier1`` (see the module doc)."""

    def __init__(self, n: int = 2, tier1: str | None = None, watchdog: bool = True) -> None:
        if not isinstance(n, int) or not 1 <= n <= 200:
            raise ValueError(f"SimulatedHosts: n={n!r}: the number of hosts must be 1..200")
        if tier1 is not None and not os.path.isabs(tier1):
            raise ValueError(f"SimulatedHosts: tier1={tier1!r}: must be an absolute path")
        self.n, self._tier1, self._watch = n, tier1, watchdog
        self.state: dict[str, Any] = {}
        self.last_run: dict[str, Any] = {}
        self._watchdog: subprocess.Popen | None = None

    # -- building and tearing down ------------------------------------------------------------

    def __enter__(self) -> SimulatedHosts:
        why = missing_tools()
        if why:
            raise HostsError(f"cannot simulate hosts: {', '.join(why)}")
        cleanup_stale()
        prefix = f"pfh{os.urandom(3).hex()[:5]}"
        net = _free_subnet()
        base = tempfile.mkdtemp(prefix=f"pafka-{prefix}-")
        tier1 = self._tier1 or os.path.join(base, "tier1")
        self.state = {
            "prefix": prefix, "pid": os.getpid(), "pid_start": _start_time(os.getpid()),
            "subnet": str(net), "dir": base, "tier1": tier1,
            "made_tier1": self._tier1 is not None and not os.path.exists(tier1),
            "bridge": f"{prefix}br", "driver": str(net[1]),
            "netns": [f"{prefix}h{k}" for k in range(1, self.n + 1)],
            "veths": [f"{prefix}v{k}" for k in range(1, self.n + 1)],
            "addresses": [str(net[1])] + [str(net[10 + k]) for k in range(1, self.n + 1)],
            "java": os.path.realpath(shutil.which("java") or "java"),
            "workers": f"{base}/workers.json", "java_log": f"{base}/java.log",
        }
        os.makedirs(STATE_DIR, exist_ok=True)
        with open(self._state_path(), "w") as f:
            json.dump(self.state, f)  # first: a killed setup is found by cleanup_stale
        try:
            if self._watch:
                self._watchdog = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "watch", self._state_path()],
                    stdin=subprocess.PIPE, start_new_session=True)
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        s, t0 = self.state, time.monotonic()
        _run("ip", "link", "add", s["bridge"], "type", "bridge")
        _run("ip", "addr", "add", f"{s['driver']}/24", "dev", s["bridge"])
        _run("ip", "link", "set", s["bridge"], "up")
        lines = ["127.0.0.1 localhost"] + [f"{a} host-{k}" for k, a in enumerate(s["addresses"])]
        with open(os.path.join(s["dir"], "hosts"), "w") as f:
            f.write("\n".join(lines) + "\n")
        os.makedirs(s["tier1"], exist_ok=True)
        for k in range(1, self.n + 1):
            ns, veth, peer = s["netns"][k - 1], s["veths"][k - 1], f"{s['prefix']}p{k}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer, "netns", ns)
            _run("ip", "link", "set", veth, "master", s["bridge"], "up")
            _run("ip", "-n", ns, "link", "set", peer, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{s['addresses'][k]}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            os.makedirs(self.tier1_dir(k))
            os.makedirs(self._shm(k))
            _run("mount", "-t", "tmpfs", "-o", "mode=1777", f"{s['prefix']}-shm", self._shm(k))
        java = os.path.join(s["dir"], "java", "bin", "java")
        os.makedirs(os.path.dirname(java))
        with open(java, "w") as f:
            f.write(f"#!/bin/sh\nexec {sys.executable} {os.path.abspath(__file__)} java "
                    f"{self._state_path()} \"$@\"\n")
        os.chmod(java, 0o755)
        log.info("%d simulated hosts on %s (%s) in %.2f s", self.n, s["bridge"], s["subnet"],
                 time.monotonic() - t0)

    def close(self) -> None:
        """Kill the run's processes, remove its namespaces, links, mounts and directories."""
        if self.state:
            _teardown(self.state)
        if self._watchdog is not None:
            self._watchdog.stdin.close()
            self._watchdog.wait(timeout=30)
            self._watchdog = None

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _state_path(self) -> str:
        return os.path.join(STATE_DIR, self.state["prefix"] + ".json")

    # -- using the hosts ----------------------------------------------------------------------

    @property
    def prefix(self) -> str:
        return self.state["prefix"]

    @property
    def bridge_address(self) -> str:
        """The driver's address on the bridge (hosts reach the root namespace there)."""
        return self.state["driver"]

    @property
    def tier1(self) -> str:
        """The tier-1 path of every host; the driver's own tier 1 in the root namespace."""
        return self.state["tier1"]

    def address(self, k: int) -> str:
        """Host ``k``'s address (0: the driver's, on the bridge)."""
        self._check_host(k, allow_driver=True)
        return self.state["addresses"][k]

    def tier1_dir(self, k: int) -> str:
        """Where host ``k``'s tier 1 really is, seen from the root namespace (0: ``tier1``)."""
        self._check_host(k, allow_driver=True)
        return self.tier1 if k == 0 else os.path.join(self.state["dir"], f"host-{k}", "tier1")

    def command(self, k: int, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The argv running ``argv`` on host ``k`` with ``env`` added to its environment."""
        self._check_host(k)
        if not argv or "=" in argv[0]:
            raise ValueError(f"host-{k}: argv {argv!r}: needs a program, without '=' in it")
        extra = {MARK: self.prefix, "PAFKA_HOST_ID": f"host-{k}",
                 "SPARK_LOCAL_IP": self.address(k), **(env or {})}
        for key, value in extra.items():
            if not key or "=" in key or not isinstance(value, str):
                raise ValueError(f"host-{k}: environment {key!r}={value!r}: a name without "
                                 "'=' and a string value are needed")
        return ["ip", "netns", "exec", self.state["netns"][k - 1], "unshare", "-m", "-u",
                "--propagation", "private", "--", "/bin/sh", "-c", ENTER, "pafka-host",
                self.tier1_dir(k), self.tier1, self._shm(k),
                os.path.join(self.state["dir"], "hosts"), f"host-{k}", "env",
                *(f"{key}={value}" for key, value in extra.items()), *argv]

    def _shm(self, k: int) -> str:
        return os.path.join(self.state["dir"], f"host-{k}", "shm")

    def _check_host(self, k: int, allow_driver: bool = False) -> None:
        if not self.state:
            raise HostsError("the simulated hosts are not started (use them in a with block)")
        low = 0 if allow_driver else 1
        if not isinstance(k, int) or not low <= k <= self.n:
            raise ValueError(f"host {k!r}: no such simulated host (hosts are {low}..{self.n})")

    # -- Spark ----------------------------------------------------------------------------------

    def spark_conf(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """A lean ``local-cluster`` with executor ``k`` of the ``n`` workers on host ``k``."""
        addr = self.bridge_address
        return {"spark.master": f"local-cluster[{self.n},1,1024]",
                "spark.driver.host": addr, "spark.driver.bindAddress": addr,
                "spark.executorEnv.JAVA_HOME": os.path.join(self.state["dir"], "java"),
                "spark.executorEnv.PYTHONPATH": ROOT, "spark.executor.cores": "1",
                "spark.executor.memory": "512m", "spark.driver.memory": "768m",
                "spark.executor.extraJavaOptions": "-XX:+UseSerialGC",
                "spark.python.worker.reuse": "true", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "2",
                "spark.sql.session.timeZone": "UTC", **(extra or {})}

    def run_driver(self, script: str, args: list[str] | tuple[str, ...] = (),
                   env: dict[str, str] | None = None, conf: dict[str, str] | None = None,
                   timeout: float = 240.0) -> Any:
        """Run ``python -m tests.cluster_job script *args`` as the driver (see that module) on
        this cluster; its JSON result, or ClusterJobError. Nothing of it outlives the call."""
        from .cluster_job import run
        full = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
                "SPARK_LOCAL_IP": self.bridge_address, "PAFKA_HOST_ID": "host-0",
                MARK: self.prefix, "PAFKA_CLUSTER_EXECUTORS": str(self.n),
                "PAFKA_CLUSTER_CONF": json.dumps(self.spark_conf(conf)), **(env or {})}
        full.pop("SPARK_LOCAL_HOSTNAME", None)
        self.last_run = run(script, [str(a) for a in args], full, timeout)
        return self.last_run["value"]


# -- the executors' java, and the watchdog: this file run by its path -------------------------


def _host_of(state: dict[str, Any], args: list[str]) -> int:
    """The host of a worker's executor: each worker's executors on one host, first come first
    served (local-cluster has one worker per host); by executor id without a worker URL."""
    opt = dict(zip(args, args[1:], strict=False))
    n = len(state["netns"])
    if "--worker-url" not in opt:
        return int(opt.get("--executor-id", "0")) % n + 1
    with open(state["workers"], "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        workers = json.loads(f.read() or "{}")
        if opt["--worker-url"] not in workers:
            workers[opt["--worker-url"]] = len(workers) % n + 1
            f.seek(0)
            f.truncate()
            json.dump(workers, f)
        return workers[opt["--worker-url"]]


def _java(state_path: str, args: list[str]) -> None:
    with open(state_path) as f:
        state = json.load(f)
    real = state["java"]
    if "org.apache.spark.executor.CoarseGrainedExecutorBackend" not in args:
        os.execv(real, [real, *args])
    hosts = SimulatedHosts(len(state["netns"]))
    hosts.state = state
    k = _host_of(state, args)
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in ("--hostname", "--bind-address"):
            out[i + 1] = hosts.address(k)
    with open(state["java_log"], "a") as f:
        f.write(json.dumps({"host": k, "argv": args, "rewritten": out}) + "\n")
    java_home = os.path.dirname(os.path.dirname(real))
    argv = hosts.command(k, [real, *out], {"JAVA_HOME": java_home})
    os.execvp(argv[0], argv)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "java":
        _java(argv[1], argv[2:])
    if len(argv) == 2 and argv[0] == "watch":
        sys.stdin.buffer.read()  # EOF: the owner closed the pipe or died
        with contextlib.suppress(OSError, ValueError), open(argv[1]) as f:
            _teardown(json.load(f))
        return 0
    if argv == ["cleanup"]:
        print("\n".join(cleanup_stale()))
        return 0
    sys.stderr.write("usage: python tests/hosts.py cleanup | watch STATE | java STATE ARGS...\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
