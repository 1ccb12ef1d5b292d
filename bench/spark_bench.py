"""Spark benchmark: the pafka sink and sources against Parquet, and end-to-end latency.

    .venv/bin/python bench/spark_bench.py [--rows 10000000] [--write-results] [--out DIR]

One local[2] SparkSession, one run. Rows are (key bigint, timestamp bigint, value binary):
the value is 100 pseudo-random bytes per row (a slice of two SHA-512 digests of the key),
generated in Spark from ``spark.range`` and cached in memory, so every writer reads the same
rows and none pays for generating them. Every path runs once untimed (warm-up), then
``--repeat`` times, peers interleaved round by round:

* sink: ``df.write.format("pafka")`` against ``df.write.parquet`` (snappy), and against a
  Python ``DataSourceArrowWriter`` that drops its input (the ceiling of any Python sink);
* batch source → ``noop``: ``spark.read.format("pafka")`` against ``spark.read.parquet``
  and against a Python source with no storage that yields pre-built 64k-row Arrow batches
  of the same schema (the ceiling of any Python source); the pafka read as it is by default,
  verifying each chunk's checksum, and with ``verifyChecksums=false``;
* streaming source with Trigger.AvailableNow → ``noop``: pafka (verified, and with
  ``verifyChecksums=false``) against Spark's file stream source over the same Parquet files
  and against the storage-free source's stream reader;
* latency: a producer thread appends small batches with ``Topic.append`` at a fixed rate; a
  pafka streaming query with a 0-second processing-time trigger collects, in
  ``foreachBatch``, one row per append; latency = the time the collect returned minus the
  row's ``_timestamp`` (the commit time the store assigned, ms precision);
* the page cache: after the sinks, the CPU it takes to write the sink's bytes into the page
  cache from one reused buffer, on memory freed 20 s before and on memory just freed (on a
  VM whose balloon reports free pages to the host the two differ several times over).

Ratios are medians of the per-round ratios (each round runs the peers back to back, so a
busy neighbour on a shared machine weighs on both). The report is printed; with
``--write-results`` the section between the ``spark-bench`` markers of bench/RESULTS.md is
rewritten (the rest of the file is left as it is); ``--out DIR`` writes it to DIR/RESULTS.md.
A failed or degenerate measurement stops the run with a non-zero status.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyspark  # noqa: E402
from bench_common import (  # noqa: E402
    Output,
    add_output_args,
    dump_raw,
    fail,
    float_range,
    int_range,
    positive,
)
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: E402
from pyspark.sql.types import StructType  # noqa: E402

from pafka_source import SPARK_CONF  # noqa: E402
from tier_store import Store  # noqa: E402

TS0 = 1_700_000_000_000
CEILING_BATCH = 65_536
TOPIC = "bench"
TOPIC_PARTITIONS = 4
STORE_CONF = {"storage.tiers.first.sizes": "256g"}  # default file tier on disk, with room
MARK = "spark-bench"
QUIET_CORES = 0.25  # before a timed run, wait (a minute at most) until others use less
TARGETS = {"sink": 1.1, "source": 0.95, "p50": 0.5}


# -- the ceiling of a Python source: no storage at all --------------------------------------------
class CeilingPartition(InputPartition):
    def __init__(self, rows: int, batch: int):
        super().__init__(rows)
        self.rows, self.batch = rows, batch


def _split(rows: int, parts: int, batch: int) -> list[CeilingPartition]:
    return [CeilingPartition(rows // parts + (1 if i < rows % parts else 0), batch)
            for i in range(parts)]


def _ceiling_batches(schema: StructType, rows: int, n: int) -> Iterator[pa.RecordBatch]:
    """``rows`` rows as ``n``-row batches: one batch built in memory, then yielded again and
    again (the last one sliced)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    target = to_arrow_schema(schema, timezone="UTC")
    keys = np.arange(n, dtype=np.int64)
    values = pa.py_buffer(np.random.default_rng(7).bytes(n * 100))
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 100).tobytes())
    value = pa.Array.from_buffers(pa.binary(), n, [None, offsets, values])
    batch = pa.RecordBatch.from_arrays([pa.array(keys), pa.array(keys + TS0), value],
                                       schema=target)
    left = rows
    while left > 0:
        yield batch if left >= n else batch.slice(0, left)
        left -= n


class CeilingReader(DataSourceReader):
    def __init__(self, schema: StructType, rows: int, parts: int, batch: int):
        self.schema, self.rows, self.parts, self.batch = schema, rows, parts, batch

    def partitions(self) -> list[CeilingPartition]:
        return _split(self.rows, self.parts, self.batch)

    def read(self, partition: CeilingPartition) -> Iterator[pa.RecordBatch]:
        return _ceiling_batches(self.schema, partition.rows, partition.batch)


class CeilingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, schema: StructType, rows: int, parts: int, batch: int):
        self.schema, self.rows, self.parts, self.batch = schema, rows, parts, batch

    def initialOffset(self) -> dict:
        return {"rows": 0}

    def latestOffset(self, start: dict, limit: object) -> dict:
        return {"rows": self.rows}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict) -> list[CeilingPartition]:
        return _split(end["rows"] - start["rows"], self.parts, self.batch)

    def read(self, partition: CeilingPartition) -> Iterator[pa.RecordBatch]:
        return _ceiling_batches(self.schema, partition.rows, partition.batch)

    def commit(self, end: dict) -> None:
        pass


class CeilingSource(DataSource):
    """``format("bench_ceiling")``: options rows, parts, batch (rows per Arrow batch) and
    schema (Spark's JSON)."""

    @classmethod
    def name(cls) -> str:
        return "bench_ceiling"

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def _args(self, schema: StructType) -> tuple[StructType, int, int, int]:
        o = self.options
        return schema, int(o["rows"]), int(o["parts"]), int(o.get("batch", CEILING_BATCH))

    def reader(self, schema: StructType) -> CeilingReader:
        return CeilingReader(*self._args(schema))

    def streamReader(self, schema: StructType) -> CeilingStreamReader:
        return CeilingStreamReader(*self._args(schema))


# -- the ceiling of a Python sink: an Arrow writer that stores nothing -----------------------------
class NullWriter(DataSourceArrowWriter):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list) -> None:
        pass

    def abort(self, messages: list) -> None:
        pass


