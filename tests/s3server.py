"""A real S3 server for the tests: a one-node Ceph cluster with its S3 gateway (radosgw).

One monitor, one OSD keeping its objects in memory (``memstore``), pools of size 1, radosgw with
the ``beast`` frontend on a free port of 127.0.0.1 or ``host``; cephx (radosgw fails with
``none``). Each daemon runs in the foreground in its own process group, with all its state
(configuration, keyring, data, logs, sockets, pid files) in one directory: clusters run side by
side, nothing goes to /etc/ceph or /var/lib/ceph, free ports keep a killed run's leftovers away.
A watchdog holding a pipe from the starting process kills the daemons when it exits (SIGKILL too).

By hand (HOST: the address radosgw listens on, e.g. a bridge's; 127.0.0.1 when not given)::

    .venv/bin/python -m tests.s3server start DIR [HOST]  # prints ``export ...``, keeps running
    .venv/bin/python -m tests.s3server stop DIR

Needs the Debian packages ``ceph-mon ceph-osd radosgw ceph-common`` (``.ci/setup`` installs them).
Only the standard library is imported at the top: the watchdog runs this file by its path.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

log = logging.getLogger(__name__)

BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "ceph-authtool",
            "monmaptool")
REGION = "us-east-1"
STATE = "server.json"

CONF = """\
[global]
fsid = {fsid}
mon host = v2:127.0.0.1:{mon_port}
mon initial members = a
public addr = 127.0.0.1
ms bind msgr1 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = {d}/keyring
run dir = {d}/run
admin socket = {d}/run/$name.asok
pid file = {d}/run/$name.pid
crash dir = {d}/crash
log file = {d}/log/$name.log
mon cluster log file = {d}/log/cluster.log
log to stderr = false
client mount timeout = 30
rados mon op timeout = 30
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail crit = 0
osd objectstore = memstore
memstore device bytes = {memstore_bytes}
osd op num shards = 1
osd op num threads per shard = 2
ms async op threads = 1

[mon.a]
mon data = {d}/mon

[osd.0]
osd data = {d}/osd0

[client.rgw]
rgw frontends = beast endpoint={rgw_host}:{rgw_port} tcp_nodelay=1
rgw data = {d}/rgw
rgw thread pool size = 32
rgw enable usage log = false
"""


class CephError(RuntimeError):
    """The test cluster did not start or a Ceph command failed (its log tail included)."""


def missing_binaries() -> list[str]:
    """The Ceph programs this server needs that are not on PATH (empty when all are there)."""
    return [b for b in BINARIES if shutil.which(b) is None]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.create_server((host, 0)) as s:
        return s.getsockname()[1]


def _is_ours(pid: int, base: str) -> bool:
    """True when ``pid`` is alive and a daemon of the cluster in ``base`` (not a reused pid)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        return os.path.join(base, "ceph.conf").encode() in f.read()
    return False


def _kill(pid: int, base: str) -> None:
    if _is_ours(pid, base):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


