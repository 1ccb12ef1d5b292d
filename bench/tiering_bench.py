"""Tiering benchmark: Pafka's burst and steady scenarios, tiered storage against tier 2 alone.

    .venv/bin/python bench/tiering_bench.py [--write-results] [--out DIR]

Tier 1 is a pmem tier on /dev/shm; tier 2 a file tier on disk **throttled to an HDD's
bandwidth** (a simulation: this VM's disk writes at about 1.4 GB/s, Pafka's HDD at about
80 MB/s). The throttle is a token bucket shared by every process of the run through a small
file under ``flock``, charged for every byte written to tier 2 — by producers when tier 1 is
full and by the migration service when it moves segments down. Each process installs it with
the tier store's hook :func:`tier_store.throttle_tier_writes` on the store's file tiers; the
service's own cap (``storage.migrate.bytes.per.second``) stays off, so the device alone paces
the moves.

Producers, a consumer and the migration service are separate processes using the tier
store's Python API, like Pafka's multi-client benchmark. Throughput is sampled per second
from the producers' acknowledged appends; tier 1's usage is sampled from this process.
The store runs at its default ``log.cleanup.grace.ms``: readers pin the pool files they map,
so a pool file freed by a move returns to the pool at once.

Burst: a low rate, a burst well above tier 2's bandwidth, the low rate for the interval the
drain formula gives, a second burst, the low rate again. Steady: continuous production with
migration off, retention at 1×, 1.5× and 2× tier 1.

The report is printed; ``--write-results`` rewrites this script's section of
``bench/RESULTS.md`` and ``bench/tiering_burst.png``; ``--out DIR`` writes both into DIR. A
run whose processes fail or whose measurement is degenerate exits non-zero.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import json
import logging
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from bench_common import (  # noqa: E402
    Output,
    add_output_args,
    fail,
    float_range,
    int_range,
    positive,
)

MB = 1_000_000
MiB = 1 << 20
RECORD_BYTES = 116  # int64 key, int64 ts, 100-byte value
CHUNK_ROWS = 32_000  # ≈ 3.7 MB per append at the default scale
SEGMENT_BYTES = 32 * MiB
SEGMENT_HEADER = 4096  # tier_store.SEGMENT_HEADER_SIZE
CHUNK_SLACK = 8192  # per append: the IPC metadata and the alignment of the next chunk
LEAD_S = 4  # the low rate before the first burst and after the second
FIGURE = "tiering_burst.png"
SECTION = "tiering-bench"


# -- the simulated HDD ----------------------------------------------------------------------
class DeviceThrottle:
    """A token bucket shared across processes: the next free instant lives in a file."""

    def __init__(self, path: str, rate: float):
        self.path, self.rate = path, rate
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def __call__(self, nbytes: int) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(self.fd, 8, 0)
            nxt = struct.unpack("<d", raw)[0] if len(raw) == 8 else 0.0
            now = time.time()
            nxt = max(nxt, now) + nbytes / self.rate
            os.pwrite(self.fd, struct.pack("<d", nxt), 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        time.sleep(max(0.0, nxt - now))  # the transfer ends when the device gets to it

    def selected(self) -> set[int]:
        """The tier numbers the selection file (:func:`select_hdd_tiers`) names now."""
        try:
            with open(selection_file(self.path)) as f:
                return {int(n) for n in f.read().split(",") if n.strip()}
        except FileNotFoundError:
            return set()

    def charge_if_selected(self, tier: int, nbytes: int) -> None:
        """Charge ``nbytes`` written to tier ``tier`` if it is selected now."""
        if tier in self.selected():
            self(nbytes)


def selection_file(throttle_file: str) -> str:
    """The file naming the tiers that are the simulated HDD now (``follow_selection``)."""
    return f"{throttle_file}.tiers"


def select_hdd_tiers(throttle_file: str, tiers: Iterable[int]) -> None:
    """Name ``tiers`` as the simulated HDD from now on, in every process that installed the
    throttle with ``follow_selection`` (before writing to a store whose HDD tiers have other
    numbers than the last one's)."""
    tmp = f"{selection_file(throttle_file)}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(",".join(str(n) for n in tiers))
    os.replace(tmp, selection_file(throttle_file))


def hdd_tiers(store) -> list[int]:
    """The numbers of the store's file tiers (neither a pmem pool nor remote): those the
    benchmark simulates as an HDD."""
    return [t.number for t in store.tiers if not t.has_pool and not t.is_remote]


def install_throttle(throttle_file: str, rate: float, tiers: Iterable[int],
                     follow_selection: bool = False) -> DeviceThrottle:
    """Make tiers ``tiers`` (numbers) the simulated HDD in this process: every write to one —
    appends, and moves' copies — is charged to the bucket shared through ``throttle_file``
    (:func:`tier_store.throttle_tier_writes`). With ``follow_selection``, only those of them
    that :func:`select_hdd_tiers` named last are charged, for processes that write to one
    store after another whose HDD tiers have different numbers (Spark's Python workers)."""
    from tier_store import throttle_tier_writes

    bucket = DeviceThrottle(throttle_file, rate)
    for n in tiers:
        throttle_tier_writes(functools.partial(bucket.charge_if_selected, n)
                             if follow_selection else bucket, n)
    return bucket


# -- processes ------------------------------------------------------------------------------
def _schema():
    import pyarrow as pa
    return pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.binary(100))])