class NullSink(DataSource):
    """``format("bench_null")``: a ``DataSourceArrowWriter`` that drops every batch."""

    @classmethod
    def name(cls) -> str:
        return "bench_null"

    def writer(self, schema: StructType, overwrite: bool) -> NullWriter:
        return NullWriter()


# -- helpers ---------------------------------------------------------------------------------------
OTHERS: dict[str, list[float]] = {}  # CPU (in cores) used by processes outside this run
WAITED: list[float] = []


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


CPU: dict[str, list[dict[str, float]]] = {}
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _foreign_jiffies() -> int:
    """CPU time of user-space processes outside this run: the machine's user, nice and
    system time, less this process tree's and the kernel threads' (writeback, journal:
    work done for whoever writes, this run included)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:4]]
    total = sum(v)
    procs = _all_procs()
    for t in (v[1] for v in _tree(procs).values()):
        total -= t[4] + t[5] + t[6] + t[7]  # children that exited count in their parent's
    for pid, (ppid, t, _) in procs.items():
        if pid == 2 or ppid == 2:
            total -= t[4] + t[5]
    return total


def others_cores(fn: Callable[[], object]) -> float:
    """Run ``fn``; the CPU (in cores) that other processes used meanwhile."""
    f0, t0 = _foreign_jiffies(), time.perf_counter()
    fn()
    f1, t1 = _foreign_jiffies(), time.perf_counter()
    return max(0.0, (f1 - f0) / _HZ / max(t1 - t0, 1e-3))


def wait_quiet(limit: float, most: float = 60.0) -> None:
    """Wait (at most ``most`` seconds) until other processes use under ``limit`` cores."""
    t0 = time.perf_counter()
    while others_cores(lambda: time.sleep(1.0)) > limit and time.perf_counter() - t0 < most:
        pass
    WAITED.append(time.perf_counter() - t0)


Procs = dict[int, tuple[int, list[int], str]]


def _all_procs() -> Procs:
    """pid -> (ppid, stat fields 7..14: minflt cminflt majflt cmajflt utime stime cutime
    cstime, command line) of every process."""
    procs: Procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        procs[int(d)] = (int(fields[1]), [int(x) for x in fields[7:15]], cmd)
    return procs


def _tree(procs: Procs) -> Procs:
    """This process and its descendants."""
    tree, grew = {os.getpid()}, True
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return {pid: procs[pid] for pid in tree if pid in procs}


def tree_cpu() -> dict[str, float]:
    """CPU seconds (user, sys, children included) and minor page faults of this process's
    descendants, split into the JVM and Spark's Python workers (Linux /proc)."""
    out = {f"{k}_{m}": 0.0 for k in ("jvm", "py") for m in ("user", "sys", "faults")}
    for pid, (_, v, cmd) in _tree(_all_procs()).items():
        if pid == os.getpid():
            continue
        k = "jvm" if "java" in cmd else "py" if "pyspark" in cmd else None
        if k is None:
            continue
        # minflt cminflt majflt cmajflt utime stime cutime cstime
        out[f"{k}_faults"] += v[0] + v[1]
        out[f"{k}_user"] += (v[4] + v[6]) / _HZ
        out[f"{k}_sys"] += (v[5] + v[7]) / _HZ
    return out


DEVICE: list[str] = []  # /sys stat file of the block device holding the benchmark's data


def use_device_of(path: str) -> None:
    """Account the device that holds ``path``: what reached it during each timed run."""
    st = os.stat(path)
    stat = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    DEVICE[:] = [stat] if os.path.exists(stat) else []


def device_stat() -> dict[str, float]:
    """MB written to the data's device and the time it was busy (s), since boot."""
    if not DEVICE:
        return {"dev_mb": float("nan"), "dev_busy": float("nan")}
    with open(DEVICE[0]) as f:
        v = f.read().split()
    return {"dev_mb": int(v[6]) * 512 / 1e6, "dev_busy": int(v[9]) / 1000}


