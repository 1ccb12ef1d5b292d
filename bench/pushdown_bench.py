"""Pushdown benchmark: queries that read less, against the full scan and against Parquet.

    .venv/bin/python bench/pushdown_bench.py [--gb 5] [--partitions 64] [--users 100000]
        [--repeat 3] [--sink-mb 512] [--write-results] [--out DIR]

One topic of ``--gb`` GB of Arrow chunks (10 columns, keyed by ``user``, event times over one
day in arrival order), and the same rows as Parquet: one file per partition, one row group
per pafka chunk, so both can skip the same units. Through one ``local[2]`` SparkSession,
each query runs on pafka without pushdown (a full scan), on pafka with it, and on the
Parquet files (``spark.read.parquet``, which prunes row groups and columns itself):

* ``WHERE user = x`` and ``WHERE ts > <the last hour>``: count and a hash of every column;
* two of the ten columns: pafka's ``columns`` option, Parquet's column pruning.

Every answer is checked against the full scan's. Then the sink: the same DataFrame written
by ``df.write.format("pafka")`` to topics of each ``log.chunk.statistics`` setting, in
turns, as ratios of medians to ``none``; and the store's write path alone, in CPU time.

The report is printed; ``--write-results`` rewrites this script's section of
``bench/RESULTS.md``, ``--out DIR`` writes it to ``DIR/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from bench_common import Output, add_output_args, dump_raw, fail, int_range  # noqa: E402

from tier_store import Store, chunk_filter, chunk_statistics, partition_of  # noqa: E402

MARK = "pushdown-bench"
GB = 1_000_000_000
DAY_MS = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
ROWS = 1_000_000  # per append
STATS = ("none", "numeric", "all")  # log.chunk.statistics
SCHEMA = pa.schema([("user", pa.int64()), ("ts", pa.timestamp("ms", tz="UTC")),
                    ("event", pa.string()), ("page", pa.string()), ("amount", pa.float64()),
                    ("qty", pa.int32()), ("country", pa.string()), ("device", pa.int16()),
                    ("session", pa.int64()), ("ok", pa.bool_())])
EVENTS = pa.array(["view", "click", "add_to_cart", "purchase", "search", "scroll", "share",
                   "login"])
PAGES = pa.array([f"/catalog/item-{i:05d}/details" for i in range(5000)])
COUNTRIES = pa.array(["FR", "DE", "US", "GB", "JP", "BR", "IN", "IT", "ES", "NL"])


def _strings(dictionary: pa.Array, idx: np.ndarray) -> pa.Array:
    return pa.DictionaryArray.from_arrays(pa.array(idx.astype(np.int32)), dictionary) \
        .cast(pa.string())


def _batch(i: int, n_batches: int, users: int, rng: np.random.Generator) -> pa.Table:
    """Rows of append ``i``: event times in its slice of the day, in arrival order."""
    lo = T0 + DAY_MS * i // n_batches
    hi = T0 + DAY_MS * (i + 1) // n_batches
    ts = np.sort(rng.integers(lo, hi, ROWS))
    return pa.table([
        pa.array(rng.integers(0, users, ROWS)), pa.array(ts, pa.timestamp("ms", tz="UTC")),
        _strings(EVENTS, rng.integers(0, len(EVENTS), ROWS)),
        _strings(PAGES, rng.integers(0, len(PAGES), ROWS)),
        pa.array(rng.gamma(2.0, 20.0, ROWS)), pa.array(rng.integers(1, 10, ROWS, np.int32)),
        _strings(COUNTRIES, rng.integers(0, len(COUNTRIES), ROWS)),
        pa.array(rng.integers(0, 40, ROWS, np.int16)),
        pa.array(rng.integers(0, 1 << 40, ROWS)), pa.array(rng.random(ROWS) < 0.97)],
        schema=SCHEMA)


def fill(base: str, gb: float, partitions: int, users: int) -> dict:
    """The topic and its Parquet twin; returns what was written."""
    store = Store.open(os.path.join(base, "store"))
    topic = store.create_topic("events", SCHEMA, partitions=partitions)
    pdir = os.path.join(base, "parquet")
    os.makedirs(pdir)
    writers = [pq.ParquetWriter(os.path.join(pdir, f"part-{p:03d}.parquet"), SCHEMA)
               for p in range(partitions)]
    rng = np.random.default_rng(42)
    per = _batch(0, 1, users, np.random.default_rng(0)).nbytes
    n = max(1, round(gb * GB / per))
    t0 = time.perf_counter()
    write_s = 0.0
    for i in range(n):
        table = _batch(i, n, users, rng)
        w0 = time.perf_counter()
        topic.append(table, key="user")
        write_s += time.perf_counter() - w0
        # The same rows per partition, in the same order: one row group per pafka chunk.
        parts = partition_of(table.column("user"), partitions)
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=partitions)
        ordered, at = table.take(pa.array(order)), 0
        for p, k in enumerate(counts):
            if k:
                writers[p].write_table(ordered.slice(at, int(k)), row_group_size=int(k))
                at += int(k)
        print(f"fill: {i + 1}/{n} appends", end="\r", file=sys.stderr, flush=True)
    for w in writers:
        w.close()
    segs = topic.segments()
    return {"appends": n, "rows": n * ROWS, "chunk_bytes": sum(s.bytes for s in segs),
            "chunks": sum(s.chunks for s in segs), "segments": len(segs),
            "parquet_bytes": sum(os.path.getsize(os.path.join(pdir, f))
                                 for f in os.listdir(pdir)),
            "fill_s": time.perf_counter() - t0, "append_s": write_s}


def planned(root: str, where: list) -> dict:
    """Chunks and bytes a pushed-down read plans, of the topic's."""
    t = Store.open(root).topic("events")
    keep = chunk_filter(t.schema, where)
    ranges = [(p, 0, None) for p in range(t.partitions)]
    every = [c for plan in t.plan_reads(ranges) for c in plan.chunks]
    kept = [c for plan in t.plan_reads(ranges, keep) for c in plan.chunks]
    return {"chunks": len(kept), "of": len(every), "bytes": sum(c.length for c in kept),
            "of_bytes": sum(c.length for c in every)}


