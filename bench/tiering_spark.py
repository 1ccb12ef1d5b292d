"""Tiering through Spark: a burst written by the pafka sink into a tiered store, against a
store on the (simulated) HDD alone.

    .venv/bin/python bench/tiering_spark.py [--rows 3000000] [--write-results] [--out DIR]

The burst scenario of ``bench/tiering_bench.py`` with Spark as the producer: tier 1 is a pmem
tier on /dev/shm prefilled to its threshold (Pafka's balanced state), tier 2 a file tier on
disk throttled to an HDD's bandwidth. The throttle is the benchmark's token bucket, installed
with the tier store's hook ``tier_store.throttle_tier_writes`` in Spark's Python workers through
``bench/spark_site/sitecustomize.py`` (Spark passes ``PYTHONPATH`` on to them) and in this
driver, where ``pafka_source.start_migration`` runs the migration service beside the query.
The two stores' HDD tiers have different numbers (2 beside pmem, 1 alone): before each store
is written the driver names its file tiers in the bucket's selection file, which every process
follows. Each round writes the same cached DataFrame with
``df.write.format("pafka")`` to a fresh tiered store and to a fresh HDD-only store, reads the
burst back with ``spark.read.format("pafka")`` (every row, exactly once) after, for the tiered
store, waiting until the migration has brought tier 1 back under its threshold (so the read
finds the burst partly on tier 2). The stores run at the default ``log.cleanup.grace.ms``.

The report is printed; ``--write-results`` rewrites this script's section of
``bench/RESULTS.md``, ``--out DIR`` writes it to ``DIR/RESULTS.md``. A round that reads back
other than every row of the burst, or a degenerate measurement, stops the run (non-zero).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
MB = 1_000_000

from bench_common import (  # noqa: E402
    Output,
    add_output_args,
    fail,
    float_range,
    int_range,
    positive,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int_range(1, 10**10), default=3_000_000,
                    help="rows in the burst (1 or more; default 3,000,000)")
    ap.add_argument("--repeat", type=int_range(1, 100), default=3,
                    help="timed rounds after the warm-up (1 or more; default 3)")
    ap.add_argument("--tier1", type=int_range(16, 1 << 20), default=1024, metavar="MIB",
                    help="tier-1 capacity in MiB (16 or more; default 1024)")
    ap.add_argument("--hdd", type=float_range(1e5, 1e10), default=80 * MB,
                    metavar="BYTES/S", help="simulated tier-2 bandwidth in bytes/s "
                                            "(default 80e6)")
    add_output_args(ap)
    args = ap.parse_args()
    output = Output(args)

    from tiering_bench import (
        chunk_rows,
        hdd_tiers,
        install_throttle,
        prefill_topic,
        segment_bytes,
        select_hdd_tiers,
        store_conf,
    )

    base = os.path.join(HERE, "data", f"tiering-spark-{uuid.uuid4().hex[:6]}")
    os.makedirs(base)
    bucket = os.path.join(base, "hdd-bucket")
    # Every tier number that is the HDD in one of the stores: the selection file says which
    # is being written.
    candidates = sorted({n for tiered in (True, False) for n in store_conf(tiered, "", {})[1]})
    # Before Spark starts: its JVM and Python workers inherit this environment.
    os.environ["PAFKA_BENCH_HDD"] = f"{bucket}:{args.hdd}:{','.join(map(str, candidates))}"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(HERE, "spark_site"), ROOT, os.environ.get("PYTHONPATH")) if p)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    import spark_bench

    import pafka_source
    from tier_store import Store
    # The migration thread (and the prefill) run in this process.
    install_throttle(bucket, args.hdd, candidates, follow_selection=True)

    spark = spark_bench.make_session()
    shm_dirs: list[str] = []
    try:
        df = spark_bench.generate(spark, args.rows)
        df.count()
        c1 = args.tier1 * 1024 * 1024
        seg = segment_bytes(c1)  # 32 MiB unless tier 1 is under 512 MiB
        threshold = 0.5
        results: dict[str, list[dict]] = {"tiered": [], "hdd": []}
        for rnd in range(args.repeat + 1):  # round 0 warms up
            for mode in ("tiered", "hdd"):
                root = os.path.join(base, f"{mode}-{rnd}")
                fast = f"/dev/shm/pafka-tier1-{uuid.uuid4().hex[:6]}"
                shm_dirs.append(fast)
                # log.cleanup.grace.ms stays at its default (10 minutes): a Spark write commits
                # its chunks when all its tasks are done, and chunks younger than the grace
                # period are not abandoned, so their segments do not move under the write.
                conf, _ = store_conf(mode == "tiered", fast, {
                    "storage.tiers.first.sizes": str(c1), "storage.migrate.threshold": threshold,
                    "log.segment.bytes": str(seg)})
                store = Store.open(root, conf)
                select_hdd_tiers(bucket, hdd_tiers(store))
                topic = store.create_topic("bench", spark_bench.topic_schema(), partitions=4)
                prefill_topic(topic, int(threshold * c1), chunk_rows(seg))
                start = {str(p): o for p, o in topic.latest_offsets().items()}
                service = pafka_source.start_migration(spark, root) if mode == "tiered" else None
                spark_bench.wait_quiet(0.25)
                t0 = time.time()
                df.write.format("pafka").option("topic", "bench").mode("append").save(root)
                write_s = time.time() - t0
                after = Store.open(root).tier_usage()
                drain_s = None
                if service is not None:
                    t0 = time.time()
                    while time.time() - t0 < 120:
                        if Store.open(root).tier_usage()[0]["used"] <= threshold * c1:
                            drain_s = time.time() - t0
                            break
                        time.sleep(0.05)
                    service.stop()
                t0 = time.time()
                got = (spark.read.format("pafka").option("topic", "bench")
                       .option("startingOffsets", json.dumps({"bench": start})).load(root)
                       .agg({"key": "count"}).collect()[0][0])
                read_s = time.time() - t0
                burst_bytes = sum(u["used"] for u in after) - int(threshold * c1)
                r = {"write_s": write_s, "read_s": read_s, "rows": got, "drain_s": drain_s,
                     "usage": after, "bytes": burst_bytes}
                print(f"round {rnd} {mode}: write {write_s:.2f} s, read {read_s:.2f} s, rows {got}"
                      f", tiers {[u['used'] // MB for u in after]} MB, drained after {drain_s}",
                      flush=True)
                if got != args.rows:
                    raise fail(f"{mode}: read {got} rows of the burst, wrote {args.rows}")
                positive(r["bytes"], f"{mode}, round {rnd}: bytes the burst added to the store")
                if rnd:
                    results[mode].append(r)
                shutil.rmtree(root, ignore_errors=True)
                shutil.rmtree(fast, ignore_errors=True)
    finally:
        spark.stop()
        shutil.rmtree(base, ignore_errors=True)
        for d in shm_dirs:
            shutil.rmtree(d, ignore_errors=True)
    output.report("tiering-spark", report(args, results, c1, threshold))


def report(args: argparse.Namespace, results: dict, c1: int, threshold: float) -> str:
    def med(mode: str, key: str) -> float:
        return positive(statistics.median(r[key] for r in results[mode]),
                        f"{mode}: median {key}")

    burst_mb = med("tiered", "bytes") / MB
    wt, wh = med("tiered", "write_s"), med("hdd", "write_s")
    rt, rh = med("tiered", "read_s"), med("hdd", "read_s")
    drains = [r["drain_s"] for r in results["tiered"] if r["drain_s"] is not None]
    drain = (f"{statistics.median(drains):.1f} s" + (
        "" if len(drains) == len(results["tiered"]) else
        f" ({len(results['tiered']) - len(drains)} of {len(results['tiered'])} rounds never "
        "within 120 s)")) if drains else "never within 120 s"
    expect = burst_mb / (args.hdd / MB)
    cmd = ".venv/bin/python bench/tiering_spark.py" + "".join(
        f" --{flag} {value:g}" if isinstance(value, float) else f" --{flag} {value}"
        for flag, value, default in (("rows", args.rows, 3_000_000), ("repeat", args.repeat, 3),
                                     ("tier1", args.tier1, 1024), ("hdd", args.hdd, 80 * MB))
        if value != default)
    lines = [
        "## Tiering through Spark (`bench/tiering_spark.py`): a burst written by the pafka "
        "sink", "",
        f"Command: `{cmd}` — one `local[2]` SparkSession "
        "with `pafka_source.SPARK_CONF` (the session of `bench/spark_bench.py`); "
        f"{args.rows:,} rows (the rows of `bench/spark_bench.py`) ≈ {burst_mb:,.0f} MB as "
        "stored, cached, written with `df.write.format(\"pafka\")` into a topic of 4 "
        f"partitions. Tiered: pmem tier on /dev/shm of {args.tier1} MiB prefilled to its "
        f"threshold ({threshold}), so the burst fits in the reserved half, with "
        "`pafka_source.start_migration` draining it in the driver; HDD only: the same topic "
        "on a file tier alone. Tier 2 (and the HDD-only store) is the disk **throttled to "
        f"{args.hdd / MB:.0f} MB/s, a simulation of an HDD** shared by Spark's Python workers "
        "and the migration thread. Medians of "
        f"{len(results['tiered'])} rounds after a warm-up, peers back to back.", "",
        "| burst through Spark | tiered | HDD only | ratio |", "|---|---|---|---|",
        f"| `df.write.format(\"pafka\")` | {wt:.2f} s = {burst_mb / wt:.0f} MB/s | {wh:.2f} s "
        f"= {burst_mb / wh:.0f} MB/s | {wh / wt:.2f}× |",
        f"| `spark.read.format(\"pafka\")` of the burst → count | {rt:.2f} s | {rh:.2f} s | "
        f"{rh / rt:.2f}× |",
        f"| tier 1 back under its threshold, from the write's end | {drain} | — | "
        f"at most burst ÷ tier-2 bandwidth = {expect:.1f} s (moves start during the write) |",
        "",
        "`log.cleanup.grace.ms` is at its default (10 minutes), as in "
        "`bench/tiering_bench.py`: readers pin the pool files they map, so a pool file "
        "freed by a move returns to the pool at once, not after the grace period. A Spark "
        "write commits its chunks only when all its tasks are done, and chunks older than "
        "the grace period count as abandoned: with a grace period shorter than a write the "
        "migration may move a segment under it, and the write's commit then fails with "
        "`CommitConflict` (\"write the batch again\") — as the configuration key says, it "
        "must be longer than any batch.", "",
        "The tiered ingest is bounded by the sink's own work on this machine's two cores "
        "(Spark's transfer to Python and the writes), not by tier 1; the HDD-only store by "
        "the simulated disk. Reads are not throttled (the files are in the page cache either "
        "way), so they cost the same on both.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
