"""The end-to-end demo: one streaming query writes a generated click stream into a topic,
another reads it, transforms and aggregates it, on an embedded store under ./pafka-data.

Tier 1 is a pmem tier in a per-checkout directory under ``/dev/shm`` (RAM: gone at reboot)
when it exists, tier 2 a disk tier under ``./pafka-data``. The store is recreated each run.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import time
from typing import Any

log = logging.getLogger(__name__)


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


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("pafka-demo")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(seconds: float = 12.0, rows_per_second: int = 50_000) -> dict[str, Any]:
    """Run both queries and return a summary."""
    from pyspark.sql import functions as F

    from tier_store import Store

    root, fast = demo_paths()
    for d in (root, fast):
        shutil.rmtree(d, ignore_errors=True)
    opts = store_options(root, fast)
    Store.open(root, opts)  # creates the store and pre-allocates the pmem pool
    spark = spark_session()
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
    while "clicks" not in Store.open(root).topics():
        time.sleep(0.2)
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
    # Stop between two micro-batches, so that no batch is cut short.
    while producer.status["isTriggerActive"]:
        time.sleep(0.02)
    producer.stop()
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
    summary = {
        "root": root, "tier1": fast, "written": written, "counted": counted,
        "latest_offsets": topic.latest_offsets(), "positions": topic.positions(),
        "top": [r.asDict() for r in top], "tiers": store.tier_usage(),
        "segments": len(topic.segments()),
    }
    spark.stop()
    return summary
