"""The end-to-end demo: a burst of clicks overflows a small fast tier while the migration
service keeps the newest data there, and a second query reads and aggregates every click.

Query 1 writes a generated click stream into topic ``clicks``; query 2 reads it as it comes,
aggregates per page and records its consumer group (:func:`pafka_source.track_groups`); the
migration service runs beside them (:func:`pafka_source.start_migration`). Tier 1 is small
(:data:`TIER1_SIZE`), so the burst overflows its threshold and the oldest segments move down
to tier 2; once the producer stops, the service settles with the newest segments of every
partition on tier 1. :func:`run` returns the facts the end summary shows.

Tier 1 is a pmem tier in a per-directory folder under ``/dev/shm`` (RAM: gone at reboot)
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
from collections.abc import Callable
from typing import Any

from tier_store import InvalidArgument

log = logging.getLogger(__name__)

# Marks a store root as the demo's own, which the next run may delete.
DEMO_MARKER = "_pafka_demo"
# How long query 2 waits for query 1 to create its topic, and a stop for a micro-batch.
TOPIC_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
# Tier 1 is small on purpose: a burst of a few seconds overflows its threshold.
TIER1_SIZE = "24m"
SEGMENT_SIZE = "2m"
# After the producer stops: how long the service may take to settle, and how often it runs.
# On a loaded machine the producer's last micro-batch can hold many seconds of rows, and the
# service then has that much more to sort; it stops waiting as soon as it has settled.
SETTLE_TIMEOUT_S = 90.0
MIGRATE_INTERVAL_MS = 500


def demo_paths(cwd: str | None = None) -> tuple[str, str]:
    """The demo's store root and tier-1 directory for this working directory."""
    cwd = os.path.abspath(cwd or os.getcwd())
    root = os.path.join(cwd, "pafka-data")
    tag = hashlib.sha1(cwd.encode()).hexdigest()[:10]
    fast = f"/dev/shm/pafka-demo-{tag}" if os.path.isdir("/dev/shm") else \
        os.path.join(root, "tier-1")
    return root, fast


def store_options(root: str, fast: str) -> dict[str, str]:
    """The demo store's configuration: a small tier 1 at ``fast``, tier 2 under ``root``."""
    pmem = fast.startswith("/dev/shm")
    return {
        "log.channel.type": "tiered",
        "storage.tiers.types": "PMEM,HDD" if pmem else "NVME,HDD",
        "storage.tiers.first.paths": fast,
        "storage.tiers.first.sizes": TIER1_SIZE,
        "log.pmem.pool.ratio": "1.0",
        "log.segment.bytes": SEGMENT_SIZE,
        # A partition's active segment seals once idle this long, so it can migrate too.
        "log.segment.ms": "2000",
        "storage.migrate.interval.ms": str(MIGRATE_INTERVAL_MS),
    }


def is_demo_store(root: str) -> bool:
    """Whether ``root`` is a store this demo made (so a run may delete it): it carries
    :data:`DEMO_MARKER`."""
    return os.path.isfile(os.path.join(root, DEMO_MARKER))


def check_replaceable(root: str) -> None:
    """Raise unless the demo may delete ``root``: absent, empty, or a store it made."""
    if not os.path.lexists(root):
        return
    if os.path.isdir(root) and not os.path.islink(root) and \
            (not os.listdir(root) or is_demo_store(root)):
        return
    raise InvalidArgument(
        f"{root} exists and is not a store made by the demo (no {DEMO_MARKER} file in it), so "
        "the demo will not delete it to start afresh. Move or rename it, or run `pafka demo` "
        "from another directory (the demo's store is ./pafka-data)")


def check_run_args(seconds: float, rows_per_second: int) -> None:
    """Fail before Spark starts on arguments the queries cannot run with."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
            not math.isfinite(seconds) or seconds <= 0:
        raise InvalidArgument(f"seconds must be a number > 0, got {seconds!r}")
    if isinstance(rows_per_second, bool) or not isinstance(rows_per_second, int) or \
            rows_per_second <= 0:
        raise InvalidArgument(f"rows_per_second must be an integer > 0, got "
                              f"{rows_per_second!r}")


def wait_for_topic(root: str, name: str, query: Any, timeout: float = TOPIC_TIMEOUT_S) -> None:
    """Wait until the streaming ``query`` writing into ``root`` has created topic ``name``;
    raise naming the query's error if it failed, or after ``timeout`` seconds."""
    from tier_store import Store

    store = Store.open(root, create=False)
    deadline = time.monotonic() + timeout
    while name not in store.topics():
        error = query.exception()
        if error is not None:
            raise InvalidArgument(f"the query writing topic {name!r} failed before creating it: "
                                  f"{error}")
        if not query.isActive:
            raise InvalidArgument(f"the query writing topic {name!r} stopped before creating it")
        if time.monotonic() > deadline:
            raise InvalidArgument(f"topic {name!r} did not appear in {root} within {timeout:g} s "
                                  f"of starting the query that writes it; its status: "
                                  f"{query.status}")
        time.sleep(0.2)