def _batch(schema, rows: int, values: bytes):
    import numpy as np
    import pyarrow as pa
    return pa.record_batch([pa.array(np.arange(rows, dtype=np.int64)),
                            pa.array(np.zeros(rows, dtype=np.int64)),
                            pa.FixedSizeBinaryArray.from_buffers(
                                pa.binary(100), rows, [None, pa.py_buffer(values)]
                            ).cast(schema[2].type)],
                           schema=schema)


def wait_go(go: str, tag: str) -> float:
    """Say this process is ready (a marker file beside ``go``), then wait for the run's start
    time, which the benchmark writes into ``go`` once every process is ready: a process slow
    to start (imports, a loaded machine) does not eat into the schedule."""
    with open(f"{go}.ready-{tag}", "w"):
        pass
    deadline = time.time() + 300
    while not os.path.exists(go):
        if time.time() > deadline:
            raise SystemExit(f"{tag}: no start signal in 300 s")
        time.sleep(0.01)
    with open(go) as f:
        return float(f.read())


def producer(args: argparse.Namespace) -> None:
    """Append batches of ``--rows`` rows following the rate schedule; log (time, bytes) per
    append."""
    import numpy as np

    from tier_store import Store
    store = Store.open(args.root)
    install_throttle(args.throttle, args.hdd, hdd_tiers(store))
    t = store.topic("bench")
    values = np.random.default_rng(args.id).integers(0, 255, args.rows * 100,
                                                     dtype=np.uint8).tobytes()
    batch = _batch(t.schema, args.rows, values)
    schedule = json.loads(args.schedule)  # [[seconds, MB/s per producer], ...]
    start = wait_go(args.go, f"producer-{args.id}")
    ends = []
    at = start
    for dur, _ in schedule:
        at += dur
        ends.append(at)
    phase_start = start
    with open(args.log, "w") as log:
        for (_, rate), end in zip(schedule, ends, strict=True):
            sent = 0.0
            while time.time() < end:
                due = phase_start + sent / (rate * MB) if rate > 0 else end
                wait = due - time.time()
                if wait > 0:
                    time.sleep(min(wait, 0.05))
                    continue
                t.append(batch, partition=args.id % t.partitions)
                nbytes = batch.nbytes
                sent += nbytes
                log.write(f"{time.time():.4f} {nbytes}\n")
            phase_start = end


def consumer(args: argparse.Namespace) -> None:
    """Read every partition from its latest offset, polling every 50 ms; print what was read
    (one JSON line on stdout)."""
    from tier_store import Store
    t = Store.open(args.root).topic("bench")
    pos = dict(t.latest_offsets())
    end = wait_go(args.go, "consumer") + args.seconds
    read = rows = 0
    while time.time() < end:
        for p in range(t.partitions):
            for b in t.read(p, pos[p]):
                pos[p] += b.num_rows
                rows += b.num_rows
                read += b.nbytes
        time.sleep(0.05)
    print(json.dumps({"read_bytes": read, "rows": rows}), flush=True)