def rounds(fns: dict[str, Callable[[int], float]], repeat: int) -> dict[str, list[float]]:
    """Round 0 (warm-up) and ``repeat`` timed rounds, each running every function once;
    before each timed run, wait a little for other processes on the machine to go quiet."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(repeat + 1):
        for k, fn in fns.items():
            if i:
                wait_quiet(QUIET_CORES)
            before = tree_cpu() | device_stat()
            others = others_cores(lambda k=k, fn=fn, i=i: out[k].append(fn(i)))
            positive(out[k][-1], f"{k}, round {i}: time")
            after = tree_cpu() | device_stat()
            if i:
                CPU.setdefault(k, []).append({m: after[m] - before[m] for m in after})
                OTHERS.setdefault(k, []).append(others)
            print(f"    {k} {'warm-up' if i == 0 else f'run {i}'}: {out[k][-1]:.2f} s "
                  f"(others {others:.2f} cores)", flush=True)
    return out


def fsync_tree(path: str) -> None:
    """fsync every file and directory under ``path``: what it takes to make Spark's output
    as durable as a pafka commit (Spark's file commit protocol never syncs)."""
    for d, _, fs in os.walk(path):
        for name in [*fs, "."]:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def free_page_reporting() -> str:
    """Whether a virtio balloon hands the guest's free pages back to the host (its feature
    bit 5, VIRTIO_BALLOON_F_REPORTING): "on", "off" or "no balloon"."""
    found = "no balloon"
    for f in glob.glob("/sys/bus/virtio/drivers/virtio_balloon/*/features"):
        with open(f) as fh:
            bits = fh.read().strip()
        found = "on" if len(bits) > 5 and bits[5] == "1" else "off"
    return found


def probe_page_cache(data: str, nbytes: int, rounds: int = 2, pause: float = 20.0) -> dict:
    """CPU seconds to write ``nbytes`` into the page cache from one reused buffer, on memory
    freed ``pause`` seconds earlier and on memory freed just before: the kernel's copy costs
    what the pages it is given cost to touch, which on a VM depends on their history."""
    buf = os.urandom(32 << 20)

    def write(path: str) -> float:
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for off in range(0, nbytes, len(buf)):
                os.pwrite(fd, buf, off)
        finally:
            os.close(fd)
        return resource.getrusage(resource.RUSAGE_SELF).ru_stime - r0

    paused, reused = [], []
    for _ in range(rounds):
        os.sync()
        time.sleep(pause)
        a, b = os.path.join(data, "probe-a"), os.path.join(data, "probe-b")
        paused.append(write(a))
        os.unlink(a)
        reused.append(write(b))
        os.unlink(b)
    return {"bytes": nbytes, "pause": pause, "rounds": rounds, "paused": statistics.median(paused),
            "reused": statistics.median(reused), "reporting": free_page_reporting()}


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run_stream(df: DataFrame, ckpt: str, rows: int, trigger_ms: list[float]) -> float:
    """``df`` → noop with AvailableNow: wall time from ``start()`` to termination."""
    t0 = time.perf_counter()
    q = (df.writeStream.format("noop").trigger(availableNow=True)
         .option("checkpointLocation", ckpt).start())
    q.awaitTermination()
    dt = time.perf_counter() - t0
    progress = q.recentProgress
    got = sum(p["numInputRows"] for p in progress)
    if got != rows:
        raise fail(f"streaming query read {got} rows, expected {rows}")
    trigger_ms.append(sum(p["durationMs"].get("triggerExecution", 0) for p in progress
                          if p["numInputRows"] > 0))
    shutil.rmtree(ckpt, ignore_errors=True)
    return dt


# -- the benchmark ---------------------------------------------------------------------------------
def make_session() -> SparkSession:
    spark = (SparkSession.builder.master("local[2]").appName("pafka-spark-bench")
             .config(map=SPARK_CONF)
             .config("spark.driver.memory", "6g")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(CeilingSource)
    spark.dataSource.register(NullSink)
    return spark


def topic_schema() -> pa.Schema:
    """The Arrow schema the pafka sink gives a topic created from :func:`generate`'s rows."""
    return pa.schema([pa.field("key", pa.int64(), nullable=False),
                      pa.field("timestamp", pa.int64(), nullable=False),
                      pa.field("value", pa.binary())])


def generate(spark: SparkSession, rows: int) -> DataFrame:
    df = spark.range(0, rows).selectExpr(
        "id AS key", f"{TS0} + id AS timestamp",
        "substring(unhex(concat(sha2(cast(id AS string), 512), "
        "sha2(cast(id + 7 AS string), 512))), 1, 100) AS value")
    return df.cache()


def at_spark_default(spark: SparkSession, fn: Callable[[], float]) -> float:
    """``fn()`` with Spark's own values for the settings pafka recommends (SPARK_CONF)."""
    for k in SPARK_CONF:
        spark.conf.unset(k)
    try:
        return fn()
    finally:
        for k, v in SPARK_CONF.items():
            spark.conf.set(k, v)


def bench_sink(src: DataFrame, data: str, repeat: int, rows: int) -> dict:
    def pafka(i: int, direct: str = "0") -> float:
        root = os.path.join(data, f"store-{i}" if direct == "0" else f"store-direct-{i}")
        Store.open(root, STORE_CONF).close()
        dt = timed(lambda: src.write.format("pafka").option("topic", TOPIC)
                   .option("partitions", TOPIC_PARTITIONS)
                   .option("log.file.direct.bytes", direct).mode("append").save(root))
        got = sum(Store.open(root).topic(TOPIC).latest_offsets().values())
        if got != rows:
            raise fail(f"pafka sink wrote {got} rows, expected {rows}")
        if i or direct != "0":  # keep round 0's topic (the default store) for the reads
            shutil.rmtree(root)
        return dt

    def pafka_pmem(i: int) -> float:
        # The product's fast tier: a pmem tier, here on /dev/shm (RAM) for want of PMem.
        root = os.path.join(data, f"store-pmem-{i}")
        shm = os.path.join("/dev/shm", f"pafka-spark-bench-{os.getpid()}-{i}")
        size = max(1 << 30, int(rows * 130 * 1.3)) + (256 << 20)
        try:
            Store.open(root, {"log.channel.type": "pmem", "storage.tiers.first.paths": shm,
                              "storage.tiers.first.sizes": str(size),
                              "log.pmem.pool.ratio": 1.0}).close()
            dt = timed(lambda: src.write.format("pafka").option("topic", TOPIC)
                       .option("partitions", TOPIC_PARTITIONS).mode("append").save(root))
            got = sum(Store.open(root).topic(TOPIC).latest_offsets().values())
            if got != rows:
                raise fail(f"pafka sink (pmem) wrote {got} rows, expected {rows}")
            return dt
        finally:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(shm, ignore_errors=True)

    def parquet(i: int) -> float:
        path = os.path.join(data, f"parquet-{i}")
        dt = timed(lambda: src.write.parquet(path))
        if i:
            shutil.rmtree(path)
        return dt

    def parquet_durable(i: int) -> float:
        path = os.path.join(data, f"parquet-durable-{i}")
        dt = timed(lambda: (src.write.parquet(path), fsync_tree(path)))
        shutil.rmtree(path)
        return dt

    def null(i: int) -> float:
        return timed(lambda: src.write.format("bench_null").mode("append").save())

    def pafka_default(i: int) -> float:
        root = os.path.join(data, f"store-default-{i}")
        try:
            Store.open(root, STORE_CONF).close()
            return at_spark_default(src.sparkSession, lambda: timed(
                lambda: src.write.format("pafka").option("topic", TOPIC)
                .option("partitions", TOPIC_PARTITIONS).mode("append").save(root)))
        finally:
            shutil.rmtree(root, ignore_errors=True)

    times = rounds({"pafka sink": pafka, "pafka sink default": pafka_default,
                    "pafka sink direct": lambda i: pafka(i, DIRECT),
                    "pafka sink pmem": pafka_pmem,
                    "parquet sink": parquet, "parquet sink durable": parquet_durable,
                    "null sink": null,
                    "null sink default": lambda i: at_spark_default(src.sparkSession,
                                                                    lambda: null(i))}, repeat)
    return {"times": times, "bytes": {"pafka": dir_bytes(os.path.join(data, "store-0")),
                                      "parquet": dir_bytes(os.path.join(data, "parquet-0"))}}


# The pafka sink once more with chunks of this size and more written past the page cache.
DIRECT = "1m"


def stored_batch_rows(root: str) -> float:
    """Mean rows per Arrow record batch that the sink stored (what readers then yield)."""
    topic = Store.open(root).topic(TOPIC)
    sizes = [b.num_rows for b in topic.read(0, 0)]
    return sum(sizes) / max(1, len(sizes))


def bench_sources(spark: SparkSession, data: str, repeat: int, rows: int) -> dict:
    root = os.path.join(data, "store-0")
    pq = os.path.join(data, "parquet-0")

    def pafka_df(verify: bool = True) -> DataFrame:
        r = spark.read.format("pafka").option("topic", TOPIC)
        if not verify:
            r = r.option("verifyChecksums", "false")
        return r.load(root)

    for verify in (True, False):
        check = pafka_df(verify).agg(F.count("*").alias("n"), F.sum("key").alias("s")).first()
        if check.n != rows or check.s != rows * (rows - 1) // 2:
            raise fail(f"pafka batch read (verifyChecksums={str(verify).lower()}) gave "
                       f"{check}, expected {rows} rows")
    schema = pafka_df().schema
    parts = pafka_df().rdd.getNumPartitions()
    pq_parts = spark.read.parquet(pq).rdd.getNumPartitions()
    pq_schema = spark.read.parquet(pq).schema

    def ceiling_df(stream: bool = False) -> DataFrame:
        r = spark.readStream if stream else spark.read
        return (r.format("bench_ceiling").option("rows", rows).option("parts", parts)
                .option("schema", schema.json()).load())

    def noop(df: DataFrame) -> float:
        return timed(lambda: df.write.format("noop").mode("overwrite").save())

    batch = rounds({
        "pafka source": lambda i: noop(pafka_df()),
        "pafka source unverified": lambda i: noop(pafka_df(verify=False)),
        "parquet source": lambda i: noop(spark.read.parquet(pq)),
        "ceiling source": lambda i: noop(ceiling_df()),
    }, repeat)

    trig: dict[str, list[float]] = {"pafka stream": [], "pafka stream unverified": [],
                                    "parquet stream": [], "ceiling stream": []}

    def ckpt(name: str, i: int) -> str:
        return os.path.join(data, "checkpoints", f"{name}-{i}")

    def pafka_stream(verify: bool = True) -> DataFrame:
        r = (spark.readStream.format("pafka").option("topic", TOPIC)
             .option("startingOffsets", "earliest"))
        if not verify:
            r = r.option("verifyChecksums", "false")
        return r.load(root)

    stream = rounds({
        "pafka stream": lambda i: run_stream(pafka_stream(), ckpt("pafka", i), rows,
                                             trig["pafka stream"]),
        "pafka stream unverified": lambda i: run_stream(
            pafka_stream(verify=False), ckpt("pafka-unverified", i), rows,
            trig["pafka stream unverified"]),
        "parquet stream": lambda i: run_stream(
            spark.readStream.schema(pq_schema).parquet(pq), ckpt("parquet", i), rows,
            trig["parquet stream"]),
        "ceiling stream": lambda i: run_stream(ceiling_df(stream=True), ckpt("ceiling", i),
                                               rows, trig["ceiling stream"]),
    }, repeat)
    return {"batch": batch, "stream": stream, "trigger_ms": trig, "parts": parts,
            "pq_parts": pq_parts, "batch_rows": stored_batch_rows(root)}


def bench_latency(spark: SparkSession, data: str, seconds: float, interval: float,
                  per_commit: int) -> dict:
    root = os.path.join(data, "latency")
    store = Store.open(root, STORE_CONF)
    topic = store.create_topic("latency", topic_schema(), partitions=TOPIC_PARTITIONS)
    commits = int(seconds / interval)
    value = pa.array([bytes(100)] * per_commit, pa.binary())
    batches = [pa.record_batch([pa.array(np.arange(i * per_commit, (i + 1) * per_commit)),
                                pa.array(np.full(per_commit, TS0, np.int64)), value],
                               schema=topic.schema) for i in range(commits)]
    seen: dict[int, tuple[float, int]] = {}
    produced: dict[int, tuple[int, float]] = {}

    def on_batch(df: DataFrame, batch_id: int) -> None:
        got = (df.where(F.col("key") % per_commit == 0)
               .select("key", F.unix_millis("_timestamp").alias("ts")).collect())
        now = time.time()
        for r in got:
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

        wait_quiet(QUIET_CORES)

        def run_producer() -> None:
            t = threading.Thread(target=produce, name="producer")
            t.start()
            t.join()
            wait = time.time() + 30
            while len(seen) < commits and time.time() < wait:
                time.sleep(0.05)

        OTHERS["latency"] = [others_cores(run_producer)]
    finally:
        q.stop()
    store.close()
    if len(seen) < commits:
        raise fail(f"latency: saw {len(seen)} of {commits} appends")
    lat = np.array([seen[i][0] - seen[i][1] / 1000 for i in range(commits)])
    after_return = np.array([seen[i][0] - produced[i][1] for i in range(commits)])
    busy = [p for p in q.recentProgress if p["numInputRows"] > 0]
    phases: dict[str, float] = {}
    for k in ("latestOffset", "queryPlanning", "addBatch", "walCommit", "commitOffsets",
              "triggerExecution"):
        vals = [p["durationMs"].get(k, 0) for p in busy]
        phases[k] = statistics.median(vals) if vals else float("nan")
    return {"commits": commits, "per_commit": per_commit, "interval": interval,
            "p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
            "max": float(lat.max()), "min": float(lat.min()),
            "return_p50": float(np.percentile(after_return, 50)),
            "return_p99": float(np.percentile(after_return, 99)),
            "stamps_agree": all(seen[i][1] == produced[i][0] for i in range(commits)),
            "batches": len(busy), "phases": phases}


# -- report ----------------------------------------------------------------------------------------
def machine() -> str:
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        mem = "RAM unknown"
    return (f"{cpu}, {os.cpu_count()} cores, {mem}, {platform.system()} {platform.release()}; "
            f"Python {platform.python_version()}, PySpark {pyspark.__version__}, pyarrow "
            f"{pa.__version__}")


def sink_summary(sink: dict, rows: int) -> str:
    """Medians and the ratios to the pafka sink, for a run of the sinks alone."""
    times = sink["times"]
    ours = times["pafka sink"][1:]
    lines = []
    for k, v in times.items():
        med = statistics.median(v[1:])
        r = statistics.median(p / o for p, o in zip(v[1:], ours, strict=True))
        lines.append(f"{k:24s} {med:6.2f} s  {rows / med / 1e6:5.2f} M rows/s  "
                     f"its time / pafka sink's time: {r:.2f}")
    return "\n".join(lines + cpu_rows(rows))


def cpu_rows(rows: int) -> list[str]:
    scale = 10_000_000 / rows
    out = []
    for k, runs in CPU.items():
        def m(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs) * scale
        out.append(f"| {k} | {m('jvm_user'):.1f} + {m('jvm_sys'):.1f} s | {m('py_user'):.1f} + "
                   f"{m('py_sys'):.1f} s | {m('py_faults'):,.0f} | {m('dev_mb'):,.0f} MB | "
                   f"{m('dev_busy'):.2f} s |")
    return out


def report(args: argparse.Namespace, rows: int, info: dict, sink: dict, src: dict,
           lat: dict, total_s: float) -> str:
    times = {**sink["times"], **src["batch"], **src["stream"]}
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    pc = sink["page_cache"]

    def per_round(peer: str, ours: str) -> list[float]:
        """Peer time / our time in each timed round (> 1: we are faster)."""
        return [p / o for p, o in zip(times[peer][1:], times[ours][1:], strict=True)]

    def ratio(peer: str, ours: str) -> float:
        return statistics.median(per_round(peer, ours))

    def rounds_of(peer: str, ours: str) -> str:
        """Each round's ratio, to show how far single rounds stray from the median."""
        return " / ".join(f"{x:.2f}" for x in per_round(peer, ours))

    def row(label: str, k: str, extra: str = "") -> str:
        runs = " / ".join(f"{v:.2f}" for v in times[k][1:])
        others = " / ".join(f"{v:.1f}" for v in OTHERS.get(k, []))
        return (f"| {label} | {rows / med[k] / 1e6:.2f} M | {med[k]:.2f} s | {runs} | "
                f"{others} | {times[k][0]:.2f} s |{extra}")

    def trig(k: str) -> str:
        return f" {statistics.median(src['trigger_ms'][k][1:]) / 1000:.2f} s |"

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    def cpu_of(k: str, side: str) -> float:
        runs = CPU.get(k) or [{f"{side}_user": float("nan"), f"{side}_sys": 0.0}]
        return statistics.median(c[f"{side}_user"] + c[f"{side}_sys"] for c in runs) * (
            10_000_000 / rows)

    def dev(k: str, key: str) -> float:
        return statistics.median(c[key] for c in CPU[k])

    def jvm_cpu(k: str) -> float:
        return cpu_of(k, "jvm")

    def py_cpu(k: str) -> float:
        return cpu_of(k, "py")

    r = {"sink": ratio("parquet sink", "pafka sink"),
         "default": ratio("parquet sink", "pafka sink default"),
         "null_default": ratio("parquet sink", "null sink default"),
         "setting": ratio("pafka sink default", "pafka sink"),
         "null_setting": ratio("null sink default", "null sink"),
         "direct": ratio("parquet sink", "pafka sink direct"),
         "direct/null": ratio("null sink", "pafka sink direct"),
         "null": ratio("parquet sink", "null sink"),
         "durable": ratio("parquet sink durable", "pafka sink"),
         "pmem": ratio("parquet sink", "pafka sink pmem"),
         "pmem/null": ratio("null sink", "pafka sink pmem"),
         "pafka/null": ratio("null sink", "pafka sink"),
         "b_ceil": ratio("ceiling source", "pafka source"),
         "b_pq": ratio("parquet source", "pafka source"),
         "ceil_pq": ratio("parquet source", "ceiling source"),
         "s_ceil": ratio("ceiling stream", "pafka stream"),
         "s_pq": ratio("parquet stream", "pafka stream"),
         # The same reads with verifyChecksums=false.
         "b_ceil_nv": ratio("ceiling source", "pafka source unverified"),
         "b_pq_nv": ratio("parquet source", "pafka source unverified"),
         "s_ceil_nv": ratio("ceiling stream", "pafka stream unverified"),
         "s_pq_nv": ratio("parquet stream", "pafka stream unverified"),
         # What verifying costs: the unverified read's time / the verified read's.
         "b_verify": ratio("pafka source unverified", "pafka source"),
         "s_verify": ratio("pafka stream unverified", "pafka stream")}
    tm = src["trigger_ms"]

    def trigger_ratio(peer: str, ours: str) -> float:
        return statistics.median(
            positive(c, f"{peer} triggerExecution (ms)") / positive(p, f"{ours} "
                                                                   "triggerExecution (ms)")
            for c, p in zip(tm[peer][1:], tm[ours][1:], strict=True))

    r["s_ceil_batch"] = trigger_ratio("ceiling stream", "pafka stream")
    r["s_ceil_batch_nv"] = trigger_ratio("ceiling stream", "pafka stream unverified")
    mb = rows * 116 / 1e6
    cmd = ".venv/bin/python bench/spark_bench.py" + (
        f" --rows {rows}" if rows != 10_000_000 else "") + (
        f" --repeat {args.repeat}" if args.repeat != 5 else "")
    busy = [v for k, vs in OTHERS.items() if k != "latency" for v in vs]
    ph = lat["phases"]
    lines = [
        "## Spark: pafka sink and sources (`bench/spark_bench.py`)", "",
        f"Command: `{cmd}` — {machine()}. Run time {total_s / 60:.1f} min. One `local[2]` "
        "SparkSession with the setting pafka recommends for jobs that write with it "
        "(`pafka_source.SPARK_CONF`: `spark.sql.execution.arrow.maxBytesPerBatch`=2147483647, "
        "see below; rows marked *Spark's default* run without it) and driver memory 6g; "
        "otherwise Spark's defaults, e.g. `spark.sql.execution.arrow.maxRecordsPerBatch`="
        "10,000. The machine is shared with "
        "other sessions: before each timed run the script waits (a minute at most) until "
        f"processes outside the run use under {QUIET_CORES} cores, and it records what they "
        "used during the run (column *others*, in cores of 2); over all timed runs: median "
        f"{statistics.median(busy):.2f}, max {max(busy):.2f} cores; waiting took "
        f"{sum(WAITED):.0f} s in all. Single runs still vary; ratios are medians of "
        "per-round ratios, each round running the peers back to back.", "",
        f"Rows: {rows:,} × (key bigint, timestamp bigint, value **binary** of 100 pseudo-random "
        f"bytes — a slice of two SHA-512 digests of the key) ≈ {mb:,.0f} MB of payload, "
        f"generated from `spark.range` in {info['spark_parts']} partitions and cached in memory "
        f"before timing ({info['gen_s']:.0f} s), so every writer reads the same rows from Spark's "
        "cache (a `noop` write of the cached rows takes well under a second). pafka: a store "
        "on the default file tier on local disk (through the page cache, one fdatasync per "
        f"segment a task touched), a topic of {TOPIC_PARTITIONS} partitions; Parquet: snappy, "
        "Spark's default, on the same disk (through the page cache, no fsync). Reads run "
        "over round 0's output of the default store, just written (page cache warm for both). "
        "**pafka reads verify each chunk's checksum by default** (`verifyChecksums=true`, "
        "as a Kafka consumer checks CRCs); the rows marked `verifyChecksums=false` read the "
        "same topic trusting the bytes, in the same rounds. Parquet checks its pages' CRCs "
        "only when asked (Spark does not by default); the ceiling source has nothing to "
        "check. Each "
        f"path runs once untimed (warm-up, last column), then {args.repeat} timed runs; rows/s "
        "from the median.", "",
        "| path | rows/s | median | timed runs (s) | others (cores) | warm-up |",
        "|---|---|---|---|---|---|",
        row("`df.write.format(\"pafka\")`", "pafka sink"),
        row("the same at Spark's default `maxBytesPerBatch` (64 MiB)", "pafka sink default"),
        row(f"the same with `log.file.direct.bytes={DIRECT}` (O_DIRECT)", "pafka sink direct"),
        row("the same on a pmem tier (on /dev/shm, RAM, standing in for PMem)",
            "pafka sink pmem"),
        row("`df.write.parquet` (snappy)", "parquet sink"),
        row("the same, then every file fsynced (as durable as a pafka commit)",
            "parquet sink durable"),
        row("Python `DataSourceArrowWriter` that drops its input (sink ceiling)", "null sink"),
        row("the same at Spark's default `maxBytesPerBatch`", "null sink default"),
        row(f"`spark.read.format(\"pafka\")` → noop ({src['parts']} partitions), checksums "
            "verified (the default)", "pafka source"),
        row("the same with `verifyChecksums=false`", "pafka source unverified"),
        row(f"`spark.read.parquet` → noop ({src['pq_parts']} partitions)", "parquet source"),
        row(f"storage-free Python source, 64k-row batches → noop ({src['parts']} partitions)",
            "ceiling source"),
        "", "| streaming, Trigger.AvailableNow → noop | rows/s | median | timed runs (s) | "
        "others (cores) | warm-up | the batch alone (triggerExecution) |",
        "|---|---|---|---|---|---|---|",
        row("`readStream.format(\"pafka\")`, checksums verified (the default)",
            "pafka stream", trig("pafka stream")),
        row("the same with `verifyChecksums=false`", "pafka stream unverified",
            trig("pafka stream unverified")),
        row("`readStream.parquet` (file source)", "parquet stream", trig("parquet stream")),
        row("storage-free Python stream source", "ceiling stream", trig("ceiling stream")), "",
        "Streaming times run from `start()` to the end of `awaitTermination()` with a fresh "
        "checkpoint (query start-up included; the last column is the one micro-batch alone). "
        f"On disk: pafka {sink['bytes']['pafka'] / 1e6:,.0f} MB, Parquet "
        f"{sink['bytes']['parquet'] / 1e6:,.0f} MB. The sink stored Arrow record batches of "
        f"{src['batch_rows']:,.0f} rows on average, which is what the pafka reads yield.", "",
        "| ratio (peer time / pafka time, > 1: pafka faster) | value | target |",
        "|---|---|---|",
        f"| pafka sink vs Parquet sink (rounds: {rounds_of('parquet sink', 'pafka sink')}) "
        f"| {r['sink']:.3f}× | ≥ {TARGETS['sink']}×: "
        f"{verdict(r['sink'] >= TARGETS['sink'])} |",
        f"| the same at Spark's default `maxBytesPerBatch` | {r['default']:.2f}× | — |",
        "| the same, chunks written with O_DIRECT (rounds: "
        f"{rounds_of('parquet sink', 'pafka sink direct')}) | {r['direct']:.2f}× | — |",
        f"| pafka batch source (verified, the default) vs the ceiling | {r['b_ceil']:.2f}× | "
        f"≥ {TARGETS['source']}×: {verdict(r['b_ceil'] >= TARGETS['source'])} |",
        f"| the same, `verifyChecksums=false` | {r['b_ceil_nv']:.2f}× | "
        f"≥ {TARGETS['source']}×: {verdict(r['b_ceil_nv'] >= TARGETS['source'])} |",
        f"| pafka streaming source (verified) vs the ceiling's stream reader (start to end) | "
        f"{r['s_ceil']:.2f}× | ≥ {TARGETS['source']}×: "
        f"{verdict(r['s_ceil'] >= TARGETS['source'])} |",
        f"| the same, `verifyChecksums=false` | {r['s_ceil_nv']:.2f}× | "
        f"≥ {TARGETS['source']}×: {verdict(r['s_ceil_nv'] >= TARGETS['source'])} |",
        f"| the streaming source (verified), the micro-batch alone (triggerExecution) | "
        f"{r['s_ceil_batch']:.2f}× | ≥ {TARGETS['source']}×: "
        f"{verdict(r['s_ceil_batch'] >= TARGETS['source'])} |",
        f"| the same, `verifyChecksums=false` | {r['s_ceil_batch_nv']:.2f}× | "
        f"≥ {TARGETS['source']}×: {verdict(r['s_ceil_batch_nv'] >= TARGETS['source'])} |",
        f"| end-to-end latency p50 (below) | {lat['p50']:.3f} s | ≤ {TARGETS['p50']} s: "
        f"{verdict(lat['p50'] <= TARGETS['p50'])} |",
        f"| pafka batch source vs `spark.read.parquet`: verified (the default) / "
        f"`verifyChecksums=false` | {r['b_pq']:.2f}× / {r['b_pq_nv']:.2f}× | — |",
        f"| pafka streaming source vs the file stream source: verified / "
        f"`verifyChecksums=false` | {r['s_pq']:.2f}× / {r['s_pq_nv']:.2f}× | — |",
        f"| what verifying costs: the unverified read's time / the verified read's | batch "
        f"{r['b_verify']:.2f}×, streaming {r['s_verify']:.2f}× | — |",
        f"| pafka sink vs Parquet fsynced | {r['durable']:.2f}× | — |",
        f"| pafka sink on the pmem tier vs Parquet sink | {r['pmem']:.2f}× (vs the sink "
        f"ceiling: {r['pmem/null']:.2f}×) | — |",
        f"| sink ceiling (drop-everything Python sink) vs Parquet sink | {r['null']:.2f}× "
        f"(at Spark's default: {r['null_default']:.2f}×) | — |",
        f"| what the setting gains: Spark's default time / the time with it | pafka sink "
        f"{r['setting']:.2f}×, sink ceiling {r['null_setting']:.2f}× | — |",
        f"| pafka sink vs the sink ceiling | {r['pafka/null']:.2f}× (O_DIRECT: "
        f"{r['direct/null']:.2f}×) | — |",
        f"| source ceiling vs `spark.read.parquet` | 1 / {r['ceil_pq']:.2f} = "
        f"{1 / r['ceil_pq']:.2f}× | — |", "",
        "Where the CPU went (medians over the timed runs, per 10M-row action, from /proc of "
        "the JVM and of Spark's Python workers; a Python worker that exits between samples is "
        "missed, so small figures are approximate):", "",
        "| path | JVM user + sys | Python workers user + sys | Python workers' minor page "
        "faults | written to the data's disk during the run | the disk busy |",
        "|---|---|---|---|---|---|",
        *cpu_rows(rows),
        "",
        "The source ceiling is a Python data source defined in the script: `read()` builds one "
        "64k-row Arrow batch of the topic's exact schema and yields it again and again (the "
        "last one sliced) until its partition's rows are out — no storage, no copy; it gets as "
        "many partitions as the pafka read planned. The sink ceiling is a "
        "`DataSourceArrowWriter` whose `write()` iterates over its batches and drops them: "
        "what Spark's JVM → Arrow → Python transfer costs before any storing.", "",
        "**Spark's setting.** For a Python writer, Spark's JVM turns rows into an Arrow batch "
        "and, unless `spark.sql.execution.arrow.maxBytesPerBatch` is at its largest value "
        "(2147483647), measures the batch after every row to stop it at that many bytes; the "
        "measuring walks every vector of the batch (`ArrowWriter.sizeInBytes`, which sets "
        "each vector's value count), and a Java Flight Recorder profile of the "
        "drop-everything sink at Spark's default put 45% of the JVM's samples there. "
        "`pafka_source.SPARK_CONF` sets the value; batches stay capped at "
        "`maxRecordsPerBatch` rows. Per 10M rows the JVM used "
        f"{jvm_cpu('pafka sink'):.1f} s of CPU in the pafka sink with it and "
        f"{jvm_cpu('pafka sink default'):.1f} s without (the drop-everything sink "
        f"{jvm_cpu('null sink'):.1f} s and {jvm_cpu('null sink default'):.1f} s); Parquet "
        "does not go through Arrow, and the reads send Arrow the other way, so neither "
        "depends on it. At Spark's default the drop-everything sink's time also differed "
        "from one JVM to the next in runs outside this report (about 4.3 s in some, 6.2 s in "
        "others, per 10M rows), and earlier reports, all at Spark's default, put that "
        "ceiling at 0.77–0.79× Parquet.", "",
        "**Where the sink's time goes.** Each task writes its chunks on a thread of its own "
        "(at most two in flight), cut so that two fill a 64 MiB segment, each one record batch "
        "gathered from Spark's batches' own buffers (no copy), with the partitions' "
        "first chunks staggered so that one comes due at a time; the kernel is asked to "
        "start each chunk's writeback as soon as it is written (`sync_file_range`), a rolled "
        "segment is flushed on a background thread, and each task makes its chunks durable "
        "once, at its end, before the driver commits. What is left over the drop-everything "
        "sink is the kernel's work on 1.2 GB (the copy into the page cache and the writeback: "
        f"{py_cpu('pafka sink'):.1f} s of CPU in the Python workers per 10M rows, against "
        f"{py_cpu('null sink'):.1f} s for the drop-everything sink) and the disk itself. "
        "The copy costs what touching the pages the kernel hands out costs, and on this VM "
        f"that depends on their history: writing the same {pc['bytes'] / 1e6:,.0f} MB into "
        f"the page cache from one reused buffer took {pc['paused']:.2f} s of CPU on memory "
        f"freed {pc['pause']:.0f} s before and {pc['reused']:.2f} s on memory freed just "
        f"before (medians of {pc['rounds']} tries, in this run; the virtio balloon's free "
        f"page reporting is {pc['reporting']}: memory free for a few seconds goes back to "
        "the host, and each of its pages is faulted in from the host when next used). Every "
        "run that writes through the page cache, Parquet's included, pays between the two, "
        "depending on how long before it the memory it is given was freed; that is most of "
        "what moves from one round to the next. The sink's Python workers keep the memory of "
        "the batches they have written for the next ones (glibc's trim and mmap thresholds, "
        "set once per worker), so their own page faults stay few (column *faults*). "
        f"During each of its timed runs the pafka sink put {dev('pafka sink', 'dev_mb'):,.0f} "
        f"MB on the disk, which was busy {dev('pafka sink', 'dev_busy'):.2f} s of the run's "
        f"{med['pafka sink']:.2f} s (medians), that is "
        f"{dev('pafka sink', 'dev_mb') / dev('pafka sink', 'dev_busy'):,.0f} MB/s while busy; "
        "the sink's time cannot fall below the disk's busy time by more than the part of "
        "the run before its first chunk is due. "
        f"Parquet's runs put {dev('parquet sink', 'dev_mb'):,.0f} MB there: it writes into "
        "the page cache and never syncs" + (
            ", and each run's files are deleted before the kernel's writeback would have "
            "reached them" if dev('parquet sink', 'dev_mb') < 1 else
            "; the kernel's writeback ran during some runs") + ". The fsynced Parquet row is "
        "what the same guarantee costs it. O_DIRECT (`log.file.direct.bytes`) skips the copy "
        f"into the page cache ({py_cpu('pafka sink direct'):.1f} s of CPU in the Python "
        "workers) and writes from a scratch mapping on huge pages, so a chunk reaches the "
        "device in requests of up to 4 MiB (from 4 KiB pages, at most ~1 MiB); the disk was busy "
        f"{dev('pafka sink direct', 'dev_busy'):.2f} s per run with it, against "
        f"{dev('pafka sink', 'dev_busy'):.2f} s through the page cache. It is off by "
        "default because readers of fresh data then read from the device "
        "(`bench/store_bench.py`'s read right after the write fell to 0.06× plain IPC with "
        "it). The pmem row is the product's fast tier: chunks written into a "
        "pre-allocated pool file mapped with libpmem (here on /dev/shm, so no device and no "
        "page-cache allocation; libpmem finds no PMem there, so each chunk goes in with one "
        "`pwritev` from the batches' buffers and is made durable with `pmem_msync`; on real "
        "PMem it is copied into the mapping and persisted); it shows what the sink costs "
        "when storing is a memory copy.", "",
        f"**Latency.** A producer thread in the driver process appends {lat['commits']} "
        f"batches of {lat['per_commit']} rows with `Topic.append` (durable and visible on "
        f"return; round-robin over {TOPIC_PARTITIONS} partitions), one every "
        f"{lat['interval'] * 1000:.0f} ms, to a topic that a pafka streaming query "
        "(`includeMetadata=true`, `trigger(processingTime=\"0 seconds\")`) reads into "
        "`foreachBatch`; there each micro-batch collects the first row of every append "
        "(`key % rows-per-append == 0`) with its `_timestamp`. One sample per append: "
        "**latency = wall clock when that micro-batch's `collect()` returned on the driver − "
        "`_timestamp`**, the commit time the store assigned to the append (ms precision; taken "
        "just before the commit-log entry is published, so publishing is included). The query "
        "had run idle triggers for 2 s before the producer started; other processes used "
        f"{OTHERS['latency'][0]:.2f} cores meanwhile.", "",
        "| samples | p50 | p99 | min | max | p50 / p99 from `append()` returning |",
        "|---|---|---|---|---|---|",
        f"| {lat['commits']} | {lat['p50'] * 1000:.0f} ms | {lat['p99'] * 1000:.0f} ms | "
        f"{lat['min'] * 1000:.0f} ms | {lat['max'] * 1000:.0f} ms | "
        f"{lat['return_p50'] * 1000:.0f} / {lat['return_p99'] * 1000:.0f} ms |", "",
        f"{lat['batches']} micro-batches held data; their median phase times (Spark's "
        f"`durationMs`): latestOffset {ph['latestOffset']:.0f} ms, queryPlanning "
        f"{ph['queryPlanning']:.0f} ms, addBatch (the read tasks and the collect) "
        f"{ph['addBatch']:.0f} ms, walCommit {ph['walCommit']:.0f} ms, commitOffsets "
        f"{ph['commitOffsets']:.0f} ms; whole trigger {ph['triggerExecution']:.0f} ms. An append "
        "committed while a trigger runs waits for the next trigger's latestOffset (about half a "
        "trigger on average), then for that trigger's walCommit, planning and addBatch."
        + ("" if lat["stamps_agree"] else
           " (`_timestamp` differed from `AppendResult.timestamp` for some appends.)"),
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int_range(1, 10**10), default=10_000_000,
                    help="rows written and read (1 or more; default 10,000,000)")
    ap.add_argument("--repeat", type=int_range(1, 1000), default=5,
                    help="timed runs after the warm-up (1 or more; default 5)")
    add_output_args(ap)
    ap.add_argument("--data", default=os.path.join(HERE, "data"),
                    help="where the run's data goes (a fresh spark-* directory, removed)")
    ap.add_argument("--latency-seconds", type=float_range(0.0, 86400.0, lo_open=True),
                    default=30.0, help="how long the latency producer runs (> 0; default 30)")
    ap.add_argument("--latency-interval", type=float_range(0.0, 60.0, lo_open=True),
                    default=0.05, help="seconds between the latency producer's appends "
                                       "(> 0; default 0.05)")
    ap.add_argument("--latency-rows", type=int_range(1, 10**7), default=100,
                    help="rows per append (1 or more; default 100)")
    ap.add_argument("--probe-pause", type=float_range(0.0, 600.0), default=20.0,
                    help="seconds the page-cache probe waits before writing on memory freed "
                         "that long before (default 20)")
    ap.add_argument("--keep", action="store_true", help="keep the data afterwards")
    ap.add_argument("--sinks-only", action="store_true",
                    help="run the sinks alone and print their summary (no report written)")
    args = ap.parse_args()
    if args.latency_seconds < args.latency_interval:
        ap.error(f"--latency-seconds {args.latency_seconds:g} must be at least "
                 f"--latency-interval {args.latency_interval:g}: the latency producer would "
                 "make no append")
    output = Output(args)
    t_start = time.perf_counter()
    rows = args.rows
    data = os.path.join(args.data, f"spark-{uuid.uuid4().hex[:8]}")
    os.makedirs(data)
    use_device_of(data)
    spark = make_session()
    try:
        print(f"{rows:,} rows under {data}", flush=True)
        src = generate(spark, rows)
        info = {"gen_s": timed(lambda: src.count()), "spark_parts": src.rdd.getNumPartitions()}
        print(f"  generated and cached in {info['gen_s']:.1f} s", flush=True)
        print("sinks", flush=True)
        sink = bench_sink(src, data, args.repeat, rows)
        sink["page_cache"] = probe_page_cache(data, dir_bytes(os.path.join(data, "store-0")),
                                              pause=args.probe_pause)
        pc = sink["page_cache"]
        print(f"  page cache: {pc['paused']:.2f} s of CPU on memory freed {pc['pause']:.0f} s "
              f"before, {pc['reused']:.2f} s on memory just freed", flush=True)
        if args.sinks_only:
            print(sink_summary(sink, rows))
            return
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
    body = report(args, rows, info, sink, sources, lat, time.perf_counter() - t_start)
    dump_raw({"sink": sink, "sources": sources, "latency": lat})
    output.report(MARK, body)


if __name__ == "__main__":
    main()