class S3Server:
    """A running one-node Ceph cluster with its S3 gateway, all state in ``base``.

    ``S3Server.start(dir)`` builds and starts one; ``S3Server.attach(dir)`` takes over one that
    is already running (the CLI's ``stop``, or a shared server for fast local iteration).
    """

    def __init__(self, base: str, state: dict[str, Any], owned: bool) -> None:
        self.base = base
        self.state = state
        self.owned = owned
        self._watchdog: subprocess.Popen | None = None
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def endpoint(self) -> str:
        return self.state.get("endpoint") or f"http://127.0.0.1:{self.state['rgw_port']}"

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that let boto3/s3fs reach this server."""
        return {"AWS_ACCESS_KEY_ID": self.state["access_key"],
                "AWS_SECRET_ACCESS_KEY": self.state["secret_key"],
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION}

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for this server (``config``: botocore Config arguments)."""
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.state["access_key"],
                            aws_secret_access_key=self.state["secret_key"],
                            config=Config(**config))

    def new_bucket(self, prefix: str = "pafka") -> str:
        """A new, empty bucket with a unique name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    @classmethod
    def start(cls, base: str | None = None, *, outlive: bool = False, timeout: float = 180.0,
              memstore_bytes: int = 2 << 30, host: str = "127.0.0.1") -> S3Server:
        """Build a cluster in ``base`` (a new temporary directory when None), radosgw on ``host``;
        wait until a real S3 call works. Unless ``outlive``, a watchdog stops it at our exit."""
        if missing_binaries():
            raise CephError(f"Ceph programs not found: {', '.join(missing_binaries())} (install "
                            "ceph-mon ceph-osd radosgw ceph-common)")
        base = os.path.abspath(base or tempfile.mkdtemp(prefix="pafka-ceph-"))
        os.makedirs(base, exist_ok=True)
        if os.listdir(base):
            raise CephError(f"{base}: not empty; a test cluster needs an empty directory")
        for sub in ("run", "log", "crash", "mon", "osd0", "rgw"):
            os.mkdir(os.path.join(base, sub))
        state = {"fsid": str(uuid.uuid4()), "mon_port": free_port(), "rgw_host": host,
                 "rgw_port": (port := free_port(host)), "endpoint": f"http://{host}:{port}",
                 "access_key": "PAFKA" + uuid.uuid4().hex[:15].upper(), "pids": {},
                 "secret_key": uuid.uuid4().hex + uuid.uuid4().hex[:8], "stopped": False}
        server = cls(base, state, owned=True)
        with open(server._path("ceph.conf"), "w") as f:
            f.write(CONF.format(d=base, memstore_bytes=memstore_bytes, **state))
        server._save()
        if not outlive:
            server._start_watchdog()
        t0 = time.monotonic()
        try:
            server._bootstrap(t0 + timeout)
        except BaseException:
            server.close(remove=False)
            raise
        log.info("ceph test cluster up in %.1f s at %s (%s)", time.monotonic() - t0,
                 server.endpoint, base)
        return server

    def _bootstrap(self, deadline: float) -> None:
        kr = self._path("keyring")
        self._run("ceph-authtool", "--create-keyring", kr)
        # The monitor's mkfs imports every key of the keyring into its authentication database.
        for name, mon, osd in (("mon.", "allow *", None), ("client.admin", "allow *", "allow *"),
                               ("osd.0", "allow profile osd", "allow *"),
                               ("client.rgw", "allow rw", "allow rwx")):
            caps = ["--cap", "mon", mon] + (["--cap", "osd", osd] if osd else [])
            self._run("ceph-authtool", kr, "--gen-key", "-n", name, *caps)
        monmap = self._path("run", "monmap")
        self._run("monmaptool", "--create", "--fsid", self.state["fsid"], "--addv", "a",
                  f"[v2:127.0.0.1:{self.state['mon_port']}]", monmap)
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", kr)
        self._spawn("mon", "ceph-mon", "-f", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", "osd", "new", osd_uuid, "0", timeout=60).strip()
        if osd_id != "0":
            raise CephError(f"{self.base}: 'ceph osd new' gave id {osd_id!r}, expected 0")
        self._run("ceph-osd", "--mkfs", "-i", "0", "--osd-uuid", osd_uuid)
        self._spawn("osd", "ceph-osd", "-f", "-i", "0")
        self._spawn("rgw", "radosgw", "-f", "-n", "client.rgw")
        # Creates the user once the OSD serves the gateway's pools (it waits for them).
        self._run("radosgw-admin", "user", "create", "--uid", "pafka", "--display-name",
                  "pafka tests", "--access-key", self.state["access_key"], "--secret",
                  self.state["secret_key"], timeout=max(10.0, deadline - time.monotonic()))
        self.wait_ready(deadline)

    def wait_ready(self, deadline: float) -> None:
        """Until a real S3 call (ListBuckets) answers, or CephError at ``deadline``."""
        from botocore.exceptions import BotoCoreError, ClientError
        client = self.client(connect_timeout=2, read_timeout=5, retries={"max_attempts": 1})
        last: Exception | None = None
        while time.monotonic() < deadline:
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise CephError(f"{self.base}: {name} exited during start\n"
                                    + self.log_tail(name))
            try:
                client.list_buckets()
                return
            except (BotoCoreError, ClientError) as e:
                last = e
            time.sleep(0.2)
        raise CephError(f"{self.base}: radosgw at {self.endpoint} did not answer in time "
                        f"({last})\n" + self.log_tail("rgw"))

    def stop_gateway(self) -> None:
        """Kill radosgw (SIGKILL): the endpoint refuses connections until start_gateway()."""
        self._require_owned("stop its gateway")
        self._stop("rgw")
        self._save()

    def start_gateway(self, timeout: float = 60.0) -> None:
        """Start radosgw again on the same port and wait until it answers (nothing to do when
        it runs)."""
        self._require_owned("start its gateway")
        if self.state["pids"].get("rgw") and _is_ours(self.state["pids"]["rgw"], self.base):
            return
        self._spawn("rgw", "radosgw", "-f", "-n", "client.rgw")
        self.wait_ready(time.monotonic() + timeout)

    def close(self, remove: bool = True) -> None:
        """Stop the daemons (SIGKILL to each process group); remove ``base`` when ``remove``.
        Calling it again, or on a server this process does not own, does nothing."""
        if self.state.get("stopped") or not self.owned:
            return
        for name in ("rgw", "osd", "mon"):
            self._stop(name)
        self.state["stopped"] = True
        self._save()
        if self._watchdog is not None:
            self._watchdog.stdin.close()
            self._watchdog.wait(timeout=10)
            self._watchdog = None
        if remove:
            shutil.rmtree(self.base, ignore_errors=True)

    def rss_bytes(self) -> int:
        """Resident memory of the daemons together."""
        total = 0
        for pid in self.state["pids"].values():
            with contextlib.suppress(OSError), open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return total

    @classmethod
    def attach(cls, base: str, owned: bool = True) -> S3Server:
        """The cluster already running in ``base``; not stopped when this process exits.
        ``owned``: this process may stop and start its gateway."""
        base = os.path.abspath(base)
        with open(os.path.join(base, STATE)) as f:
            return cls(base, json.load(f), owned=owned)

    @classmethod
    def from_env_file(cls, path: str) -> S3Server:
        """A server someone else runs, from the ``export`` lines the CLI printed (``path``).
        Its gateway cannot be stopped from here: other processes may be using it."""
        with open(path) as f:
            env = dict(line.strip().removeprefix("export ").split("=", 1) for line in f
                       if "=" in line and not line.lstrip().startswith("#"))
        try:
            state = {"pids": {}, "endpoint": env["AWS_ENDPOINT_URL"],
                     "access_key": env["AWS_ACCESS_KEY_ID"],
                     "secret_key": env["AWS_SECRET_ACCESS_KEY"]}
        except KeyError as e:
            raise CephError(f"{path}: no {e.args[0]} in this S3 environment file") from None
        if os.path.exists(os.path.join(env.get("PAFKA_S3_DIR", "/nonexistent"), STATE)):
            return cls.attach(env["PAFKA_S3_DIR"], owned=False)
        return cls(os.path.dirname(os.path.abspath(path)), state, owned=False)

    def log_tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a daemon's (mon, osd, rgw) output and log, for error messages."""
        out = []
        for fn in (f"{name}.out", {"mon": "mon.a", "osd": "osd.0", "rgw": "client.rgw"}[name]
                   + ".log"):
            with contextlib.suppress(OSError), open(self._path("log", fn), errors="replace") as f:
                out.append(f"--- {fn}\n" + "".join(f.readlines()[-lines:]))
        return "\n".join(out)

    def _require_owned(self, what: str) -> None:
        if not self.owned:
            raise CephError(f"{self.endpoint}: cannot {what}: this server ({self.base}) is "
                            "shared with other processes")

    def _path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    def _save(self) -> None:
        tmp = self._path(STATE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self._path(STATE))

    def _args(self, program: str, *args: str) -> list[str]:
        return [program, "-c", self._path("ceph.conf"), *args]

    def _run(self, program: str, *args: str, timeout: float = 30.0) -> str:
        cmd = self._args(program, *args)
        what = f"{self.base}: {' '.join(cmd[:1] + cmd[3:])}"
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise CephError(f"{what} timed out after {timeout:.0f} s\n" + self.log_tail("mon")
                            + self.log_tail("osd")) from e
        if p.returncode != 0:
            raise CephError(f"{what} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
        return p.stdout

    def _spawn(self, name: str, program: str, *args: str) -> None:
        with open(self._path("log", f"{name}.out"), "ab") as out:
            p = subprocess.Popen(self._args(program, *args), stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.state["pids"][name] = p.pid
        self._procs[name] = p
        self._save()

    def _stop(self, name: str) -> None:
        """SIGKILL to the daemon's process group; reaped when it is this process's child."""
        pid, p = self.state["pids"].pop(name, None), self._procs.pop(name, None)
        if pid:
            _kill(pid, self.base)
        if p is not None:
            p.wait(timeout=10)

    def _start_watchdog(self) -> None:
        self._watchdog = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "watch", self.base],
            stdin=subprocess.PIPE, start_new_session=True)


