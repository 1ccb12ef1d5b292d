"""Spark benchmark: the pafka sink and sources against Parquet, and end-to-end latency.

    .venv/bin/python bench/spark_bench.py [--rows 10000000] [--out bench/RESULTS.md]

One local[2] SparkSession, one run. Rows are (key bigint, timestamp bigint, value binary):
the value is 100 pseudo-random bytes per row (a slice of two SHA-512 digests of the key),
generated in Spark from ``spark.range`` and cached in memory, so every writer reads the same
rows and none pays for generating them. Measured, each the median of ``--repeat`` runs with
the peers interleaved:

* sink: ``df.write.format("pafka")`` against ``df.write.parquet`` (snappy);
* batch source: ``spark.read.format("pafka")`` → ``noop`` against ``spark.read.parquet`` →
  ``noop``, and against a storage-free Python source yielding pre-built 64k-row Arrow
  batches of the same schema (the ceiling of any Python source);
* streaming source with Trigger.AvailableNow → ``noop``: pafka against Spark's file stream
  source over the Parquet files, and against the storage-free source's streaming reader;
* latency: a producer thread appends small batches with ``Topic.append`` at a fixed rate; a
  pafka streaming query with a 0-second processing-time trigger collects, in
  ``foreachBatch``, one row per append; latency = the time the collect returned minus the
  row's ``_timestamp`` (the commit time the store assigned, ms precision).

The section between the ``spark-bench`` markers of RESULTS.md is rewritten; the rest of the
file is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyspark  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from tier_store import Store  # noqa: E402

TS0 = 1_700_000_000_000
CEILING_BATCH = 65_536
TOPIC = "bench"
TOPIC_PARTITIONS = 4
STORE_CONF = {"storage.tiers.first.sizes": "256g"}  # file tier on disk; room for every run
MARK = "spark-bench"
TARGETS = {"sink": 1.1, "source": 0.95, "p50": 0.5}


# -- the ceiling: a Python source with no storage at all ----------------------------------------
class CeilingPartition(InputPartition):
    def __init__(self, rows: int):
        super().__init__(rows)
        self.rows = rows


def _split(rows: int, parts: int) -> list[CeilingPartition]:
    return [CeilingPartition(rows // parts + (1 if i < rows % parts else 0))
            for i in range(parts)]


def _ceiling_batches(schema: StructType, rows: int) -> Iterator[pa.RecordBatch]:
    """``rows`` rows as 64k-row batches built once in memory before the first yield."""
    from pyspark.sql.pandas.types import to_arrow_schema
    target = to_arrow_schema(schema, timezone="UTC")
    n = CEILING_BATCH
    keys = np.arange(n, dtype=np.int64)
    values = np.random.default_rng(7).integers(0, 256, n * 100, dtype=np.uint8)
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 100).tobytes())
    value = pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(values)])
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array(keys + TS0), value],
                                       schema=target)
    left = rows
    while left > 0:
        yield batch if left >= n else batch.slice(0, left)
        left -= n


class CeilingReader(DataSourceReader):
    def __init__(self, schema: StructType, rows: int, parts: int):
        self.schema, self.rows, self.parts = schema, rows, parts

    def partitions(self) -> list[CeilingPartition]:
        return _split(self.rows, self.parts)

    def read(self, partition: CeilingPartition) -> Iterator[pa.RecordBatch]:
        return _ceiling_batches(self.schema, partition.rows)


class CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, schema: StructType, rows: int, parts: int):
        self.schema, self.rows, self.parts = schema, rows, parts

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit) -> dict:  # noqa: ANN001
        return {"rows": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[CeilingPartition]:
        return _split(end["rows"] - start["rows"], self.parts)

    def read(self, partition: CeilingPartition) -> Iterator[pa.RecordBatch]:
        return _ceiling_batches(self.schema, partition.rows)

    def commit(self, end: dict) -> None:
        pass


class CeilingSource(DataSource):
    """``format("bench_ceiling")``: options rows, parts, schema (Spark's JSON)."""

    @classmethod
    def name(cls) -> str:
        return "bench_ceiling"

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def _args(self, schema: StructType) -> tuple[StructType, int, int]:
        return schema, int(self.options["rows"]), int(self.options["parts"])

    def reader(self, schema: StructType) -> CeilingReader:
        return CeilingReader(*self._args(schema))

    def streamReader(self, schema: StructType) -> CeilingStreamReader:
        return CeilingStreamReader(*self._args(schema))


# -- helpers ------------------------------------------------------------------------------------
def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_interleaved(fns: dict[str, Callable[[int], float]], repeat: int
                       ) -> dict[str, list[float]]:
    """Run each function ``repeat`` times, alternating between them; all timings."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(repeat):
        for k, fn in fns.items():
            out[k].append(fn(i))
            print(f"    {k} run {i + 1}: {out[k][-1]:.2f} s", flush=True)
    return out


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run_stream(df: DataFrame, ckpt: str, rows: int) -> float:
    """Start ``df`` → noop with AvailableNow; wall time from start() to termination."""
    t0 = time.perf_counter()
    q = (df.writeStream.format("noop").trigger(availableNow=True)
         .option("checkpointLocation", ckpt).start())
    q.awaitTermination()
    dt = time.perf_counter() - t0
    got = sum(p["numInputRows"] for p in q.recentProgress)
    if got != rows:
        raise RuntimeError(f"streaming query read {got} rows, expected {rows}")
    return dt


# -- the benchmark --------------------------------------------------------------------------------
def make_session() -> SparkSession:
    spark = (SparkSession.builder.master("local[2]").appName("pafka-spark-bench")
             .config("spark.driver.memory", "6g")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CeilingSource)
    return spark


def generate(spark: SparkSession, rows: int) -> DataFrame:
    df = spark.range(0, rows).selectExpr(
        "id AS key", f"{TS0} + id AS timestamp",
        "substring(unhex(concat(sha2(cast(id AS string), 512), "
        "sha2(cast(id + 7 AS string), 512))), 1, 100) AS value")
    return df.cache()


def bench_sink(src: DataFrame, data: str, repeat: int, rows: int) -> dict:
    def pafka(i: int) -> float:
        root = os.path.join(data, f"store-{i}")
        Store.open(root, STORE_CONF).close()
        dt = timed(lambda: src.write.format("pafka").option("topic", TOPIC)
                   .option("partitions", TOPIC_PARTITIONS).mode("append").save(root))
        got = sum(Store.open(root).topic(TOPIC).latest_offsets().values())
        if got != rows:
            raise RuntimeError(f"pafka sink wrote {got} rows, expected {rows}")
        return dt

    def parquet(i: int) -> float:
        return timed(lambda: src.write.parquet(os.path.join(data, f"parquet-{i}")))

    times = median_interleaved({"pafka sink": pafka, "parquet sink": parquet}, repeat)
    sizes = {"pafka": dir_bytes(os.path.join(data, "store-0")),
             "parquet": dir_bytes(os.path.join(data, "parquet-0"))}
    for i in range(1, repeat):  # keep run 0 for the reads
        shutil.rmtree(os.path.join(data, f"store-{i}"), ignore_errors=True)
        shutil.rmtree(os.path.join(data, f"parquet-{i}"), ignore_errors=True)
    return {"times": times, "bytes": sizes}


def bench_sources(spark: SparkSession, data: str, repeat: int, rows: int) -> dict:
    root = os.path.join(data, "store-0")
    pq = os.path.join(data, "parquet-0")

    def pafka_df() -> DataFrame:
        return spark.read.format("pafka").option("topic", TOPIC).load(root)

    check = pafka_df().agg(F.count("*").alias("n"), F.sum("key").alias("s")).first()
    if check.n != rows or check.s != rows * (rows - 1) // 2:
        raise RuntimeError(f"pafka batch read gave {check}, expected {rows} rows")
    schema = pafka_df().schema
    parts = pafka_df().rdd.getNumPartitions()
    pq_parts = spark.read.parquet(pq).rdd.getNumPartitions()

    def ceiling_df(stream: bool = False) -> DataFrame:
        r = spark.readStream if stream else spark.read
        return (r.format("bench_ceiling").option("rows", rows).option("parts", parts)
                .option("schema", schema.json()).load())

    def noop(df: DataFrame) -> float:
        return timed(lambda: df.write.format("noop").mode("overwrite").save())

    batch = median_interleaved({
        "pafka source": lambda i: noop(pafka_df()),
        "parquet source": lambda i: noop(spark.read.parquet(pq)),
        "ceiling source": lambda i: noop(ceiling_df()),
    }, repeat)

    pq_schema = spark.read.parquet(pq).schema

    def ckpt(name: str, i: int) -> str:
        return os.path.join(data, "checkpoints", f"{name}-{i}")

    stream = median_interleaved({
        "pafka stream": lambda i: run_stream(
            spark.readStream.format("pafka").option("topic", TOPIC)
            .option("startingOffsets", "earliest").load(root), ckpt("pafka", i), rows),
        "parquet stream": lambda i: run_stream(
            spark.readStream.schema(pq_schema).parquet(pq), ckpt("parquet", i), rows),
        "ceiling stream": lambda i: run_stream(ceiling_df(stream=True), ckpt("ceiling", i),
                                               rows),
    }, repeat)
    return {"batch": batch, "stream": stream, "parts": parts, "pq_parts": pq_parts}


def bench_latency(spark: SparkSession, data: str, seconds: float, interval: float,
                  per_commit: int) -> dict:
    root = os.path.join(data, "latency")
    store = Store.open(root, STORE_CONF)
    schema = pa.schema([pa.field("key", pa.int64(), nullable=False),
                        pa.field("timestamp", pa.int64(), nullable=False),
                        pa.field("value", pa.binary())])
    topic = store.create_topic("latency", schema, partitions=TOPIC_PARTITIONS)
    commits = int(seconds / interval)
    value = pa.array([bytes(100)] * per_commit, pa.binary())
    batches = [pa.record_batch([pa.array(np.arange(i * per_commit, (i + 1) * per_commit)),
                                pa.array(np.full(per_commit, TS0, np.int64)), value],
                               schema=schema) for i in range(commits)]
    seen: dict[int, tuple[float, int]] = {}
    produced: dict[int, tuple[int, float]] = {}

    def on_batch(df: DataFrame, batch_id: int) -> None:
        rows = (df.where(F.col("key") % per_commit == 0)
                .select("key", F.unix_millis("_timestamp").alias("ts")).collect())
        now = time.time()
        for r in rows:
            seen.setdefault(r.key // per_commit, (now, r.ts))

    ckpt = os.path.join(data, "checkpoints", "latency")
    q = (spark.readStream.format("pafka").option("topic", "latency")
         .option("startingOffsets", "earliest").option("includeMetadata", "true").load(root)
         .writeStream.foreachBatch(on_batch).trigger(processingTime="0 seconds")
         .option("checkpointLocation", ckpt).start())
    try:
        deadline = time.time() + 120
        while q.lastProgress is None and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(2)  # let the query settle into polling

        def produce() -> None:
            nxt = time.monotonic()
            for i, b in enumerate(batches):
                res = topic.append(b)
                produced[i] = (res[0].timestamp, time.time())
                nxt += interval
                time.sleep(max(0.0, nxt - time.monotonic()))

        t = threading.Thread(target=produce, name="producer")
        t0 = time.time()
        t.start()
        t.join()
        wait = time.time() + 30
        while len(seen) < commits and time.time() < wait:
            time.sleep(0.05)
        elapsed = time.time() - t0
    finally:
        q.stop()
    store.close()
    if len(seen) < commits:
        raise RuntimeError(f"latency: saw {len(seen)} of {commits} commits")
    lat = np.array([seen[i][0] - seen[i][1] / 1000 for i in range(commits)])
    after_return = np.array([seen[i][0] - produced[i][1] for i in range(commits)])
    stamps_agree = all(seen[i][1] == produced[i][0] for i in range(commits))
    busy = [p for p in q.recentProgress if p["numInputRows"] > 0]
    phases: dict[str, float] = {}
    for k in ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
              "triggerExecution"):
        vals = [p["durationMs"].get(k, 0) for p in busy]
        phases[k] = statistics.median(vals) if vals else float("nan")
    return {"commits": commits, "per_commit": per_commit, "interval": interval,
            "elapsed": elapsed, "p50": float(np.percentile(lat, 50)),
            "p99": float(np.percentile(lat, 99)), "max": float(lat.max()),
            "min": float(lat.min()), "return_p50": float(np.percentile(after_return, 50)),
            "return_p99": float(np.percentile(after_return, 99)),
            "stamps_agree": stamps_agree, "batches": len(busy), "phases": phases}


# -- report ---------------------------------------------------------------------------------------
def update_section(path: str, body: str) -> None:
    """Replace (or append) this script's section of RESULTS.md, re-reading the file first."""
    start, end = f"<!-- {MARK}:start -->", f"<!-- {MARK}:end -->"
    text = "# Benchmark results\n\nEach section is written by the script it names.\n"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text and text.index(start) < text.index(end):
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print(f"wrote {path}")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        mem = float("nan")
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} "
            f"{platform.release()}; Python {platform.python_version()}, PySpark "
            f"{pyspark.__version__}, pyarrow {pa.__version__}")