class _FirstOfEach(logging.Filter):
    """Let through the first of each warning (digits aside); count the repeats."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()
        self.repeated = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = re.sub(r"\d+", "#", record.getMessage())
        if key in self.seen:
            self.repeated += 1
            return False
        self.seen.add(key)
        return True


def migrator(args: argparse.Namespace) -> None:
    from migration import MigrationService
    from tier_store import Store
    store = Store.open(args.root)
    install_throttle(args.throttle, args.hdd, hdd_tiers(store))
    logging.basicConfig(level=logging.WARNING, format="migration service: %(message)s")
    once = _FirstOfEach()
    for h in logging.getLogger().handlers:
        h.addFilter(once)
    moves: list[tuple[float, int, int, int, float]] = []  # (end s, from, to, bytes, s)
    svc = MigrationService(store, on_move=lambda r: moves.append(
        (time.time(), min(r.from_tiers), r.to_tier, r.bytes, r.seconds)))
    go = wait_go(args.go, "migrator")
    end = go + args.seconds
    while time.time() < end:
        svc.run_once()
        time.sleep(0.2)
    s = svc.stats
    print(json.dumps({"runs": s.runs, "segments_down": s.segments_down,
                      "segments_up": s.segments_up, "bytes_down": s.bytes_down,
                      "bytes_up": s.bytes_up, "failed_moves": s.failed_moves,
                      "repeated_warnings": once.repeated,
                      "moves": [(round(t - go, 2), a, b, n, round(d, 3))
                                for t, a, b, n, d in moves]}), flush=True)


# -- scenarios ------------------------------------------------------------------------------
def segment_bytes(c1: int) -> int:
    """32 MiB, or a sixteenth of tier 1 when that is smaller (a scaled-down run keeps the
    tier's pool in many files)."""
    return max(256 * 1024, min(SEGMENT_BYTES, c1 // 16))


def chunk_rows(seg: int) -> int:
    """Rows per append: at most 32,000 (≈ 3.7 MB), and such that a whole number of appends
    (8 or more) fills a segment, so that a pool file holds what its size says (Pafka's
    formulas count bytes)."""
    room = seg - SEGMENT_HEADER
    k = max(8, math.ceil(room / (CHUNK_ROWS * RECORD_BYTES + CHUNK_SLACK)))
    return max(100, (room // k - CHUNK_SLACK) // RECORD_BYTES)


def store_conf(tiered: bool, fast: str, conf_extra: dict, lake: str | None = None
               ) -> tuple[dict, list[int]]:
    """The store configuration of a run and the numbers of its throttled (HDD) tiers.
    ``log.cleanup.grace.ms`` stays at its default; the service's own copy cap is off, so
    that the simulated device alone paces the moves. With ``lake`` (a directory), a tiered
    store has a LAKE third tier there, on the same simulated HDD: tier 2 then holds twice
    tier 1, and the policy demotes what passes its threshold to the lake."""
    conf = {"log.segment.bytes": "32m", "storage.migrate.interval.ms": 200,
            "storage.migrate.bytes.per.second": 0, **conf_extra}
    if tiered:
        conf.update({"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
                     "storage.tiers.first.paths": fast, "log.pmem.pool.ratio": 1.0})
        if lake is None:
            return conf, [2]
        from tier_store import parse_size
        c1 = parse_size(conf["storage.tiers.first.sizes"])
        conf.update({"storage.tiers.types": "PMEM,HDD,LAKE", "storage.tiers.3.paths": lake,
                     "storage.tiers.2.sizes": str(2 * c1)})
        return conf, [2, 3]
    conf.update({"storage.tiers.first.sizes": "64g"})
    return conf, [1]


def prefill_topic(t, nbytes: int, rows: int = 32_000) -> None:
    """Append ``nbytes`` over the topic's partitions: Pafka's balanced state, tier 1 holding
    threshold × its capacity when a burst comes."""
    batch = _batch(t.schema, rows, bytes(rows * 100))
    done = 0
    while done < nbytes:
        t.append(batch, partition=(done // batch.nbytes) % t.partitions)
        done += batch.nbytes


def _spawn(role: str, argv: list[str], capture: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), role, *argv],
                            cwd=ROOT, stdout=subprocess.PIPE if capture else None, text=True)


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    """Terminate the run's processes still alive (this run's own, by pid)."""
    for p in procs.values():
        if p.poll() is None:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def supervise(label: str, procs: dict[str, subprocess.Popen], deadline: float,
              sample=None, ready=None) -> None:
    """Wait for every process to end (or, with ``ready``, until ``ready()``); the first that
    exits with an error (or the deadline) stops the others and the benchmark."""
    while True:
        if ready is not None and ready():
            return
        alive = False
        for role, p in procs.items():
            rc = p.poll()
            if rc is None:
                alive = True
            elif rc != 0:
                _stop(procs)
                raise fail(f"{label}: the {role} process exited with status {rc} (its error "
                           "is printed above); no figure from this run is meaningful")
        if not alive:
            if ready is not None:
                raise fail(f"{label}: every process ended before all were ready")
            return
        if time.time() > deadline:
            _stop(procs)
            raise fail(f"{label}: processes still running "
                       f"{', '.join(r for r, p in procs.items() if p.returncode is None)} "
                       "past the scenario's deadline; stopped them")
        if sample is not None:
            sample()
        time.sleep(0.25)


def _last_json(label: str, role: str, text: str) -> dict:
    """The JSON line a process printed last."""
    lines = text.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise fail(f"{label}: the {role} process exited without reporting what it did "
                   f"(its output: {text[-300:]!r})") from None


def run_scenario(name: str, tiered: bool, schedule: list, producers: int, hdd: float,
                 conf_extra: dict, base: str, shm: str, prefill: int = 0,
                 lake: bool = False) -> dict:
    label = f"{name} ({'tiered' if tiered else 'HDD only'})"
    root = os.path.join(base, f"{name}-{'tiered' if tiered else 'hdd'}-{uuid.uuid4().hex[:6]}")
    fast = os.path.join(shm, f"pafka-tier1-{uuid.uuid4().hex[:6]}")
    conf, slow = store_conf(tiered, fast, conf_extra, root + "-lake" if lake else None)
    from tier_store import Store
    procs: dict[str, subprocess.Popen] = {}
    try:
        s = Store.open(root, conf)
        if hdd_tiers(s) != slow:  # what the processes throttle, from the store's tiers
            raise fail(f"{label}: the store's file tiers are {hdd_tiers(s)}, not {slow}")
        rows = chunk_rows(s.config["log.segment.bytes"])
        t = s.create_topic("bench", _schema(), partitions=producers)
        if prefill:
            prefill_topic(t, prefill, rows)
        grace = s.config["log.cleanup.grace.ms"]
        throttle = os.path.join(base, f"throttle-{uuid.uuid4().hex[:6]}")
        seconds = sum(d for d, _ in schedule)
        go = os.path.join(base, f"go-{uuid.uuid4().hex[:6]}")
        common = ["--root", root, "--throttle", throttle, "--hdd", str(hdd),
                  "--seconds", str(seconds + 2), "--go", go]
        logs = []
        for i in range(producers):
            log = os.path.join(base, f"{name}-{i}-{uuid.uuid4().hex[:6]}.log")
            logs.append(log)
            procs[f"producer {i}"] = _spawn("producer", common + [
                "--id", str(i), "--schedule", json.dumps(schedule),
                "--log", log, "--rows", str(rows)])
        procs["consumer"] = _spawn("consumer", common, capture=True)
        tags = [f"producer-{i}" for i in range(producers)] + ["consumer"]
        if tiered and conf.get("storage.migrate.threshold", 0.5) != -1:
            procs["migration service"] = _spawn("migrator", common, capture=True)
            tags.append("migrator")
        supervise(label, procs, time.time() + 300,
                  ready=lambda: all(os.path.exists(f"{go}.ready-{t}") for t in tags))
        start = time.time() + 0.5
        with open(go + ".tmp", "w") as f:
            f.write(repr(start))
        os.replace(go + ".tmp", go)
        # (s from start, tier-1 bytes used, pool files in use)
        tier1: list[tuple[float, int, int]] = []
        last = [0.0]

        def sample() -> None:
            now = time.time()
            if not tiered or now - last[0] < 0.5 or now < start:
                return
            last[0] = now
            try:
                u = Store.open(root).tier_usage()[0]
            except Exception as e:  # a sample is not worth the run
                print(f"  (tier usage sample failed: {type(e).__name__}: {e})", flush=True)
                return
            tier1.append((now - start, u["used"], u["pool_files"] - u["pool_free"]))

        supervise(label, procs, start + seconds + 120, sample)
        out = {role: _last_json(label, role, p.stdout.read())
               for role, p in procs.items() if p.stdout is not None}
        samples = []
        for i, log in enumerate(logs):
            with open(log) as f:
                got = [tuple(map(float, line.split())) for line in f]
            if not got:
                raise fail(f"{label}: producer {i} acknowledged no append in {seconds} s")
            samples += got
        usage = Store.open(root).tier_usage()
    finally:
        _stop(procs)  # those still alive when the run stopped early
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(fast, ignore_errors=True)
    produced = sum(n for _, n in samples)
    read = out["consumer"]["read_bytes"]
    if read <= 0:
        raise fail(f"{label}: the consumer read nothing of the {produced / MB:,.0f} MB "
                   "produced")
    print(f"  {label}: produced {produced / MB:,.0f} MB, consumer read {read / MB:,.0f} MB"
          + (f", migration {move_summary(out['migration service'])}"
             if "migration service" in out else "")
          + f"; tiers at the end {[u['used'] // MB for u in usage]} MB", flush=True)
    return {"samples": sorted(samples), "start": start, "seconds": seconds, "usage": usage,
            "tier1": tier1, "grace": grace, "consumer": out["consumer"], "produced": produced,
            "migration": out.get("migration service")}


def move_summary(stats: dict) -> dict:
    """The migration service's counters, its moves summed by (from, to) tier: MB moved and
    seconds spent (the moves' own durations, threads overlapping)."""
    out = {k: v for k, v in stats.items() if k != "moves"}
    pairs: dict[str, list[float]] = {}
    for _, a, b, n, d in stats.get("moves", []):
        p = pairs.setdefault(f"{a}->{b}", [0.0, 0.0])
        p[0] += n / MB
        p[1] += d
    out["moved"] = {k: f"{mb:,.0f} MB in {sec:.1f} s" for k, (mb, sec) in sorted(pairs.items())}
    return out


def per_second(result: dict, step: float = 1.0) -> list[float]:
    """Ingest in MB/s over bins of ``step`` seconds."""
    n = int(result["seconds"] / step)
    out = [0.0] * n
    for ts, nbytes in result["samples"]:
        i = int((ts - result["start"]) / step)
        if 0 <= i < n:
            out[i] += nbytes / MB / step
    return out


def burst_window(series: list[float], start_s: float, len_s: float, floor: float,
                 step: float) -> tuple[float, float]:
    """(seconds, mean MB/s) from the burst's start while ingest stayed above ``floor``."""
    n, total = 0, 0.0
    for v in series[int(start_s / step):int((start_s + len_s) / step)]:
        if v <= floor:
            break
        n += 1
        total += v
    return n * step, total / max(n, 1)


def drained_after(tier1: list[tuple[float, int, int]], after_s: float, until_s: float,
                  limit: int) -> float | None:
    """Seconds from ``after_s`` until tier 1's pool files in use were first sampled at or
    under ``limit`` (before ``until_s``); None if they never were."""
    for t, _, files in tier1:
        if after_s <= t <= until_s and files <= limit:
            return t - after_s
    return None


def plot(path: str, title: str, curves: dict[str, list[float]],
         tier1: list[tuple[float, int, int]], c1: int, seg: int, threshold: float,
         marks: list[float]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    for label, ys in curves.items():
        ax.plot(range(len(ys)), ys, label=label)
    ax.set_ylabel("ingest MB/s")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    end = max(len(ys) for ys in curves.values())
    tier1 = [x for x in tier1 if x[0] <= end]
    if tier1:
        ax2.plot([t for t, _, _ in tier1], [f * seg / MB for _, _, f in tier1],
                 label="tier 1: pool files in use (tiered run)")
    ax2.axhline(threshold * c1 / MB, ls="--", c="grey", label="threshold")
    ax2.axhline(c1 / MB, ls=":", c="grey", label="capacity")
    for x in marks:
        ax.axvline(x, c="k", alpha=0.15)
        ax2.axvline(x, c="k", alpha=0.15)
    ax2.set_xlabel("seconds")
    ax2.set_ylabel("MB")
    ax2.legend(loc="best", fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdd", type=float_range(1e5, 1e10), default=80 * MB, metavar="BYTES/S",
                    help="simulated tier-2 bandwidth in bytes/s (default 80e6)")
    ap.add_argument("--tier1", type=int_range(16, 1 << 20), default=1024, metavar="MIB",
                    help="tier-1 capacity in MiB (16 or more; default 1024)")
    ap.add_argument("--producers", type=int_range(1, 16), default=2,
                    help="producer processes, one partition each (1–16; default 2)")
    ap.add_argument("--low-rate", type=float_range(0.0, 1e5), default=10.0, metavar="MB/S",
                    help="rate per producer between bursts (default 10); all producers' "
                         "low rate together must stay under tier 2's bandwidth")
    ap.add_argument("--burst-rate", type=float_range(0.0, 1e5, lo_open=True), default=150.0,
                    metavar="MB/S", help="rate per producer in a burst (default 150); all "
                                         "producers together must offer over twice tier 2's "
                                         "bandwidth")
    ap.add_argument("--steady-seconds", type=int_range(1, 3600), default=30,
                    help="length of each steady run (default 30)")
    ap.add_argument("--scenario", choices=("all", "burst", "steady"), default="all",
                    help="which scenarios to run (default all; the report covers those run)")
    ap.add_argument("--lake", action="store_true",
                    help="tiered stores get a LAKE third tier on the simulated HDD (tier 2 "
                         "sized twice tier 1), so the service also converts to Parquet")
    add_output_args(ap, (FIGURE,))
    args = ap.parse_args(argv)
    b2 = args.hdd / MB
    if args.burst_rate * args.producers <= 2 * b2:
        ap.error(f"--burst-rate {args.burst_rate:g} × --producers {args.producers} = "
                 f"{args.burst_rate * args.producers:g} MB/s must exceed twice the tier-2 "
                 f"bandwidth --hdd ({b2:g} MB/s × 2 = {2 * b2:g}): the burst is measured "
                 "while ingest stays above that")
    if args.low_rate * args.producers >= b2:
        ap.error(f"--low-rate {args.low_rate:g} × --producers {args.producers} = "
                 f"{args.low_rate * args.producers:g} MB/s must stay under the tier-2 "
                 f"bandwidth --hdd ({b2:g} MB/s): tier 1 could never drain between bursts")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    output = Output(args)
    base = os.path.join(HERE, "data", f"tiering-{uuid.uuid4().hex[:6]}")
    os.makedirs(base)
    try:
        results = run(args, output, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    output.report(SECTION, report(args, **results))


def run(args: argparse.Namespace, output: Output, base: str) -> dict:
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        raise fail("no /dev/shm for tier 1")
    c1 = args.tier1 * MiB
    seg = segment_bytes(c1)
    hdd = args.hdd
    b2 = hdd / MB
    threshold = 0.5
    out: dict = {"c1": c1, "seg": seg, "threshold": threshold, "burst": None, "steady": None}
    conf_base = {"storage.tiers.first.sizes": str(c1), "log.segment.bytes": str(seg)}
    if args.scenario in ("all", "burst"):
        out["burst"] = run_burst(args, output, base, shm, c1, seg, b2, threshold, conf_base)
    if args.scenario in ("all", "steady"):
        steady = {}
        secs = args.steady_seconds
        for factor in (1.0, 1.5, 2.0):
            # Retention is all that frees tier 1 here: commits check it every second, not
            # at the default interval (5 minutes, Kafka's), which a 30 s run never reaches.
            conf_s = {**conf_base, "storage.migrate.threshold": -1,
                      "log.retention.bytes": str(int(factor * c1 / args.producers)),
                      "log.retention.check.interval.ms": 1000}
            sched = [[secs, 1000.0]]
            rt = run_scenario("steady", True, sched, args.producers, hdd, conf_s, base, shm,
                              lake=args.lake)
            rf = run_scenario("steady", False, sched, args.producers, hdd, conf_s, base, shm)
            t_rate = positive(sum(per_second(rt)) / secs, f"steady {factor}× tiered ingest")
            h_rate = positive(sum(per_second(rf)) / secs, f"steady {factor}× HDD-only ingest")
            steady[factor] = (t_rate, h_rate, rt["grace"])
            print(f"steady {factor}x: tiered {t_rate:.0f} MB/s, hdd {h_rate:.0f} MB/s",
                  flush=True)
        out["steady"] = steady
    return out


def run_burst(args, output: Output, base: str, shm: str, c1: int, seg: int, b2: float,
              threshold: float, conf_base: dict) -> dict:
    """Tier 1 prefilled to the threshold (Pafka's balanced state), the low rate, a burst well
    above tier 2's bandwidth, the low rate for the interval the drain formula gives, another
    burst, the low rate again."""
    low, burst = args.low_rate, args.burst_rate
    low_total, burst_total = low * args.producers, burst * args.producers
    reserved = (1 - threshold) * c1 / MB
    expected = reserved / (burst_total - b2)
    # Pafka's drain formula, reserved ÷ tier-2 bandwidth, assumes nothing arrives between
    # bursts; here the producers keep their low rate, which tier 1 takes too.
    pafka_interval = reserved / b2
    interval = reserved / (b2 - low_total)
    burst_len = int(expected * 2) + 4
    gap = math.ceil(interval)  # the second burst starts once the formula says tier 1 drained
    schedule = [[LEAD_S, low], [burst_len, burst], [gap, low], [burst_len, burst],
                [LEAD_S, low]]
    conf = {**conf_base, "storage.migrate.threshold": threshold}
    print(f"burst: expected {expected:.1f} s at {burst_total:.0f} MB/s, drain interval "
          f"{interval:.1f} s (Pafka's formula without the low rate: {pafka_interval:.1f} s); "
          f"segments {seg / MiB:g} MiB; schedule {schedule}", flush=True)
    prefill = int(threshold * c1)
    tiered = run_scenario("burst", True, schedule, args.producers, args.hdd, conf, base, shm,
                          prefill, lake=args.lake)
    flat = run_scenario("burst", False, schedule, args.producers, args.hdd, conf, base, shm,
                        prefill)
    st, sf = per_second(tiered), per_second(flat)
    step = 0.25
    qt = per_second(tiered, step)
    print("tiered per second:", [round(v) for v in st], flush=True)
    print("hdd-only per second:", [round(v) for v in sf], flush=True)
    pool = c1 // seg
    print(f"tier 1 (s, MB used, pool files in use of {pool}):",
          [(round(t, 1), u // MB, f) for t, u, f in tiered["tier1"]], flush=True)
    moves = (tiered["migration"] or {}).get("moves", [])
    for pair in sorted({(a, b) for _, a, b, _, _ in moves}):
        print(f"moves {pair[0]}->{pair[1]} (s ended, MB):",
              [(t, n // MB) for t, a, b, n, _ in moves if (a, b) == pair], flush=True)
    second_at = LEAD_S + burst_len + gap
    output.figure(FIGURE, lambda path: plot(
        path, "Burst: ingest over time (tier 2 throttled to an HDD's bandwidth)",
        {"tiered (pmem on /dev/shm + HDD)": st, "HDD only": sf}, tiered["tier1"], c1, seg,
        threshold, [LEAD_S, LEAD_S + burst_len, second_at, second_at + burst_len]))
    # The burst lasts while ingest stays well above what tier 2 alone takes.
    floor = 2 * b2
    first, in_burst_t = burst_window(qt, LEAD_S, burst_len, floor, step)
    second, _ = burst_window(qt, second_at, burst_len, floor, step)
    if first <= 0:
        raise fail(f"burst: the tiered store's ingest never rose above {floor:.0f} MB/s "
                   f"(twice the tier-2 bandwidth) at the first burst's start (offered "
                   f"{burst_total:.0f} MB/s; per-second ingest {[round(v) for v in st]}): no "
                   "burst to measure, so no duration and no prediction")
    n = max(1, int(first))
    in_burst_f = positive(sum(sf[LEAD_S:LEAD_S + n]) / n, "HDD-only ingest during the burst")
    # Pafka's formula with the rate the producers reached during the burst (> floor > b2).
    predicted = reserved / (in_burst_t - b2)
    # When tier 1 was back at its threshold after the first burst (its pool files in use
    # within one per partition, the active segments, of the threshold), as sampled.
    drain = drained_after(tiered["tier1"], LEAD_S + burst_len, second_at + 1,
                          int(threshold * pool) + args.producers)
    print(f"burst windows {first}, {second}; tiered {in_burst_t:.0f} MB/s, hdd "
          f"{in_burst_f:.0f} MB/s; predicted {predicted:.2f} s; tier 1 back at its threshold "
          f"{'never' if drain is None else f'{drain:.1f} s'} after the first burst",
          flush=True)
    return {"predicted": predicted, "interval": interval, "pafka_interval": pafka_interval,
            "first": first, "second": second, "in_t": in_burst_t, "in_f": in_burst_f,
            "burst_total": burst_total, "low_total": low_total, "gap": gap, "drain": drain,
            "grace": tiered["grace"], "burst_len": burst_len, "tiered": tiered}


def report(args, c1, seg, threshold, burst, steady) -> str:
    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    grace = (burst or {}).get("grace") or next(iter((steady or {}).values()))[2]
    cmd = ".venv/bin/python bench/tiering_bench.py" + "".join(
        f" --{k.replace('_', '-')} {v:g}" if isinstance(v, float) else
        f" --{k.replace('_', '-')} {v}"
        for k, v, d in (("tier1", args.tier1, 1024), ("hdd", args.hdd, 80 * MB),
                        ("producers", args.producers, 2), ("low_rate", args.low_rate, 10.0),
                        ("burst_rate", args.burst_rate, 150.0),
                        ("steady_seconds", args.steady_seconds, 30),
                        ("scenario", args.scenario, "all")) if v != d) + \
        (" --lake" if args.lake else "")
    lake = (" Tier 3 (`--lake`): a LAKE tier on the same throttled disk; tier 2 holds twice "
            "tier 1, and the service converts what passes its threshold to Parquet, in the "
            "lake's Delta table.") if args.lake else ""
    lines = [
        "## Tiering (`bench/tiering_bench.py`): Pafka's burst and steady scenarios", "",
        f"Command: `{cmd}` — tier 1: pmem tier on /dev/shm, {args.tier1} MiB, threshold "
        f"{threshold}, segments of {seg / MiB:g} MiB; tier 2: file tier on disk **throttled "
        f"to {args.hdd / MB:g} MB/s (a simulation of an HDD; this disk does ≈1.4 GB/s)**, "
        "the throttle shared by producers and the migration service. "
        f"{args.producers} producer processes appending {chunk_rows(seg):,} records "
        f"({chunk_rows(seg) * RECORD_BYTES / MB:.2f} MB) at a time, so that whole appends "
        "fill a segment, a consumer process reading from the latest "
        "offsets, and the migration service in its own process (every 200 ms). "
        f"`log.cleanup.grace.ms` is the default ({grace:,} ms): readers pin the pool files "
        "they map, so a pool file freed by a move returns to the pool at once. Peers: the "
        "same run against a store whose only tier is the throttled HDD." + lake,
    ]
    if burst:
        b = burst
        within = abs(b["first"] - b["predicted"]) <= 0.25 * b["predicted"]
        within2 = abs(b["second"] - b["predicted"]) <= 0.25 * b["predicted"]
        ratio = b["in_t"] / b["in_f"]
        drain = "never, within the run" if b["drain"] is None else f"{b['drain']:.1f} s"
        lines += [
            "", f"![burst]({FIGURE})", "",
            f"Schedule: {LEAD_S} s at {args.low_rate:g} MB/s per producer, a burst of "
            f"{b['burst_len']} s at {args.burst_rate:g} MB/s per producer, {b['gap']} s at "
            "the low rate (the drain interval below, rounded up), the same burst again, "
            f"{LEAD_S} s at the low rate. Tier 1 is prefilled to its threshold first.", "",
            "| burst | value | expected |", "|---|---|---|",
            f"| offered burst rate | {b['burst_total']:.0f} MB/s | — |",
            f"| ingest during the burst, tiered vs HDD only | {b['in_t']:.0f} vs "
            f"{b['in_f']:.0f} MB/s = {ratio:.1f}× | ≥ 3×: {verdict(ratio >= 3)} |",
            f"| first burst's duration (0.25-s bins with ingest above twice the tier-2 "
            f"bandwidth) | {b['first']:.2f} s | (1 − threshold) × C1 ÷ (measured burst rate − "
            f"tier-2 bandwidth) = {b['predicted']:.2f} s; within 25%: {verdict(within)} |",
            f"| interval between the bursts | {b['gap']} s | reserved capacity ÷ (tier-2 "
            f"bandwidth − low rate {b['low_total']:g} MB/s) = {b['interval']:.1f} s (Pafka's "
            f"reserved ÷ tier-2 bandwidth, nothing arriving: {b['pafka_interval']:.1f} s) |",
            f"| tier 1 back at its threshold after the first burst (sampled every 0.5 s, "
            f"within a segment per partition) | {drain} | ≤ the interval |",
            f"| second burst's duration, after that interval | {b['second']:.2f} s | as the "
            f"first: within 25% of {b['predicted']:.2f} s: {verdict(within2)} |",
        ]
    if steady:
        lines += ["", f"Steady: {args.steady_seconds} s of production as fast as the producers "
                  "go, migration off, `log.retention.bytes` per partition such that the "
                  "topic keeps the given multiple of tier 1, checked every second "
                  "(`log.retention.check.interval.ms`=1000).", "",
                  "| steady production, migration off | tiered | HDD only | ratio | target |",
                  "|---|---|---|---|---|"]
        for f, (t, h, _) in steady.items():
            ok = "" if f != 1.5 else (" ≥ 1.5×: " + verdict(t / h >= 1.5))
            lines.append(f"| log.retention.bytes = {f}× tier 1 | {t:.0f} MB/s | {h:.0f} MB/s | "
                         f"{t / h:.2f}× |{ok} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("producer", "consumer", "migrator"):
        role = sys.argv[1]
        ap = argparse.ArgumentParser()
        for opt in ("--root", "--throttle", "--schedule", "--log", "--go"):
            ap.add_argument(opt)
        ap.add_argument("--hdd", type=float)
        ap.add_argument("--seconds", type=float)
        ap.add_argument("--id", type=int, default=0)
        ap.add_argument("--rows", type=int, default=CHUNK_ROWS)
        a = ap.parse_args(sys.argv[2:])
        if os.environ.get("PAFKA_BENCH_CRASH") == role:  # tests/test_bench.py
            raise SystemExit(f"{role}: crashing on purpose (PAFKA_BENCH_CRASH={role})")
        {"producer": producer, "consumer": consumer, "migrator": migrator}[role](a)
    else:
        main()