def _stop_between_batches(query: Any, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop ``query`` just after a micro-batch ends, so that no batch is cut short (an idle
    check alone can fall in the instant before the next trigger starts, and Spark then
    aborts that batch); after the second batch that ends, or ``timeout`` seconds, stop it
    anyway (Spark re-runs a cut batch)."""
    def batch_id() -> int:
        p = query.lastProgress
        return -1 if p is None else int(p["batchId"])

    last = batch_id()
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        done = batch_id()
        # Behind schedule (a loaded machine) batches run back to back, never idle between:
        # then stop after the next one, so the burst overshoots by two batches at most.
        if done > last + 1 or (done > last and not query.status["isTriggerActive"]):
            break
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


Say = Callable[[str], None]


def run(seconds: float = 10.0, rows_per_second: int = 60_000,
        say: Say | None = None) -> dict[str, Any]:
    """Run the demo and return its facts; ``say`` is called with each line of its story."""
    from tier_store import Store

    check_run_args(seconds, rows_per_second)
    root, fast = demo_paths()
    check_replaceable(root)
    for d in (root, fast):
        shutil.rmtree(d, ignore_errors=True)
    opts = store_options(root, fast)
    Store.open(root, opts, create=True)  # creates the store, pre-allocates the pmem pool
    with open(os.path.join(root, DEMO_MARKER), "w") as f:
        f.write("made by `pafka demo`, which deletes and recreates this store on each run\n")
    spark = spark_session()
    try:
        return _queries(spark, root, fast, seconds, rows_per_second, say or log.info)
    finally:
        spark.stop()


def _tiers(store: Any) -> list[dict[str, Any]]:
    return [{k: u[k] for k in ("tier", "type", "path", "capacity", "used", "segments",
                               "pool_files", "pool_free") if k in u}
            for u in store.tier_usage()]


def _fill(u: dict[str, Any]) -> str:
    """How full a tier is as the migration sees it: a PMEM tier's pool files in use (a
    segment takes a whole file), else bytes of its capacity."""
    if "pool_files" in u:
        taken = u["pool_files"] - u["pool_free"]
        return f"{taken:>2}/{u['pool_files']} files"
    return f"{u['used'] / max(1, u['capacity']):>8.0%}"


def _lag(topic: Any, group: str) -> int:
    done = topic.positions().get(group, {})
    return sum(max(0, o - done.get(p, 0)) for p, o in topic.latest_offsets().items())


def freshness_violations(topic: Any) -> list[str]:
    """Sealed segments on a slower tier holding offsets above a sealed one on a faster tier
    of the same partition (the order the migration keeps); empty when it holds."""
    from .tier_figures import order_violations, topic_segments
    return order_violations(topic_segments(topic))


def _queries(spark: Any, root: str, fast: str, seconds: float, rows_per_second: int,
             say: Say) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from tier_store import Store

    from . import start_migration, track_groups

    ckpt = os.path.join(root, "_checkpoints")
    store = Store.open(root, create=False)
    before = _tiers(store)
    t1 = store.tier(1)
    say(f"The store lives in {root}, with no broker to run.")
    say(f"  tier 1  {t1.type:5s} {_size(t1.capacity)} in {t1.path}: fast and small "
        "(RAM stands in for PMem here)")
    say(f"  tier 2  {store.tier(2).type:5s} unbounded, in {store.tier(2).path}: big and slow")
    threshold = store.config["storage.migrate.threshold"]
    pool = (f" ({t1.pool_size} pool files of {_size(t1.segment_bytes)}; a segment takes "
            "a whole file)" if t1.free_pool_files() is not None else "")
    say(f"The migration service keeps tier 1 at most {threshold:.0%} full{pool} with the "
        "newest segments, and runs beside the queries.")
    service = start_migration(spark, root)
    track_groups(spark)

    # Query 1: a generated click stream into topic "clicks", partitioned by user: a fixed
    # number of clicks per one-second trigger (a "rate" source would catch up on the time
    # Spark took to start with one huge first batch).
    # The burst is exactly ``total`` clicks: later batches of the source are left empty.
    total = max(1, round(rows_per_second * seconds))
    clicks = (spark.readStream.format("rate-micro-batch")
              .option("rowsPerBatch", rows_per_second).load()
              .where(F.col("value") < total)
              .select((F.col("value") % 1000).alias("user"),
                      F.concat(F.lit("/page/"), (F.col("value") % 37).cast("string")).alias("url"),
                      F.col("timestamp").alias("ts"),
                      (F.col("value") % 100).cast("double").alias("amount")))
    producer = (clicks.writeStream.format("pafka").option("topic", "clicks")
                .option("key", "user").option("partitions", 4).option("timestampColumn", "ts")
                .option("checkpointLocation", os.path.join(ckpt, "producer"))
                .trigger(processingTime="1 second").start(root))

    # Query 2: read the topic as it comes, transform and aggregate per page.
    wait_for_topic(root, "clicks", producer)
    group = "per-page"
    per_page = (spark.readStream.format("pafka").option("topic", "clicks")
                .option("startingOffsets", "earliest").option("consumerGroup", group)
                .load(root)
                .where(F.col("amount") >= 0)
                .groupBy("url").agg(F.count("*").alias("clicks"),
                                    F.sum("amount").alias("amount"),
                                    F.approx_count_distinct("user").alias("users")))
    consumer = (per_page.writeStream.format("memory").queryName("per_page")
                .outputMode("complete").trigger(processingTime="1 second").start())
    topic = store.topic("clicks")

    def line(label: str) -> None:
        topic.refresh()
        u = {x["tier"]: x for x in _tiers(store)}
        say(f"  {label:>6s}  {sum(topic.latest_offsets().values()):>10,}  "
            f"{_size(u[1]['used']):>9s} {_fill(u[1])}  "
            f"{_size(u[2]['used']):>9s}  {service.stats.segments_down:>4} down "
            f"{service.stats.segments_up:>3} up  {_lag(topic, group):>9,}")

    say(f"1. A burst: query 1 writes {total:,} clicks, {rows_per_second:,} per one-second "
        "trigger, into topic 'clicks' (4 partitions, by user); query 2 reads them as they "
        "come.")
    say("      time     written            tier 1        tier 2     migrated        lag")
    while not sum(topic.refresh().latest_offsets().values()):  # Spark's first batch
        if not producer.isActive:
            raise InvalidArgument(f"query 1 stopped before writing: {producer.exception()}")
        time.sleep(0.1)
    start = time.monotonic()
    deadline = start + 10 * seconds + TOPIC_TIMEOUT_S  # a loaded machine runs batches late
    while sum(topic.refresh().latest_offsets().values()) < total and producer.isActive \
            and time.monotonic() < deadline:
        time.sleep(2.0)
        line(f"{time.monotonic() - start:.0f} s")
    _stop_between_batches(producer)
    written = sum(topic.refresh().latest_offsets().values())

    say("2. The producer stops. Query 2 catches up; idle segments seal, and the service "
        "settles the tiers.")
    deadline = time.time() + 120
    counted = 0
    while time.time() < deadline:
        consumer.processAllAvailable()
        counted = spark.sql("select coalesce(sum(clicks), 0) from per_page").first()[0]
        if counted >= written:
            break
        time.sleep(0.5)
    consumer.stop()
    settled = _settle(service, topic, say)
    line("after")
    top = spark.sql("select url, clicks, amount, users from per_page order by clicks desc, url "
                    "limit 5").collect()
    service.stop()
    topic.refresh()
    lag_deadline = time.monotonic() + 10  # the listener records the last batch asynchronously
    while _lag(topic, group) and time.monotonic() < lag_deadline:
        time.sleep(0.2)
    after = _tiers(store)
    segs = topic.segments()
    return {
        "root": root, "tier1": fast, "announced": total, "written": written,
        "counted": counted,
        "group": group, "lag": _lag(topic, group), "positions": topic.positions(),
        "latest_offsets": topic.latest_offsets(),
        "moved_down": service.stats.segments_down, "moved_up": service.stats.segments_up,
        "bytes_down": service.stats.bytes_down, "bytes_up": service.stats.bytes_up,
        "migration_runs": service.stats.runs, "settled": settled,
        "order_violations": freshness_violations(topic),
        "segments": {n: sum(1 for s in segs if s.tier == n) for n in (1, 2)},
        "tiers_before": before, "tiers_after": after,
        "top": [r.asDict() for r in top],
    }


def _settle(service: Any, topic: Any, say: Say) -> bool:
    """Wait until the service has run twice in a row with nothing to move (or time out)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S

    def counts() -> tuple[int, int, int]:
        s = service.stats
        return s.segments_down, s.segments_up, s.failed_moves

    last = counts()
    quiet_since = service.stats.runs
    while time.monotonic() < deadline:
        time.sleep(MIGRATE_INTERVAL_MS / 1000)
        now = counts()
        sealed = all(s.sealed for s in topic.refresh().segments())
        if now != last or not sealed:
            last, quiet_since = now, service.stats.runs
        elif service.stats.runs - quiet_since >= 2:
            return True
    say(f"  (the service had not settled after {SETTLE_TIMEOUT_S:g} s)")
    return False


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
