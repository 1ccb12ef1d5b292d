"""``pafka perf`` beside the Python API paths of ``bench/store_bench.py``, at the same sizes.

    .venv/bin/python bench/perf_cli_bench.py [--records 2000000] [--batch-records 10000]
        [--processes 1 2] [--write-results] [--out DIR]

For each tier (the file tier on disk under bench/data, the pmem tier on /dev/shm when there
is one), in one run: store_bench's append and verified read of ``--records`` 116-byte records
(``bench_store``, one partition), then the installed ``pafka perf produce`` and ``consume``
commands on a fresh store of the same configuration, with 104-byte values (116 bytes a record
in Arrow) in 1, 2, ... processes sharing the records. Each command runs as a user runs it,
with ``--json``.

The report is printed; ``--write-results`` rewrites this script's section of
``bench/RESULTS.md``, ``--out DIR`` writes it to ``DIR/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import store_bench  # noqa: E402
from bench_common import Output, add_output_args, dump_raw, fail, int_range, positive  # noqa: E402

from tier_store import Store  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PAFKA = os.path.join(os.path.dirname(sys.executable), "pafka")
VALUE_BYTES = store_bench.RECORD_BYTES - 12  # an 8-byte key and a 4-byte value offset


def pafka_perf(mode: str, root: str, records: int, batch: int, processes: int) -> dict:
    """One ``pafka perf`` run's JSON report; a failed run stops the benchmark."""
    cmd = [PAFKA, "perf", mode, root, "perf", "--records", str(records), "--batch-records",
           str(batch), "--processes", str(processes), "--json"]
    if mode == "produce":
        cmd += ["--record-size", str(VALUE_BYTES), "--create"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise fail(f"{' '.join(cmd[1:3])} exited {r.returncode}: {r.stderr.strip()}")
    report = json.loads(r.stdout)
    positive(report["total"]["records_per_s"], f"pafka perf {mode} records/s")
    return report


def bench_tier(kind: str, n: int, batch: int, processes: list[int], base: str) -> dict:
    """store_bench's figures, then pafka perf's, on stores of tier ``kind``."""
    api = store_bench.bench_store(kind, store_bench.batches(n, batch), base)
    out = {"api_write": n / positive(api["write"], f"{kind} append time"),
           "api_read": n / positive(api["read"], f"{kind} read time"), "perf": {}}
    for k in processes:
        root = store_bench.fresh_dir(base)
        fast = store_bench.fresh_dir("/dev/shm") if kind == "pmem" else ""
        try:
            Store.open(root, store_bench.store_conf(kind, fast, n * store_bench.RECORD_BYTES)
                       ).close()
            produce = pafka_perf("produce", root, n, batch, k)  # n in all, as Kafka's
            consume = pafka_perf("consume", root, n, batch, k)
            out["perf"][k] = {"produce": produce["total"], "consume": consume["total"]}
            print(f"  {kind}, {k} process(es): produce {produce['total']['records_per_s']:,.0f}"
                  f" rec/s, consume {consume['total']['records_per_s']:,.0f} rec/s", flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            if fast:
                shutil.rmtree(fast, ignore_errors=True)
    return out


def write_report(args: argparse.Namespace, res: dict) -> str:
    n, batch = args.records, args.batch_records
    mb = n * store_bench.RECORD_BYTES / 1e6

    def rate(x: float) -> str:
        return f"{x / 1e6:,.2f} M rec/s ({x * store_bench.RECORD_BYTES / 1e6:,.0f} MB/s)"

    def lat(t: dict) -> str:
        ms = t["latency_ms"]
        return f"{ms['p50']:.2f} / {ms['p99']:.2f} / {ms['max']:.2f}"

    procs = " ".join(map(str, args.processes))
    lines = [
        "## `pafka perf` (`bench/perf_cli_bench.py`)", "",
        f"Command: `.venv/bin/python bench/perf_cli_bench.py --records {n} --batch-records "
        f"{batch} --processes {procs}` — {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. {n:,} records of 116 bytes ({mb:,.0f} MB) per row, "
        f"{batch:,} per append and per read. The Python API columns are "
        "`store_bench.bench_store` in the same run (one partition, int64 key, int64 timestamp, "
        "fixed_size_binary(100) value). The `pafka perf` columns run the installed command. "
        f"Its records hold an int64 key and a {VALUE_BYTES}-byte binary value: 116 bytes in "
        "Arrow. K processes share the records, one partition each. Latency is per append "
        "(write and commit) or per read (plan, map, verify checksums), in ms.", "",
        "| tier | K | Python API append | `pafka perf produce` | append p50 / p99 / max | "
        "Python API read | `pafka perf consume` | read p50 / p99 / max |",
        "|---|---|---|---|---|---|---|---|"]
    for kind, r in res.items():
        for k, p in r["perf"].items():
            lines.append(f"| {kind} | {k} | {rate(r['api_write'])} | "
                         f"{rate(p['produce']['records_per_s'])} | {lat(p['produce'])} | "
                         f"{rate(r['api_read'])} | {rate(p['consume']['records_per_s'])} | "
                         f"{lat(p['consume'])} |")
    lines += ["", "The command's figures include no process start-up (all processes open the "
              "store, then start together), and reads count Arrow bytes. The Python API read "
              "is one `read()` of the whole partition; `pafka perf consume` calls `read()` "
              "once per batch, so its figure includes the planning of each. This VM has 2 "
              "cores and one disk, which K=2 processes share. "
              "Absolute figures move by 2–5× between runs, as the store-bench section says."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int_range(1, 10**9), default=2_000_000,
                    help="records per row, shared by the processes (1 or more; default "
                         "2,000,000)")
    ap.add_argument("--batch-records", type=int_range(1, 10**8), default=10_000,
                    help="records per append and per read (1 or more; default 10,000, as "
                         "store_bench's producer row)")
    ap.add_argument("--processes", type=int_range(1, 64), nargs="+", default=[1, 2],
                    metavar="K", help="process counts to run (each 1 to 64; default 1 2)")
    add_output_args(ap)
    args = ap.parse_args()
    if not os.path.exists(PAFKA):
        ap.error(f"--records: the pafka command is not installed beside {sys.executable}")
    output = Output(args)
    # A directory of its own: other benches may be using bench/data meanwhile.
    base = os.path.join(HERE, "data", f"perf-cli-{uuid.uuid4().hex[:8]}")
    os.makedirs(base, exist_ok=True)
    kinds = ["file"] + (["pmem"] if os.path.isdir("/dev/shm") else [])
    res = {}
    try:
        for kind in kinds:
            print(f"{kind} tier: {args.records:,} records", flush=True)
            res[kind] = bench_tier(kind, args.records, args.batch_records, args.processes, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    dump_raw(res)
    output.report("perf-cli", write_report(args, res))


if __name__ == "__main__":
    main()
