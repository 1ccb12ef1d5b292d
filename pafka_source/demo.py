"""The end-to-end demo: one streaming query writes a generated click stream into a topic,
another reads it, transforms and aggregates it, on an embedded store under ./pafka-data.

Tier 1 is a pmem tier in a per-checkout directory under ``/dev/shm`` (RAM: gone at reboot)
when it exists, tier 2 a disk tier under ``./pafka-data``. The store is recreated each run,
but only a store the demo made is ever deleted: the demo marks its store with a file
(:data:`DEMO_MARKER`), and refuses to replace a ``./pafka-data`` that is anything else.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import shutil
import sys
import time
from typing import Any

from tier_store import PafkaError
from tier_store.config import parse_config
from tier_store.layout import STORE_FILE, STORE_LOCK, TIERS_LOCK
from tier_store.saved import read_saved

log = logging.getLogger(__name__)

# Marks a store root as the demo's own, which the next run may delete.
DEMO_MARKER = "_pafka_demo"
# What a demo store's root may hold (stores from before the marker are recognised by it).
_DEMO_ENTRIES = {STORE_FILE, STORE_LOCK, TIERS_LOCK, DEMO_MARKER, "_migration.json",
                 "_checkpoints", "clicks", "tier-1", "tier-2"}
# How long query 2 waits for query 1 to create its topic, and a stop for a micro-batch.
TOPIC_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def demo_paths(cwd: str | None = None) -> tuple[str, str]:
    """The demo's store root and tier-1 directory for this working directory."""
    cwd = os.path.abspath(cwd or os.getcwd())
    root = os.path.join(cwd, "pafka-data")
    tag = hashlib.sha1(cwd.encode()).hexdigest()[:10]
    fast = f"/dev/shm/pafka-demo-{tag}" if os.path.isdir("/dev/shm") else \
        os.path.join(root, "tier-1")
    return root, fast


def store_options(root: str, fast: str) -> dict[str, str]:
    pmem = fast.startswith("/dev/shm")
    return {
        "log.channel.type": "tiered",
        "storage.tiers.types": "PMEM,HDD" if pmem else "NVME,HDD",
        "storage.tiers.first.paths": fast,
        "storage.tiers.first.sizes": "256m",
        "log.segment.bytes": "16m",
    }


def is_demo_store(root: str, fast: str) -> bool:
    """Whether ``root`` is a store this demo made (so a run may delete it): it carries
    :data:`DEMO_MARKER`, or, made before the marker existed, was created with the demo's
    options and holds nothing but what the demo writes."""
    if os.path.isfile(os.path.join(root, DEMO_MARKER)):
        return True
    try:
        saved = read_saved(root)
        entries = set(os.listdir(root))
    except (OSError, PafkaError):
        return False
    demo = {k: list(v) if isinstance(v, tuple) else v
            for k, v in parse_config(store_options(root, fast)).items()}
    return saved is not None and saved["config"] == demo and entries <= _DEMO_ENTRIES


def check_replaceable(root: str, fast: str) -> None:
    """Raise unless the demo may delete ``root``: absent, empty, or a store it made."""
    if not os.path.lexists(root):
        return
    if os.path.isdir(root) and not os.path.islink(root) and \
            (not os.listdir(root) or is_demo_store(root, fast)):
        return
    raise PafkaError(
        f"{root} exists and is not a store made by the demo (no {DEMO_MARKER} file in it), so "
        "the demo will not delete it to start afresh. Move or rename it, or run `pafka demo` "
        "from another directory (the demo's store is ./pafka-data)")


def check_run_args(seconds: float, rows_per_second: int) -> None:
    """Fail before Spark starts on arguments the queries cannot run with."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
            not math.isfinite(seconds) or seconds <= 0:
        raise PafkaError(f"seconds must be a number > 0, got {seconds!r}")
    if isinstance(rows_per_second, bool) or not isinstance(rows_per_second, int) or \
            rows_per_second <= 0:
        raise PafkaError(f"rows_per_second must be an integer > 0, got {rows_per_second!r}")


def wait_for_topic(root: str, name: str, query: Any, timeout: float = TOPIC_TIMEOUT_S) -> None:
    """Wait until the streaming ``query`` writing into ``root`` has created topic ``name``;
    raise naming the query's error if it failed, or after ``timeout`` seconds."""
    from tier_store import Store

    store = Store.open(root)
    deadline = time.monotonic() + timeout
    while name not in store.topics():
        error = query.exception()
        if error is not None:
            raise PafkaError(f"the query writing topic {name!r} failed before creating it: "
                             f"{error}")
        if not query.isActive:
            raise PafkaError(f"the query writing topic {name!r} stopped before creating it")
        if time.monotonic() > deadline:
            raise PafkaError(f"topic {name!r} did not appear in {root} within {timeout:g} s "
                             f"of starting the query that writes it; its status: "
                             f"{query.status}")
        time.sleep(0.2)