def queries(spark, base: str, users: int, repeat: int) -> list[dict]:
    root, pdir = os.path.join(base, "store"), os.path.join(base, "parquet")
    full = spark.read.format("pafka").option("topic", "events").load(root)
    pushed = spark.read.format("pafka").option("topic", "events") \
        .option("pushFilters", "true").load(root)
    parquet = spark.read.parquet(pdir)
    x = users // 3
    hour = T0 + DAY_MS - 3_600_000  # the day's last hour
    cut = f"timestamp_millis({hour})"
    every = "count(*) as n", "bit_xor(xxhash64(*)) as h"
    two = "count(*) as n", "bit_xor(xxhash64(user, amount)) as h"
    cases = [
        ("`WHERE user = x`", lambda df: df.where(f"user = {x}").selectExpr(*every),
         [("user", "=", x)], full, pushed),
        ("`WHERE ts > <the last hour>`", lambda df: df.where(f"ts > {cut}").selectExpr(*every),
         [("ts", ">", datetime.datetime.fromtimestamp(hour / 1000, datetime.UTC))],
         full, pushed),
        ("2 of 10 columns (`user`, `amount`)", lambda df: df.selectExpr(*two), None, full,
         spark.read.format("pafka").option("topic", "events").option("columns", "user,amount")
         .load(root)),
    ]
    out = []
    for name, q, where, plain, fast in cases:
        runs: dict[str, list[float]] = {"full": [], "pushed": [], "parquet": []}
        answers = {}
        for i in range(repeat + 1):  # the three back to back, each round; 0 warms up
            for label, df in (("full", plain), ("pushed", fast), ("parquet", parquet)):
                t0 = time.perf_counter()
                answers[label] = tuple(q(df).collect()[0])
                if i:
                    runs[label].append(time.perf_counter() - t0)
        if len(set(answers.values())) != 1:
            raise fail(f"{name}: the answers differ: {answers}")
        row = {"query": name, "rows": answers["full"][0],
               **{k: statistics.median(v) for k, v in runs.items()},
               "runs": runs}
        if where is not None:
            row["planned"] = planned(root, where)
        out.append(row)
        print(row, file=sys.stderr, flush=True)
    return out