def _watch(base: str) -> None:
    """Wait for the starting process to exit (EOF on stdin), then kill the cluster's daemons."""
    sys.stdin.buffer.read()
    try:
        with open(os.path.join(base, STATE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return
    for pid in state.get("pids", {}).values():
        _kill(pid, base)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not 2 <= len(argv) <= 2 + (argv[:1] == ["start"]) or argv[0] not in (
            "start", "stop", "watch", "env"):
        sys.stderr.write("usage: python -m tests.s3server start DIR [HOST] | stop|env DIR\n")
        return 2
    cmd, base = argv[0], os.path.abspath(argv[1])
    if cmd == "watch":
        _watch(base)
        return 0
    if cmd == "stop":
        S3Server.attach(base).close(remove=False)
        return 0
    if cmd == "start":
        server = S3Server.start(base, outlive=True, host=(argv[2:] or ["127.0.0.1"])[0])
        server.state["bucket"] = server.new_bucket("pafka-shared")
        server._save()
        log.info("daemons' RSS: %.0f MB", server.rss_bytes() / 2**20)
    server = S3Server.attach(base)
    for k, v in {**server.env, "PAFKA_TEST_BUCKET": server.state.get("bucket", ""),
                 "PAFKA_S3_DIR": base}.items():
        print(f"export {k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