def _stop_between_batches(query: Any, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop ``query`` just after a micro-batch ends, so that no batch is cut short (an idle
    check alone can fall in the instant before the next trigger starts, and Spark then
    aborts that batch); after ``timeout`` seconds of batches, stop it anyway (Spark re-runs
    a cut batch)."""
    def batch_id() -> int:
        p = query.lastProgress
        return -1 if p is None else int(p["batchId"])

    last = batch_id()
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline and \
            (batch_id() == last or query.status["isTriggerActive"]):
        time.sleep(0.02)
    query.stop()


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from . import SPARK_CONF
    spark = (SparkSession.builder.master("local[2]").appName("pafka-demo")
             .config(map=SPARK_CONF)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(seconds: float = 12.0, rows_per_second: int = 50_000) -> dict[str, Any]:
    """Run both queries and return a summary."""
    from tier_store import Store

    check_run_args(seconds, rows_per_second)
    root, fast = demo_paths()
    check_replaceable(root, fast)
    for d in (root, fast):
        shutil.rmtree(d, ignore_errors=True)
    opts = store_options(root, fast)
    Store.open(root, opts)  # creates the store and pre-allocates the pmem pool
    with open(os.path.join(root, DEMO_MARKER), "w") as f:
        f.write("made by `pafka demo`, which deletes and recreates this store on each run\n")
    spark = spark_session()
    try:
        return _queries(spark, root, fast, seconds, rows_per_second)
    finally:
        spark.stop()


def _queries(spark: Any, root: str, fast: str, seconds: float,
             rows_per_second: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from tier_store import Store

    ckpt = os.path.join(root, "_checkpoints")

    # Query 1: a generated click stream into topic "clicks", partitioned by user.
    clicks = (spark.readStream.format("rate").option("rowsPerSecond", rows_per_second).load()
              .select((F.col("value") % 1000).alias("user"),
                      F.concat(F.lit("/page/"), (F.col("value") % 37).cast("string")).alias("url"),
                      F.col("timestamp").alias("ts"),
                      (F.col("value") % 100).cast("double").alias("amount")))
    producer = (clicks.writeStream.format("pafka").option("topic", "clicks")
                .option("key", "user").option("partitions", 4).option("timestampColumn", "ts")
                .option("checkpointLocation", os.path.join(ckpt, "producer"))
                .trigger(processingTime="1 second").start(root))

    # Query 2: read the topic back, transform and aggregate per page.
    wait_for_topic(root, "clicks", producer)
    per_page = (spark.readStream.format("pafka").option("topic", "clicks")
                .option("startingOffsets", "earliest").option("consumerGroup", "per-page")
                .load(root)
                .where(F.col("amount") >= 0)
                .groupBy("url").agg(F.count("*").alias("clicks"),
                                    F.sum("amount").alias("amount"),
                                    F.approx_count_distinct("user").alias("users")))
    consumer = (per_page.writeStream.format("memory").queryName("per_page")
                .outputMode("complete").trigger(processingTime="1 second").start())
    time.sleep(seconds)
    _stop_between_batches(producer)
    topic = Store.open(root).topic("clicks")
    written = sum(topic.latest_offsets().values())
    deadline = time.time() + 120
    counted = 0
    while time.time() < deadline:
        consumer.processAllAvailable()
        counted = spark.sql("select coalesce(sum(clicks), 0) from per_page").first()[0]
        if counted >= written:
            break
        time.sleep(0.5)
    consumer.stop()
    top = spark.sql("select url, clicks, amount, users from per_page order by clicks desc, url "
                    "limit 5").collect()
    store = Store.open(root)
    return {
        "root": root, "tier1": fast, "written": written, "counted": counted,
        "latest_offsets": topic.latest_offsets(), "positions": topic.positions(),
        "top": [r.asDict() for r in top], "tiers": store.tier_usage(),
        "segments": len(topic.segments()),
    }