def sink(spark, base: str, mb: int, repeat: int) -> dict:
    """The pafka sink under each statistics setting, on the same cached rows."""
    pdir = os.path.join(base, "parquet")
    files = sorted(os.listdir(pdir))
    df = spark.read.parquet(*[os.path.join(pdir, f) for f in files])
    per_row = 100  # bytes, about
    df = df.limit(mb * 1_000_000 // per_row).repartition(2).cache()
    rows = df.count()
    root = os.path.join(base, "sink")
    store = Store.open(root)
    # Spark hands timestamps over in microseconds.
    schema = SCHEMA.set(1, pa.field("ts", pa.timestamp("us", tz="UTC")))
    for name in STATS:
        store.create_topic(name, schema, partitions=8, config={"log.chunk.statistics": name})
    runs: dict[str, list[float]] = {name: [] for name in STATS}
    for i in range(repeat + 1):  # the first round warms up; the order turns each round
        for name in STATS[i % 3:] + STATS[:i % 3]:
            t0 = time.perf_counter()
            df.write.format("pafka").option("topic", name).option("key", "user") \
                .mode("append").save(root)
            if i:
                runs[name].append(time.perf_counter() - t0)
    df.unpersist()
    return {"rows": rows, **{k: statistics.median(v) for k, v in runs.items()}, "runs": runs}


def write_cost() -> dict:
    """CPU time of the store's write path (``write_chunks`` and ``commit`` of 250,000 rows
    routed by ``user`` over 8 partitions) per statistics setting, and of computing one
    chunk's statistics (15,600 rows)."""
    import tempfile as tf
    t = _batch(0, 1, 100_000, np.random.default_rng(1)).slice(0, 250_000)
    with tf.TemporaryDirectory(prefix="pafka-pushdown-w-") as d:
        store = Store.open(d)
        topics = {n: store.create_topic(n, SCHEMA, partitions=8,
                                        config={"log.chunk.statistics": n}) for n in STATS}
        runs: dict[str, list[float]] = {n: [] for n in STATS}
        for i in range(12):  # two warm up; the order turns each round
            for n in STATS[i % 3:] + STATS[:i % 3]:
                c0 = time.process_time()
                topics[n].commit(topics[n].write_chunks(t, key="user"))
                if i >= 2:
                    runs[n].append(time.process_time() - c0)
        store.close()
    chunk = t.slice(0, 15_600).to_batches()
    us = {}
    for n, strings in (("numeric", False), ("all", True)):
        chunk_statistics(chunk, SCHEMA, strings=strings)
        c0 = time.process_time()
        for _ in range(200):
            chunk_statistics(chunk, SCHEMA, strings=strings)
        us[n] = (time.process_time() - c0) / 200 * 1e6
    return {"write_ms": {n: statistics.median(v) * 1000 for n, v in runs.items()},
            "chunk_us": us, "chunk_mb": t.slice(0, 15_600).nbytes / 1e6}


def report(args: argparse.Namespace, r: dict) -> str:
    f = r["fill"]
    lines = [
        "## Pushdown and column selection (`bench/pushdown_bench.py`)", "",
        f"Command: `.venv/bin/python bench/pushdown_bench.py --gb {args.gb:g} --partitions "
        f"{args.partitions} --users {args.users} --repeat {args.repeat} --sink-mb "
        f"{args.sink_mb}` — {r['machine']}. A topic of {f['rows']:,} rows "
        f"({f['chunk_bytes'] / GB:.2f} GB of chunks: {f['chunks']:,} chunks in "
        f"{f['segments']} segments, {args.partitions} partitions, 10 columns, keyed by "
        f"`user` of {args.users:,}, event times `ts` over one day in arrival order). "
        f"The Parquet twin holds the same rows in the same order: a file per partition, "
        f"a row group per pafka chunk, snappy ({f['parquet_bytes'] / GB:.2f} GB). "
        "One `local[2]` SparkSession with `pafka_source.SPARK_CONF`; the page cache holds "
        "both. Each query computes a count and a hash of the columns it reads, checked "
        f"equal on all three; median of {args.repeat} rounds after a warm-up round, the three "
        "back to back.", "",
        "| query | rows | pafka full scan | pafka, pushed down | Parquet | "
        "pushed ÷ full | pushed ÷ Parquet | chunks planned |",
        "|---|---|---|---|---|---|---|---|"]
    for q in r["queries"]:
        pl = q.get("planned")
        planned_text = f"{pl['chunks']:,} of {pl['of']:,} ({pl['bytes'] / 1e6:,.0f} of " \
            f"{pl['of_bytes'] / 1e6:,.0f} MB)" if pl else "all (2 columns' buffers)"
        lines.append(
            f"| {q['query']} | {q['rows']:,} | {q['full']:.2f} s | {q['pushed']:.2f} s | "
            f"{q['parquet']:.2f} s | {q['pushed'] / q['full']:.3f}× | "
            f"{q['pushed'] / q['parquet']:.2f}× | {planned_text} |")
    s, w = r["sink"], r["write"]
    none = s["none"]
    lines += [
        "",
        f"Writing the statistics (`log.chunk.statistics`): `df.write.format(\"pafka\")` of "
        f"{s['rows']:,} cached rows (key `user`, 8 partitions) to three topics, median of "
        f"{args.repeat} rounds after a warm-up, the order turning each round: "
        f"`none` {none:.2f} s, **`numeric` (the default) {s['numeric']:.2f} s, "
        f"{s['numeric'] / none:.3f}×**, `all` {s['all']:.2f} s, {s['all'] / none:.3f}× "
        "(target ≤ 1.03×). The store's write path alone (`write_chunks` and `commit` of "
        "250,000 rows routed by `user` over 8 partitions, CPU time, median of 10): "
        f"`none` {w['write_ms']['none']:.1f} ms, `numeric` {w['write_ms']['numeric']:.1f} ms "
        f"({w['write_ms']['numeric'] / w['write_ms']['none']:.2f}×), `all` "
        f"{w['write_ms']['all']:.1f} ms ({w['write_ms']['all'] / w['write_ms']['none']:.2f}×). "
        f"One chunk's statistics (15,600 rows, {w['chunk_mb']:.1f} MB): "
        f"{w['chunk_us']['numeric']:.0f} µs for its 6 numeric and time columns, "
        f"{w['chunk_us']['all']:.0f} µs with its 3 string columns.",
        "",
        "Runs (s): " + "; ".join(
            f"{q['query']}: full {q['runs']['full']}, pushed {q['runs']['pushed']}, "
            f"Parquet {q['runs']['parquet']}" for q in r["queries"])
        + "; sink " + ", ".join(f"`{n}` {s['runs'][n]}" for n in STATS) + "."]
    return "\n".join(lines) + "\n"


def _round(x):
    if isinstance(x, float):
        return round(x, 2)
    if isinstance(x, list):
        return [_round(v) for v in x]
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=5.0, help="GB of chunks (default 5)")
    ap.add_argument("--partitions", type=int_range(1, 1024), default=64,
                    help="partitions of the topic (default 64)")
    ap.add_argument("--users", type=int_range(10), default=100_000,
                    help="distinct user ids (default 100000)")
    ap.add_argument("--repeat", type=int_range(1, 20), default=3,
                    help="timed rounds per query (default 3)")
    ap.add_argument("--sink-mb", type=int_range(1, 100_000), default=512,
                    help="MB the sink writes per run (default 512)")
    add_output_args(ap)
    args = ap.parse_args()
    if not 0 < args.gb <= 1000:
        ap.error(f"--gb: {args.gb} is out of range: allowed 0 < value ≤ 1000")
    output = Output(args)
    base = tempfile.mkdtemp(prefix="pafka-pushdown-")
    r: dict = {"machine": f"{platform.processor() or platform.machine()}, "
                          f"{os.cpu_count()} cores, Python {platform.python_version()}, "
                          f"pyarrow {pa.__version__}"}
    try:
        r["fill"] = fill(base, args.gb, args.partitions, args.users)
        print(r["fill"], file=sys.stderr, flush=True)
        from pyspark.sql import SparkSession

        import pafka_source
        spark = (SparkSession.builder.master("local[2]").appName("pafka-pushdown-bench")
                 .config(map=pafka_source.SPARK_CONF).config("spark.ui.enabled", "false")
                 .config("spark.driver.memory", "4g").getOrCreate())
        import pyspark
        r["machine"] += f", PySpark {pyspark.__version__}"
        r["queries"] = queries(spark, base, args.users, args.repeat)
        r["sink"] = sink(spark, base, args.sink_mb, args.repeat)
        r["write"] = write_cost()
        spark.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    r = _round(r)
    dump_raw(r)
    output.report(MARK, report(args, r))


if __name__ == "__main__":
    main()
