"""Soak: streaming writes and reads through Spark for a long while, with migration, merging and
retention on, a writer killed and restarted, and a final check that the output is the input.

    flock /tmp/h/spark.lock .venv/bin/python bench/soak.py [--minutes 30] [--report] [--json]

The driver creates the store and the topic (4 partitions), then starts three processes, each
watched from /proc (RSS, open fds, memory maps of the store's files, the JVM apart from the
Python processes):

* writer: ``bench/soak_roles.py writer``, a Spark ``local[2]`` streaming query from Spark's
  ``rate-micro-batch`` source (unique sequential ids, ``--rows-per-batch`` per 1-s trigger)
  into ``format("pafka")``. ``--kill-every`` seconds (randomly 0.5–1.5×) after its first
  commit, the driver SIGKILLs its whole process tree (the Python driver, the JVM, the Python
  workers, mid-write or mid-commit) and starts it again on the same checkpoint.
* reader: ``bench/soak_roles.py reader``, a Spark ``local[2]`` streaming query from
  ``format("pafka")`` (earliest, ``failOnDataLoss=false``) into Parquet, never killed.
* migrator: ``pafka migrate --follow``: tier 1 is small (``--tier1`` MiB of PMEM on /dev/shm,
  or NVME), so segments move down to the HDD tier, merged while they fit ``log.segment.bytes``
  (``log.segment.ms`` rolls segments every few seconds, so they are small); time retention
  (``--retention`` seconds) deletes the oldest.

A process that exits unasked is a crash: counted, and started again. Every ``--sample``
seconds: rows the store committed and rows the reader read per second, tier 1/2 committed and
on-disk bytes, and each process tree's RSS, fds and mapped store files.

After ``--minutes``, once the writer has committed since its last restart, the writer stops
between batches, the reader drains the topic (AvailableNow), and the migrator stops: that is
``T_end``. Then the check, with ``W`` the ids of every batch in the writer's Spark commit log,
``P`` those of every batch it planned (its offset log: ids beyond were never written) and the
retention horizon ``H = T_end − log.retention.ms``:

* no id twice, in the reader's output or in the store as read at the end;
* no id outside ``P`` and no row whose payload is not its id's (a wrong row); and the reader's
  (partition, offset) → id agrees with the store's wherever both have it;
* every id of ``W`` from a batch planned after ``H`` (so committed after ``H``: retention,
  which drops sealed segments whose newest record is older, cannot have deleted it) is in
  both; an id the reader lacks must be older and absent from the store (retention deleted
  it before the reader came: reported, allowed);
* ``Store.check`` verifies every chunk's checksum; no process exited unasked.

The report is printed; ``--report`` writes this script's section of bench/RESULTS.md and the
plots to bench/soak/ (``--out DIR``: to DIR; otherwise a temporary directory). ``--json``
prints the raw figures. Exits non-zero when the check fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import soak_check  # noqa: E402
from bench_common import Output, add_output_args, dump_raw, fail, float_range  # noqa: E402
from soak_roles import PARTITIONS, TOPIC, TOPIC_SCHEMA  # noqa: E402

log = logging.getLogger("soak")
MB = 1_000_000
PY = sys.executable
PAFKA = os.path.join(os.path.dirname(PY), "pafka")


class SoakOutput(Output):
    """Figures go to bench/soak/ (not bench/) with ``--report``."""

    def figure_dirs(self) -> list[str]:
        dirs = super().figure_dirs()
        soak = os.path.join(HERE, "soak")
        if HERE in dirs:
            os.makedirs(soak, exist_ok=True)
            dirs[dirs.index(HERE)] = soak
        return dirs


def store_conf(a: argparse.Namespace, shm: str) -> dict:
    return {"log.channel.type": "tiered", "storage.tiers.types": f"{a.tier1_type},HDD",
            "storage.tiers.first.paths": shm, "storage.tiers.first.sizes": f"{a.tier1}m",
            "log.pmem.pool.ratio": 1.0, "log.segment.bytes": f"{a.segment}k",
            "log.segment.ms": int(a.segment_s * 1000),
            "log.retention.ms": int(a.retention * 1000), "log.cleanup.grace.ms": 30_000,
            "storage.migrate.interval.ms": 5000, "storage.migrate.threshold": 0.5}


# -- processes -------------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            if fields[0] != "Z":
                kids.setdefault(int(fields[1]), []).append(int(d))
    return kids


def tree(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and its live descendants."""
    kids = _children() if kids is None else kids
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL ``proc`` and all its descendants at once; wait until none is left."""
    pids = tree(proc.pid)
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    t0 = time.time()
    while any(alive(p) for p in pids) and time.time() - t0 < 30:
        time.sleep(0.1)
    return len(pids)


def usage(pids: list[int], marks: tuple[str, ...]) -> dict[str, float]:
    """RSS (bytes), open fds, and memory maps of files under ``marks`` of processes ``pids``,
    the JVM apart from the Python processes."""
    u = {f"{k}_{m}": 0.0 for k in ("py", "jvm") for m in ("rss", "fds", "maps", "procs")}
    for p in pids:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                k = "jvm" if b"java" in f.read().split(b"\0")[0] else "py"
            with open(f"/proc/{p}/statm") as f:
                rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            fds = len(os.listdir(f"/proc/{p}/fd"))
            with open(f"/proc/{p}/maps") as f:
                maps = sum(1 for line in f if any(m in line for m in marks))
        except OSError:
            continue
        u[f"{k}_rss"] += rss
        u[f"{k}_fds"] += fds
        u[f"{k}_maps"] += maps
        u[f"{k}_procs"] += 1
    return u


def disk_bytes(path: str) -> int:
    total = 0
    for d, _, fs in os.walk(path):
        for f in fs:
            try:
                total += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                pass
    return total


class Soak:
    """The run's processes, its schedule and its samples."""

    def __init__(self, a: argparse.Namespace, root: str, work: str, shm: str):
        self.a, self.root, self.work, self.shm = a, root, work, shm
        self.procs: dict[str, subprocess.Popen] = {}
        self.samples: list[dict] = []
        self.kills: list[float] = []
        self.crashes: list[str] = []
        self.t0 = time.time()
        self._last: tuple[float, int, int] | None = None
        self._next_sample = self.t0
        self._written_at_spawn: int | None = None
        self.stopping = 0.0  # seconds into the run when the writer was asked to stop

    def spawn(self, role: str) -> None:
        logf = open(os.path.join(self.work, f"{role}.log"), "a")  # noqa: SIM115  (child's)
        if role == "migrator":
            cmd = [PAFKA, "migrate", "--follow", self.root]
        else:
            cmd = [PY, os.path.join(HERE, "soak_roles.py"), role, self.root, self.work,
                   "--rows-per-batch", str(self.a.rows_per_batch)]
        if role == "writer":
            self._written_at_spawn = None
        self.procs[role] = subprocess.Popen(cmd, cwd=self.work, stdout=logf, stderr=logf,
                                            start_new_session=True)
        logf.close()
        log.info("started %s (pid %d)", role, self.procs[role].pid)

    def watch(self) -> None:
        """An exit nobody asked for is a crash: count it, start the process again."""
        for role, p in list(self.procs.items()):
            if p.poll() is not None:
                self.crashes.append(f"{role} exited with {p.returncode} at "
                                    f"{time.time() - self.t0:.0f} s (see {self.work}/{role}.log)")
                log.error("%s", self.crashes[-1])
                self.spawn(role)

    def writer_up(self, store) -> bool:
        """Whether the writer committed a batch since it was (re)started."""
        now = sum(store.topic(TOPIC).latest_offsets().values())
        if self._written_at_spawn is None:
            self._written_at_spawn = now
        return now > self._written_at_spawn

    def kill_writer(self) -> None:
        n = kill_tree(self.procs["writer"])
        self.kills.append(time.time() - self.t0)
        log.info("killed the writer's %d processes at %.0f s", n, self.kills[-1])
        self.spawn("writer")

    def sample(self, store) -> None:
        now = time.time()
        written = sum(store.topic(TOPIC).latest_offsets().values())
        read = soak_check.rows_read(self.work)
        s: dict = {"t": now - self.t0, "written": written, "read": read, "tiers": []}
        if self._last:
            dt = now - self._last[0]
            s["write_rate"] = (written - self._last[1]) / dt
            s["read_rate"] = (read - self._last[2]) / dt
        self._last = (now, written, read)
        for u in store.tier_usage():
            s["tiers"].append({"tier": u["tier"], "used": u["used"], "segments": u["segments"],
                               "disk": disk_bytes(u["path"])})
        kids = _children()
        marks = (self.shm, self.root)
        s["procs"] = {role: usage(tree(p.pid, kids), marks) for role, p in self.procs.items()}
        self.samples.append(s)

    def tick(self, store, watch: bool = True) -> None:
        """Restart what died (``watch``) and take a sample when one is due."""
        if watch:
            self.watch()
        if time.time() >= self._next_sample:
            self.sample(store)
            self._next_sample += self.a.sample

    def stop(self, role: str, timeout: float, store) -> None:
        """Ask ``role`` to stop (its stop file; SIGINT for the migrator) and wait, sampling."""
        p = self.procs[role]
        if role == "migrator":
            p.send_signal(signal.SIGINT)
        else:
            open(os.path.join(self.work, f"stop-{role}"), "w").close()
        t0 = time.time()
        while p.poll() is None and time.time() - t0 < timeout:
            self.tick(store, watch=False)
            time.sleep(0.2)
        del self.procs[role]
        if p.poll() is None:
            kill_tree(p)
            raise fail(f"{role} did not stop within {timeout:.0f} s (see {self.work}/"
                       f"{role}.log)")
        if p.returncode != 0:
            raise fail(f"{role} exited with {p.returncode} when stopped (see {self.work}/"
                       f"{role}.log)")

    def run(self) -> float:
        """The soak itself; returns T_end (wall clock)."""
        from tier_store import Store
        a = self.a
        for role in ("migrator", "writer", "reader"):
            self.spawn(role)
        store = Store.open(self.root)
        self._next_sample = time.time()
        rnd = random.Random(a.seed)
        end = self.t0 + a.minutes * 60
        next_kill = None
        # The run ends once its time is up and the writer has committed since its last
        # restart (recovery from the last kill is part of what is checked).
        while time.time() < end or not self.writer_up(store):
            if time.time() > end + 300:
                raise fail(f"the writer committed nothing within 300 s of its restart (see "
                           f"{self.work}/writer.log)")
            self.tick(store)
            if next_kill is None and self.writer_up(store):
                # Kills count from the writer's first commit, not its JVM's start.
                next_kill = time.time() + a.kill_every * rnd.uniform(0.5, 1.5)
            if next_kill is not None and time.time() >= next_kill:
                self.kill_writer()
                next_kill = None
            time.sleep(0.2)
        self.stopping = time.time() - self.t0
        self.stop("writer", 120, store)
        self.stop("reader", 600, store)
        self.stop("migrator", 60, store)
        t_end = time.time()
        self.sample(store)
        store.close()
        return t_end


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        stream=sys.stderr)
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float_range(0, 24 * 60, lo_open=True), default=30.0,
                    help="how long the writer runs (default 30)")
    ap.add_argument("--kill-every", type=float_range(1, 24 * 3600), default=None,
                    metavar="S", help="mean seconds between SIGKILLs of the writer (default: "
                                      "the run's quarter, at most 180)")
    ap.add_argument("--retention", type=float_range(1, 10**6), default=None, metavar="S",
                    help="log.retention.ms in seconds (default: the run's third, 60 to 600)")
    ap.add_argument("--rows-per-batch", type=int, default=2000,
                    help="rows per writer micro-batch, one a second at most (default 2000)")
    ap.add_argument("--tier1", type=float_range(1, 1 << 20), default=16, metavar="MIB",
                    help="tier-1 capacity in MiB (default 16)")
    ap.add_argument("--tier1-type", choices=["PMEM", "NVME"], default="PMEM",
                    help="tier 1: PMEM (pool files on /dev/shm, libpmem) or NVME (a file tier "
                         "on /dev/shm); tier 2 is an HDD tier on disk")
    ap.add_argument("--segment", type=int, default=1024, metavar="KIB",
                    help="log.segment.bytes in KiB (default 1024)")
    ap.add_argument("--segment-s", type=float_range(0.1, 3600), default=3.0, metavar="S",
                    help="log.segment.ms in seconds (default 3): small segments to merge")
    ap.add_argument("--sample", type=float_range(0.5, 600), default=5.0, metavar="S",
                    help="seconds between samples (default 5)")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--keep", action="store_true", help="keep the store and the outputs")
    ap.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    add_output_args(ap, ("soak/soak.png",))
    ap.add_argument("--report", dest="write_results", action="store_true",
                    help="alias of --write-results")
    a = ap.parse_args()
    secs = a.minutes * 60
    a.kill_every = a.kill_every or min(180.0, max(secs / 4, 5.0))
    a.retention = a.retention or min(600.0, max(secs / 3, 60.0))
    output = SoakOutput(a)
    tag = uuid.uuid4().hex[:6]
    base = os.path.join(HERE, "data", f"soak-{tag}")
    root, work = os.path.join(base, "store"), os.path.join(base, "work")
    shm = f"/dev/shm/pafka-soak-{tag}"
    os.makedirs(work)
    from tier_store import Store
    with Store.open(root, store_conf(a, shm), create=True) as store:
        # Created here, not by the sink's first batch, so that the reader starts with the
        # writer: the schema is the one the sink would give it.
        store.create_topic(TOPIC, TOPIC_SCHEMA, partitions=PARTITIONS)
    soak = Soak(a, root, work, shm)
    ok = False
    try:
        t_end = soak.run()
        figures = soak_check.check(root, work, t_end, a.retention)
        figures.update(soak_check.summary(soak.samples, soak.kills, soak.crashes, root,
                                          soak.stopping, work))
        figures["args"] = {k: v for k, v in vars(a).items() if k != "out"}
        ok = soak_check.passed(figures)
    finally:
        for role in list(soak.procs):
            kill_tree(soak.procs.pop(role))
        if ok and not a.keep:
            shutil.rmtree(base, ignore_errors=True)
            shutil.rmtree(shm, ignore_errors=True)
        else:
            print(f"kept the store and outputs: {base} and {shm}", file=sys.stderr)
    figures["samples"] = soak.samples
    dump_raw(figures)
    output.figure("soak.png", lambda p: soak_check.plot(soak.samples, soak.kills,
                                                             soak.stopping, p))
    output.report("soak", soak_check.report(figures))
    if a.json:
        print(json.dumps(figures, default=float))
    if not ok:
        raise fail("the final check found " + "; ".join(soak_check.problems(figures)))


if __name__ == "__main__":
    main()