def report(args: argparse.Namespace, rows: int, gen_s: float, sink: dict, src: dict,
           lat: dict, total_s: float) -> str:
    med = {k: statistics.median(v) for part in (sink["times"], src["batch"], src["stream"])
           for k, v in part.items()}

    def rate(k: str) -> str:
        return f"{rows / med[k] / 1e6:.2f} M"

    def runs(k: str) -> str:
        allv = {**sink["times"], **src["batch"], **src["stream"]}[k]
        return " / ".join(f"{v:.2f}" for v in allv)

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    sink_ratio = med["parquet sink"] / med["pafka sink"]
    b_pq = med["parquet source"] / med["pafka source"]
    b_ceil = med["ceiling source"] / med["pafka source"]
    s_pq = med["parquet stream"] / med["pafka stream"]
    s_ceil = med["ceiling stream"] / med["pafka stream"]
    ceil_pq = med["parquet source"] / med["ceiling source"]
    mb = rows * 116 / 1e6
    cmd = ".venv/bin/python bench/spark_bench.py" + (
        f" --rows {rows}" if rows != 10_000_000 else "") + (
        f" --repeat {args.repeat}" if args.repeat != 3 else "")
    lines = [
        "## Spark: pafka sink and sources (`bench/spark_bench.py`)", "",
        f"Command: `{cmd}` — {machine()}. One `local[2]` SparkSession (driver memory 6g, "
        f"defaults otherwise: `spark.sql.execution.arrow.maxRecordsPerBatch`=10,000). "
        f"Script run time {total_s / 60:.1f} min.", "",
        f"Rows: {rows:,} of (key bigint, timestamp bigint, value **binary**, 100 pseudo-random "
        f"bytes: a slice of two SHA-512 digests of the key) ≈ {mb:,.0f} MB of payload, generated "
        f"from `spark.range` and cached in memory before timing ({gen_s:.1f} s), so every "
        "writer reads the same rows from Spark's cache. pafka: one store on the default file "
        f"tier on local disk (fsync per chunk), topic of {TOPIC_PARTITIONS} partitions, "
        f"written by {args.spark_parts} tasks; Parquet: snappy, Spark's default, same disk (no "
        "fsync). Reads run over the data just written (page cache warm for both). Times are "
        f"wall clock per action; rows/s from the median of {args.repeat} runs, peers "
        "interleaved run by run.", "",
        "| path | median rows/s | runs (s) |", "|---|---|---|",
        f"| `df.write.format(\"pafka\")` | {rate('pafka sink')} | {runs('pafka sink')} |",
        f"| `df.write.parquet` (snappy) | {rate('parquet sink')} | {runs('parquet sink')} |",
        f"| `spark.read.format(\"pafka\")` → noop ({src['parts']} partitions) | "
        f"{rate('pafka source')} | {runs('pafka source')} |",
        f"| `spark.read.parquet` → noop ({src['pq_parts']} partitions) | "
        f"{rate('parquet source')} | {runs('parquet source')} |",
        f"| storage-free Python source → noop ({src['parts']} partitions, 64k-row batches) | "
        f"{rate('ceiling source')} | {runs('ceiling source')} |",
        f"| `readStream.format(\"pafka\")`, AvailableNow → noop | {rate('pafka stream')} | "
        f"{runs('pafka stream')} |",
        f"| `readStream.parquet` (file source), AvailableNow → noop | {rate('parquet stream')} "
        f"| {runs('parquet stream')} |",
        f"| storage-free Python stream source, AvailableNow → noop | "
        f"{rate('ceiling stream')} | {runs('ceiling stream')} |", "",
        f"On disk: pafka {sink['bytes']['pafka'] / 1e6:,.0f} MB, Parquet "
        f"{sink['bytes']['parquet'] / 1e6:,.0f} MB. Streaming times run from `start()` to the "
        "end of `awaitTermination()` (query start-up included, fresh checkpoint each run).", "",
        "| ratio | value | target |", "|---|---|---|",
        f"| pafka sink / parquet sink | {sink_ratio:.2f}× | ≥ {TARGETS['sink']}×: "
        f"{verdict(sink_ratio >= TARGETS['sink'])} |",
        f"| pafka batch source / ceiling | {b_ceil:.2f}× | ≥ {TARGETS['source']}×: "
        f"{verdict(b_ceil >= TARGETS['source'])} |",
        f"| pafka streaming source / ceiling (streaming) | {s_ceil:.2f}× | ≥ "
        f"{TARGETS['source']}×: {verdict(s_ceil >= TARGETS['source'])} |",
        f"| pafka batch source / parquet | {b_pq:.2f}× | — |",
        f"| pafka streaming source / parquet file stream | {s_pq:.2f}× | — |",
        f"| ceiling / parquet (batch) | {ceil_pq:.2f}× | — |",
        f"| end-to-end latency p50 | {lat['p50']:.3f} s | ≤ {TARGETS['p50']} s: "
        f"{verdict(lat['p50'] <= TARGETS['p50'])} |", "",
        "The ceiling is a Python data source in this script that builds one 64k-row Arrow "
        "batch of the same schema in `read()` and yields it (slicing the last) until the "
        "partition's rows are out: no storage, no copies. It gets as many partitions as "
        "the pafka read planned.", "",
        f"**Latency.** A producer thread in the driver process appends {lat['commits']} "
        f"batches of {lat['per_commit']} rows with `Topic.append` (durable and visible on "
        f"return; round-robin over {TOPIC_PARTITIONS} partitions), one every "
        f"{lat['interval'] * 1000:.0f} ms, into a topic that a pafka streaming query "
        "(`includeMetadata=true`, `trigger(processingTime=\"0 seconds\")`) reads into "
        "`foreachBatch`; there each micro-batch collects the first row of every append "
        "(`key % rows-per-append == 0`) with its `_timestamp`. One sample per append: "
        "**latency = wall clock when the micro-batch's `collect()` returned on the driver − "
        "`_timestamp`**, the commit time the store assigned to the append (ms precision; "
        "taken just before the commit-log entry is published, so publishing is included). "
        "The query ran a few idle triggers before the producer started.", "",
        "| samples | p50 | p99 | min | max | p50 / p99 from `append()` returning |",
        "|---|---|---|---|---|---|",
        f"| {lat['commits']} | {lat['p50'] * 1000:.0f} ms | {lat['p99'] * 1000:.0f} ms | "
        f"{lat['min'] * 1000:.0f} ms | {lat['max'] * 1000:.0f} ms | "
        f"{lat['return_p50'] * 1000:.0f} / {lat['return_p99'] * 1000:.0f} ms |", "",
        f"{lat['batches']} non-empty micro-batches; median phase times of those (ms): "
        + ", ".join(f"{k} {v:.0f}" for k, v in lat["phases"].items()) + "."
        + ("" if lat["stamps_agree"] else
           " (`_timestamp` differed from `AppendResult.timestamp` for some appends.)"),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--latency-interval", type=float, default=0.05,
                    help="seconds between appends of the latency producer")
    ap.add_argument("--latency-rows", type=int, default=100, help="rows per append")
    ap.add_argument("--keep", action="store_true", help="keep bench/data/spark-* afterwards")
    args = ap.parse_args()
    t_start = time.perf_counter()
    rows = args.rows
    data = os.path.join(HERE, "data", f"spark-{uuid.uuid4().hex[:8]}")
    os.makedirs(data)
    spark = make_session()
    try:
        print(f"{rows:,} rows into {data}", flush=True)
        src = generate(spark, rows)
        gen_s = timed(lambda: src.count())
        args.spark_parts = src.rdd.getNumPartitions()
        print(f"  generated and cached in {gen_s:.1f} s ({args.spark_parts} partitions)",
              flush=True)
        print("sink", flush=True)
        sink = bench_sink(src, data, args.repeat, rows)
        src.unpersist()
        print("sources", flush=True)
        sources = bench_sources(spark, data, args.repeat, rows)
        print("latency", flush=True)
        lat = bench_latency(spark, data, args.latency_seconds, args.latency_interval,
                            args.latency_rows)
        print(f"  p50 {lat['p50']:.3f} s, p99 {lat['p99']:.3f} s", flush=True)
    finally:
        spark.stop()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
    body = report(args, rows, gen_s, sink, sources, lat, time.perf_counter() - t_start)
    print(body)
    update_section(args.out, body)


if __name__ == "__main__":
    main()
