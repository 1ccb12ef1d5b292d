"""Tiering benchmark: Pafka's burst and steady scenarios, tiered storage against tier 2 alone.

    .venv/bin/python bench/tiering_bench.py [--out bench/RESULTS.md]

Tier 1 is a pmem tier on /dev/shm; tier 2 a file tier on disk **throttled to an HDD's
bandwidth** (a simulation: this VM's disk writes at about 1.4 GB/s, Pafka's HDD at about
80 MB/s). The throttle is a token bucket shared by every process of the run through a small
file under ``flock``, charged for every byte written to tier 2 — by producers when tier 1 is
full and by the migration service when it moves segments down. It exists only in this script.

Producers, a consumer and the migration service are separate processes using the tier
store's Python API, like Pafka's multi-client benchmark. Throughput is sampled per second
from the producers' acknowledged appends.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import struct
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

MB = 1_000_000
# A pool file freed by a move returns to the pool only after log.cleanup.grace.ms (readers
# that planned against it may still read it). Short here, so that the migration's drain
# frees room during a burst, as Pafka's formula assumes; see the report.
GRACE_MS = 300
CHUNK_ROWS = 32_000  # ≈ 3.7 MB per append (int64 key, int64 ts, 100-byte value)


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


def install_throttle(throttle_file: str, rate: float, slow_tier: int | None) -> None:
    """Charge every write to tier ``slow_tier`` (None: to every file tier) to the shared
    bucket (this process only)."""
    import migration.service as service
    import tier_store.moves as moves
    from tier_store.tiers import file as file_tier

    bucket = DeviceThrottle(throttle_file, rate)
    original = file_tier.FileSegmentWriter.write_chunk

    def write_chunk(self, pos, chunk):
        if getattr(self, "slow", False):
            bucket(chunk.size)
        return original(self, pos, chunk)

    file_tier.FileSegmentWriter.write_chunk = write_chunk
    for cls_name in ("create_segment", "open_segment"):
        orig = getattr(file_tier.FileTier, cls_name)

        def wrapped(self, *a, _orig=orig, **k):
            w = _orig(self, *a, **k)
            if w is not None and slow_tier in (None, self.number):
                w.slow = True
            return w

        setattr(file_tier.FileTier, cls_name, wrapped)
    # Moves copy through the service's throttle: make it the device.
    service.Throttle = lambda rate_cap: bucket
    _ = moves


# -- processes ------------------------------------------------------------------------------
def producer(args: argparse.Namespace) -> None:
    """Append ≈1 MB batches following the rate schedule; log (time, bytes) per append."""
    import numpy as np
    import pyarrow as pa

    from tier_store import Store
    install_throttle(args.throttle, args.hdd, args.slow_tier)
    t = Store.open(args.root).topic("bench")
    values = pa.py_buffer(np.random.default_rng(args.id).integers(
        0, 255, CHUNK_ROWS * 100, dtype=np.uint8).tobytes())
    schema = t.schema
    batch = pa.record_batch([pa.array(np.arange(CHUNK_ROWS, dtype=np.int64)),
                             pa.array(np.zeros(CHUNK_ROWS, dtype=np.int64)),
                             pa.FixedSizeBinaryArray.from_buffers(pa.binary(100), CHUNK_ROWS,
                                                                  [None, values])],
                            schema=schema)
    schedule = json.loads(args.schedule)  # [[seconds, MB/s per producer], ...]
    start = float(args.start)
    log = open(args.log, "w")  # noqa: SIM115 - written line by line while the run lasts
    ends = []
    at = start
    for dur, _ in schedule:
        at += dur
        ends.append(at)
    sent = 0.0
    phase_start = start
    for (_, rate), end in zip(schedule, ends, strict=True):
        sent = 0.0
        while time.time() < end:
            due = phase_start + sent / (rate * MB) if rate > 0 else end
            if time.time() < due:
                time.sleep(min(due - time.time(), 0.05))
                continue
            t.append(batch, partition=args.id % t.partitions)
            nbytes = batch.nbytes
            sent += nbytes
            log.write(f"{time.time():.4f} {nbytes}\n")
        phase_start = end
    log.close()


def consumer(args: argparse.Namespace) -> None:
    from tier_store import Store
    t = Store.open(args.root).topic("bench")
    pos = dict(t.latest_offsets())
    end = time.time() + args.seconds
    read = 0
    while time.time() < end:
        for p in range(t.partitions):
            for b in t.read(p, pos[p]):
                pos[p] += b.num_rows
                read += b.nbytes
        time.sleep(0.05)
    print(json.dumps({"read_bytes": read}))


def migrator(args: argparse.Namespace) -> None:
    from migration import MigrationService
    from tier_store import Store
    install_throttle(args.throttle, args.hdd, args.slow_tier)
    svc = MigrationService(Store.open(args.root))
    end = time.time() + args.seconds
    while time.time() < end:
        svc.run_once()
        time.sleep(0.2)


# -- scenarios ------------------------------------------------------------------------------
def store_conf(tiered: bool, fast: str, conf_extra: dict) -> tuple[dict, int]:
    """The store configuration of a run and the number of its throttled (HDD) tier."""
    conf = {"log.segment.bytes": "32m", "log.cleanup.grace.ms": GRACE_MS,
            "storage.migrate.interval.ms": 200, **conf_extra}
    if tiered:
        conf.update({"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
                     "storage.tiers.first.paths": fast, "log.pmem.pool.ratio": 1.0})
        return conf, 2
    conf.update({"storage.tiers.first.sizes": "64g"})
    return conf, 1


def prefill_topic(t, nbytes: int) -> None:
    """Append ``nbytes`` over the topic's partitions: Pafka's balanced state, tier 1 holding
    threshold × its capacity when a burst comes."""
    import numpy as np
    import pyarrow as pa
    rows = 32_000
    values = pa.py_buffer(bytes(rows * 100))
    batch = pa.record_batch([pa.array(np.arange(rows, dtype=np.int64)),
                             pa.array(np.zeros(rows, dtype=np.int64)),
                             pa.FixedSizeBinaryArray.from_buffers(pa.binary(100), rows,
                                                                  [None, values]
                                                                  ).cast(t.schema[2].type)],
                            schema=t.schema)
    done = 0
    while done < nbytes:
        t.append(batch, partition=(done // batch.nbytes) % t.partitions)
        done += batch.nbytes


def run_scenario(name: str, tiered: bool, schedule: list, producers: int, hdd: float,
                 conf_extra: dict, base: str, shm: str, prefill: int = 0) -> dict:
    root = os.path.join(base, f"{name}-{'tiered' if tiered else 'hdd'}-{uuid.uuid4().hex[:6]}")
    fast = os.path.join(shm, f"pafka-tier1-{uuid.uuid4().hex[:6]}")
    conf, slow = store_conf(tiered, fast, conf_extra)
    from tier_store import Store
    s = Store.open(root, conf)
    t = s.create_topic("bench", _schema(), partitions=producers)
    if prefill:
        prefill_topic(t, prefill)
    throttle = os.path.join(base, f"throttle-{uuid.uuid4().hex[:6]}")
    seconds = sum(d for d, _ in schedule)
    start = time.time() + 2.0
    common = ["--root", root, "--throttle", throttle, "--hdd", str(hdd),
              "--slow-tier", str(slow), "--seconds", str(seconds + 2)]
    procs, logs = [], []
    for i in range(producers):
        log = os.path.join(base, f"{name}-{i}.log")
        logs.append(log)
        procs.append(_spawn("producer", common + ["--id", str(i), "--start", str(start),
                                                  "--schedule", json.dumps(schedule),
                                                  "--log", log]))
    cons = _spawn("consumer", common)
    mig = _spawn("migrator", common) if tiered and conf.get(
        "storage.migrate.threshold", 0.5) != -1 else None
    for p in procs:
        p.wait()
    for p in (cons, mig):
        if p is not None:
            p.wait()
    samples = []
    for log in logs:
        with open(log) as f:
            samples += [tuple(map(float, line.split())) for line in f]
    usage = Store.open(root).tier_usage()
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(fast, ignore_errors=True)
    return {"samples": sorted(samples), "start": start, "seconds": seconds, "usage": usage}


def _schema():
    import pyarrow as pa
    return pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.binary(100))])


def _spawn(role: str, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), role, *argv], cwd=ROOT)


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


def plot(path: str, title: str, curves: dict[str, list[float]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4))
    for label, ys in curves.items():
        ax.plot(range(len(ys)), ys, label=label)
    ax.set_xlabel("seconds")
    ax.set_ylabel("ingest MB/s")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--hdd", type=float, default=80 * MB, help="simulated tier-2 bytes/s")
    ap.add_argument("--tier1", type=int, default=1024, help="tier-1 capacity, MiB")
    ap.add_argument("--producers", type=int, default=2)
    args = ap.parse_args()
    base = os.path.join(HERE, "data", f"tiering-{uuid.uuid4().hex[:6]}")
    os.makedirs(base)
    shm = "/dev/shm"
    c1 = args.tier1 * 1024 * 1024
    hdd = args.hdd
    threshold = 0.5
    # Burst: tier 1 prefilled to the threshold (Pafka's balanced state), a low rate, a burst
    # well above tier 2's bandwidth, the low rate for the interval Pafka's formula asks,
    # another burst, the low rate again.
    low, burst = 10.0, 150.0  # MB/s per producer
    b2 = hdd / MB
    burst_total = burst * args.producers
    reserved = (1 - threshold) * c1 / MB
    expected = reserved / (burst_total - b2)
    interval = reserved / b2
    burst_len = int(expected * 2) + 4
    gap = int(interval * 1.2) + 2
    schedule = [[4, low], [burst_len, burst], [gap, low], [burst_len, burst], [4, low]]
    conf = {"storage.tiers.first.sizes": str(c1), "storage.migrate.threshold": threshold}
    print(f"burst: expected {expected:.1f} s at {burst_total:.0f} MB/s, interval "
          f"{interval:.1f} s; schedule {schedule}", flush=True)
    prefill = int(threshold * c1)
    tiered = run_scenario("burst", True, schedule, args.producers, hdd, conf, base, shm, prefill)
    flat = run_scenario("burst", False, schedule, args.producers, hdd, conf, base, shm, prefill)
    st, sf = per_second(tiered), per_second(flat)
    step = 0.25
    qt = per_second(tiered, step)
    print("tiered per second:", [round(v) for v in st], flush=True)
    print("hdd-only per second:", [round(v) for v in sf], flush=True)
    plot(os.path.join(HERE, "tiering_burst.png"),
         "Burst: ingest over time (tier 2 throttled to an HDD's bandwidth)",
         {"tiered (pmem on /dev/shm + HDD)": st, "HDD only": sf})
    # The burst lasts while ingest stays well above what tier 2 alone takes.
    floor = 2 * b2
    first, in_burst_t = burst_window(qt, 4, burst_len, floor, step)
    second, _ = burst_window(qt, 4 + burst_len + gap, burst_len, floor, step)
    n = max(1, int(first))
    in_burst_f = sum(sf[4:4 + n]) / n
    # Pafka's formula with the rate the producers reached during the burst.
    predicted = reserved / max(in_burst_t - b2, 1e-9)
    print(f"burst windows {first}, {second}; tiered {in_burst_t:.0f} MB/s, hdd "
          f"{in_burst_f:.0f} MB/s; predicted {predicted:.2f} s", flush=True)
    # Steady: continuous production, migration off, retention at 1x / 1.5x / 2x tier 1.
    steady = {}
    for factor in (1.0, 1.5, 2.0):
        conf_s = {"storage.tiers.first.sizes": str(c1), "storage.migrate.threshold": -1,
                  "log.retention.bytes": str(int(factor * c1 / args.producers))}
        sched = [[30, 1000.0]]
        rt = run_scenario("steady", True, sched, args.producers, hdd, conf_s, base, shm)
        rf = run_scenario("steady", False, sched, args.producers, hdd, conf_s, base, shm)
        steady[factor] = (sum(per_second(rt)) / 30, sum(per_second(rf)) / 30)
        print(f"steady {factor}x: tiered {steady[factor][0]:.0f} MB/s, hdd "
              f"{steady[factor][1]:.0f} MB/s", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    report(args, predicted, interval, first, second, in_burst_t, in_burst_f, burst_total,
           steady, gap)


def report(args, predicted, interval, first, second, in_t, in_f, burst_total, steady,
           gap) -> None:
    from store_bench import update_section
    ratio = in_t / max(in_f, 1e-9)
    within = abs(first - predicted) <= 0.25 * predicted
    lines = [
        "## Tiering (`bench/tiering_bench.py`): Pafka's burst and steady scenarios", "",
        f"Command: `.venv/bin/python bench/tiering_bench.py` — tier 1: pmem tier on /dev/shm, "
        f"{args.tier1} MiB, threshold 0.5; tier 2: file tier on disk **throttled to "
        f"{args.hdd / MB:.0f} MB/s (a simulation of an HDD; this disk does ≈1.4 GB/s)**, the "
        "throttle shared by producers and the migration service. "
        f"{args.producers} producer processes (≈1 MB appends), a consumer process reading "
        "from the latest offsets, and the migration service in its own process (every "
        "200 ms), `log.cleanup.grace.ms`=300 so that pool files freed by moves return to "
        "the pool during a burst (with a grace period longer than the burst, the drain frees "
        "nothing in time and the burst lasts reserved ÷ burst rate). Peers: the same run "
        "against a store whose only tier is the throttled HDD.",
        "", "![burst](tiering_burst.png)", "",
        "After each burst, tiered ingest falls below tier-2-only until tier 1 is back at its "
        "threshold: the migration's copies and the producers' new segments share the one "
        "simulated HDD. A migration bandwidth cap (`storage.migrate.bytes.per.second`) trades "
        "that dip for a slower drain.", "",
        "| burst | value | expected |", "|---|---|---|",
        f"| offered burst rate | {burst_total:.0f} MB/s | — |",
        f"| ingest during the burst, tiered vs HDD only | {in_t:.0f} vs {in_f:.0f} MB/s = "
        f"{ratio:.1f}× | ≥ 3×: {'met' if ratio >= 3 else '**not met**'} |",
        f"| burst duration (0.25-s bins with ingest above twice the tier-2 bandwidth) | "
        f"{first:.2f} s (second burst {second:.2f} s) | (1 − threshold) × C1 ÷ (measured "
        f"burst rate − tier-2 bandwidth) = {predicted:.2f} s; within 25%: "
        f"{'met' if within else '**not met**'} |",
        f"| interval between bursts used | {gap} s | ≥ reserved "
        f"capacity ÷ tier-2 bandwidth = {interval:.1f} s (the second burst lasting as long as "
        "the first shows tier 1 had drained) |", "",
        "| steady production, migration off | tiered | HDD only | ratio | target |",
        "|---|---|---|---|---|",
    ]
    for f, (t, h) in steady.items():
        ok = "" if f != 1.5 else (" ≥ 1.5×: " + ("met" if t / h >= 1.5 else "**not met**"))
        lines.append(f"| log.retention.bytes = {f}× tier 1 | {t:.0f} MB/s | {h:.0f} MB/s | "
                     f"{t / h:.2f}× |{ok} |")
    update_section(args.out, "tiering-bench", "\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("producer", "consumer", "migrator"):
        role = sys.argv[1]
        ap = argparse.ArgumentParser()
        for opt in ("--root", "--throttle", "--schedule", "--log", "--start"):
            ap.add_argument(opt)
        ap.add_argument("--hdd", type=float)
        ap.add_argument("--slow-tier", type=int)
        ap.add_argument("--seconds", type=float)
        ap.add_argument("--id", type=int, default=0)
        a = ap.parse_args(sys.argv[2:])
        {"producer": producer, "consumer": consumer, "migrator": migrator}[role](a)
    else:
        main()
