"""The Spark processes of ``bench/soak.py``: a streaming writer and a streaming reader.

    .venv/bin/python bench/soak_roles.py writer ROOT WORKDIR --rows-per-batch N
    .venv/bin/python bench/soak_roles.py reader ROOT WORKDIR

Each runs one ``local[2]`` SparkSession until the file ``WORKDIR/stop-<role>`` appears.

* writer: Spark's ``rate-micro-batch`` source (batch ``b`` holds the ids ``[b·N, (b+1)·N)``,
  whatever the wall clock, so a replayed batch has the same rows) → ``id`` and a payload
  derived from it (:data:`PAYLOAD_SQL`) → ``writeStream.format("pafka")`` into the topic the
  driver created (:data:`TOPIC_SCHEMA`), with a checkpoint
  in ``WORKDIR/writer-ckpt``. The driver SIGKILLs it and starts it again on the same
  checkpoint: the sink's idempotent commits keep each batch exactly once. Spark keeps every
  batch's offset file (``minBatchesToRetain``), which the driver's check reads. On the stop
  file it waits for the micro-batch in flight to end, then stops.
* reader: ``readStream.format("pafka")`` from the earliest offsets, ``failOnDataLoss=false``
  (retention deletes segments), with the record's metadata → Parquet in ``WORKDIR/read``
  (Spark's file sink, exactly once). Each micro-batch's row count goes to
  ``WORKDIR/reader-progress.jsonl``. On the stop file it stops the query, drains what the
  topic holds with ``Trigger.AvailableNow`` on the same checkpoint, and writes everything it
  read, as Spark's file sink commits it, to ``WORKDIR/read.arrow``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import bench_common  # noqa: E402, F401  (PAFKA_BENCH_CODE: the library code under test)
import pyarrow as pa  # noqa: E402

log = logging.getLogger("soak")

TOPIC = "soak"
PARTITIONS = 4
#: What the sink would create the topic with from the writer's rows.
TOPIC_SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False),
                          pa.field("payload", pa.string())])
# 64 hex digits of SHA-256 of the id, then the id itself: every payload differs, and a row whose
# payload does not belong to its id is a wrong row.
PAYLOAD_SQL = "concat(sha2(cast({id} AS string), 256), ':', cast({id} AS string))"


def payload(i: int) -> str:
    """The payload the writer stores with id ``i`` (:data:`PAYLOAD_SQL` in Python)."""
    import hashlib
    return f"{hashlib.sha256(str(i).encode()).hexdigest()}:{i}"


def session(app: str):
    from pyspark.sql import SparkSession

    from pafka_source import SPARK_CONF, register
    spark = (SparkSession.builder.master("local[2]").appName(app)
             .config(map=SPARK_CONF)
             .config("spark.driver.memory", "2g")  # the reader collects its output at the end
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             # Every batch's offsets and commit files stay: the check maps ids to batches.
             .config("spark.sql.streaming.minBatchesToRetain", str(10**7))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # not left to discovery: an import error then surfaces here
    return spark


def wait_for_stop(q, stop: str, progress: str | None = None) -> None:
    """Until ``stop`` exists (or the query fails): poll, logging each new micro-batch's row
    count to ``progress`` as a JSON line."""
    seen = -1
    out = open(progress, "a") if progress else None  # noqa: SIM115  (closed below)
    try:
        while not os.path.exists(stop):
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
            if not q.isActive:
                raise SystemExit("query stopped on its own")
            for p in q.recentProgress:
                if out is not None and p["batchId"] > seen:
                    seen = p["batchId"]
                    out.write(json.dumps({"t": time.time(), "batch": seen,
                                          "rows": p["numInputRows"]}) + "\n")
                    out.flush()
            time.sleep(0.5)
    finally:
        if out is not None:
            out.close()


def writer(root: str, work: str, rows_per_batch: int, trigger: str) -> None:
    spark = session("pafka-soak-writer")
    src = (spark.readStream.format("rate-micro-batch")
           .option("rowsPerBatch", rows_per_batch).option("numPartitions", 2).load())
    rows = src.selectExpr("value AS id", PAYLOAD_SQL.format(id="value") + " AS payload")
    q = (rows.writeStream.format("pafka").option("topic", TOPIC)
         .option("partitions", PARTITIONS)
         .option("checkpointLocation", os.path.join(work, "writer-ckpt"))
         .trigger(processingTime=trigger).start(root))
    wait_for_stop(q, os.path.join(work, "stop-writer"))
    # Stop between micro-batches, so that the last batch Spark planned is also committed.
    t0 = time.time()
    while q.status["isTriggerActive"] and time.time() - t0 < 10:
        time.sleep(0.02)
    q.stop()
    spark.stop()


def reader(root: str, work: str, trigger: str) -> None:
    spark = session("pafka-soak-reader")
    out, ckpt = os.path.join(work, "read"), os.path.join(work, "reader-ckpt")

    def query(**trig):
        df = (spark.readStream.format("pafka").option("topic", TOPIC)
              .option("startingOffsets", "earliest").option("failOnDataLoss", "false")
              .option("includeMetadata", "true").load(root))
        checked = df.selectExpr("id", "_partition", "_offset", "_timestamp",
                                f"payload = {PAYLOAD_SQL.format(id='id')} AS ok")
        return (checked.writeStream.format("parquet").option("path", out)
                .option("checkpointLocation", ckpt).trigger(**trig).start())

    q = query(processingTime=trigger)
    wait_for_stop(q, os.path.join(work, "stop-reader"), os.path.join(work,
                                                                     "reader-progress.jsonl"))
    q.stop()
    drain = query(availableNow=True)
    drain.awaitTermination()
    drained = sum(p["numInputRows"] for p in drain.recentProgress)
    with open(os.path.join(work, "reader-progress.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.time(), "batch": -1, "rows": drained}) + "\n")
    table = spark.read.parquet(out).toArrow()
    tmp = os.path.join(work, "read.arrow.tmp")
    with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    os.replace(tmp, os.path.join(work, "read.arrow"))
    spark.stop()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=["writer", "reader"])
    ap.add_argument("root")
    ap.add_argument("work")
    ap.add_argument("--rows-per-batch", type=int, default=2000)
    ap.add_argument("--trigger", default="1 second")
    a = ap.parse_args()
    if a.role == "writer":
        writer(a.root, a.work, a.rows_per_batch, a.trigger)
    else:
        reader(a.root, a.work, a.trigger)


if __name__ == "__main__":
    main()
