"""Lake benchmark: a topic's segments demoted to a LAKE tier, beside the same moved to a disk tier.

    .venv/bin/python bench/lake_bench.py [--mb 512] [--no-spark] [--write-results] [--out DIR]

Two stores hold the same records (``--mb`` of Arrow chunks, 2 partitions, 64 MiB segments):
``FILE,LAKE`` and ``FILE,HDD``. Every sealed segment moves to tier 2 in each, one move per
segment, so each figure stands beside its peer from the same run:

* conversion: MB/s of chunk bytes demoted to the lake (read, checked, rewritten as Parquet,
  committed to Delta) beside the same segments copied to the disk tier;
* size: the table's bytes beside the segments' chunk bytes;
* read: ``Topic.read`` of every moved record, from the lake and from the disk tier (a fresh
  process each, median of 3), as MB/s of the segments' chunk bytes;
* Spark (unless ``--no-spark``): ``spark.read.parquet`` on the table's files beside
  ``spark.read.format("pafka")`` on the same offsets, each summing a column (median of 3).

The report is printed; ``--write-results`` rewrites this script's section of
``bench/RESULTS.md``, ``--out DIR`` writes it to ``DIR/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from bench_common import Output, add_output_args, dump_raw, int_range  # noqa: E402

from tier_store import Store, lake_summary  # noqa: E402

MARK = "lake-bench"
MB = 1_000_000
ROWS = 10_000  # per chunk: about 1.2 MB
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.string())])


def _batch(start: int, rng: np.random.Generator) -> pa.RecordBatch:
    keys = np.arange(start, start + ROWS, dtype=np.int64)
    words = np.array([f"page-{i:04d}/" + "x" * 90 for i in range(1000)])
    return pa.record_batch([pa.array(keys), pa.array(keys * 7),
                            pa.array(words[rng.integers(0, 1000, ROWS)])], schema=SCHEMA)


def _fill(root: str, types: str, mb: int) -> tuple[Store, list[str]]:
    store = Store.open(root, {"storage.tiers.types": types, "log.segment.bytes": "64m",
                              "storage.migrate.threshold": -1})
    topic = store.create_topic("t", SCHEMA, partitions=2)
    rng = np.random.default_rng(1)
    at, done = [0, 0], 0
    while done < mb * MB:
        p = (done // (ROWS * 100)) % 2
        b = _batch(at[p], rng)
        topic.append(b, partition=p)
        at[p] += ROWS
        done += b.nbytes
    sealed = [s.id for s in topic.segments() if s.sealed]
    return store, sealed


def _move_all(store: Store, ids: list[str]) -> tuple[float, int]:
    t0, moved = time.perf_counter(), 0
    for sid in ids:
        moved += store.move_segment(sid, 2, topic="t").bytes
    return time.perf_counter() - t0, moved


_READ = """
import sys, time
from tier_store import Store
t = Store.open(sys.argv[1]).topic("t")
ranges = [(s.partition, s.base_offset, s.end_offset) for s in t.segments() if s.tier == 2]
t0 = time.perf_counter()
n = sum(b.num_rows for p, a, e in ranges for b in t.read(p, a, e))
print(time.perf_counter() - t0, n)
"""


def _read(root: str) -> tuple[float, int]:
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", _READ, root], capture_output=True,
                             text=True, check=True, cwd=ROOT).stdout.split()
        runs.append((float(out[0]), int(out[1])))
    return statistics.median(r[0] for r in runs), runs[0][1]


def _spark(lake_root: str) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

    import pafka_source
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .getOrCreate())
    for k, v in pafka_source.SPARK_CONF.items():
        spark.conf.set(k, v)
    store = Store.open(lake_root)
    t = store.topic("t")
    files = DeltaTable(lake_summary(t)["table"]).file_uris()
    ends = {s.partition: s.end_offset for s in t.segments() if s.tier == 2}
    import json
    ending = json.dumps({"t": {str(p): e for p, e in ends.items()}})

    def timed(df_of) -> float:
        out = []
        for _ in range(3):
            t0 = time.perf_counter()
            df_of().selectExpr("sum(key)").collect()
            out.append(time.perf_counter() - t0)
        return statistics.median(out)
    parquet = timed(lambda: spark.read.parquet(*files))
    pafka = timed(lambda: spark.read.format("pafka").option("topic", "t")
                  .option("endingOffsets", ending).load(lake_root))
    spark.stop()
    return {"parquet_s": parquet, "pafka_s": pafka, "rows": sum(ends.values())}


def report(args: argparse.Namespace, r: dict) -> str:
    c, s, rd = r["convert"], r["size"], r["read"]
    lines = [
        "## Lake tier (`bench/lake_bench.py`)", "",
        f"Command: `.venv/bin/python bench/lake_bench.py --mb {args.mb}`. Two stores of the "
        f"same records: {r['records']:,} of them in {c['segments']} sealed segments of 64 MiB "
        "(2 partitions) move, to a LAKE tier in one store, to a disk tier in the other. "
        "The values repeat 1,000 strings of about 100 bytes, so they compress well.",
        "", "| figure | lake | disk tier (peer) | ratio |", "|---|---|---|---|",
        f"| move, MB/s of chunk bytes | {c['lake_mbs']:.1f} | {c['disk_mbs']:.1f} | "
        f"{c['lake_mbs'] / c['disk_mbs']:.2f}× |",
        f"| bytes stored | {s['table']:,} (table) | {s['segments']:,} (chunks) | "
        f"{s['table'] / s['segments']:.2f}× |",
        f"| `Topic.read`, MB/s of chunk bytes | {rd['lake_mbs']:.1f} | {rd['disk_mbs']:.1f} | "
        f"{rd['lake_mbs'] / rd['disk_mbs']:.2f}× |"]
    if "spark" in r:
        sp = r["spark"]
        lines.append(f"| Spark, sum of a column over {sp['rows']:,} rows | "
                     f"{sp['parquet_s']:.2f} s (`spark.read.parquet` on the table's files) | "
                     f"{sp['pafka_s']:.2f} s (`format(\"pafka\")`, same offsets) | "
                     f"{sp['pafka_s'] / sp['parquet_s']:.2f}× |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int_range(64, 100_000), default=512,
                    help="MB of records per store (default 512)")
    ap.add_argument("--no-spark", action="store_true", help="leave out the Spark figures")
    add_output_args(ap)
    args = ap.parse_args()
    output = Output(args)
    base = tempfile.mkdtemp(prefix="pafka-lake-", dir=os.path.join(HERE, "data")
                            if os.path.isdir(os.path.join(HERE, "data")) else None)
    r: dict = {}
    try:
        lake, ids = _fill(os.path.join(base, "lake"), "FILE,LAKE", args.mb)
        disk, ids2 = _fill(os.path.join(base, "disk"), "FILE,HDD", args.mb)
        assert ids == ids2, (ids, ids2)
        lake_s, lake_bytes = _move_all(lake, ids)
        disk_s, disk_bytes = _move_all(disk, ids2)
        r["convert"] = {"segments": len(ids), "lake_mbs": lake_bytes / MB / lake_s,
                        "disk_mbs": disk_bytes / MB / disk_s}
        r["size"] = {"table": lake_summary(lake.topic("t"))["bytes"], "segments": lake_bytes}
        lake_read, n1 = _read(os.path.join(base, "lake"))
        disk_read, n2 = _read(os.path.join(base, "disk"))
        assert n1 == n2, (n1, n2)
        r["read"] = {"lake_mbs": lake_bytes / MB / lake_read,
                     "disk_mbs": disk_bytes / MB / disk_read}
        r["records"] = n1
        print(r, flush=True)
        if not args.no_spark:
            r["spark"] = _spark(os.path.join(base, "lake"))
            print(r["spark"], flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    dump_raw(r)
    output.report(MARK, report(args, r))


if __name__ == "__main__":
    main()
