"""Spark jobs on the simulated hosts' cluster that write and read a shared pafka store
(targets of ``tests/cluster_job.py``; each returns a JSON value).

Each takes the store's root and its configuration as JSON, passed as options of the
``pafka`` format as a user would. Read counts come from ``$PAFKA_READ_STATS`` (set for the
executors), one JSON line per Spark partition read: which host read it, and how many chunks
it found on that host's tier 1 and how many it read from the shared tier.
"""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any


def _stats(where: str) -> dict[str, Any]:
    lines = []
    for name in glob.glob(os.path.join(where, "*.jsonl")):
        with open(name) as f:
            lines += [json.loads(x) for x in f if x.strip()]
    out: dict[str, Any] = {"hosts": sorted({x["host"] for x in lines})}
    for k in ("local_chunks", "local_bytes", "remote_chunks", "remote_bytes"):
        out[k] = sum(x[k] for x in lines)
    return out


def _read(spark, root: str, conf: dict[str, str], topic: str) -> tuple[int, int]:
    # Several Spark partitions, so that both executors read.
    df = (spark.read.format("pafka").options(**conf).option("topic", topic)
          .option("minPartitions", "8").load(root))
    row = df.selectExpr("count(*) AS n", "coalesce(sum(id), 0) AS s").collect()[0]
    return int(row["n"]), int(row["s"])


def write(spark, root: str, conf_json: str, topic: str, n: str, partitions: str = "4") -> dict:
    """A batch write of rows ``id`` 0..n-1 (``v`` = 2 id), keyed by ``id``."""
    conf = json.loads(conf_json)
    t0 = time.perf_counter()
    (spark.range(0, int(n), numPartitions=int(partitions)).selectExpr("id", "id * 2 AS v")
     .write.format("pafka").options(**conf).option("topic", topic).option("key", "id")
     .option("partitions", "4").mode("append").save(root))
    return {"seconds": time.perf_counter() - t0}


def stream_copy(spark, root: str, conf_json: str, source: str, target: str,
                checkpoint: str) -> dict:
    """A streaming query copying topic ``source`` into ``target`` (available-now, with a
    checkpoint): reads and writes on every host."""
    conf = json.loads(conf_json)
    q = (spark.readStream.format("pafka").options(**conf).option("topic", source)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "2500")
         .load(root)
         .writeStream.format("pafka").options(**conf).option("topic", target)
         .option("key", "id").option("partitions", "4").option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start(root))
    q.awaitTermination(600)
    return {"batches": len(q.recentProgress)}


def read(spark, root: str, conf_json: str, topic: str, stats: str) -> dict:
    """Count and sum topic ``topic`` from a second job; the read counts of its executors."""
    for f in glob.glob(os.path.join(stats, "*.jsonl")):
        os.unlink(f)
    rows, total = _read(spark, root, json.loads(conf_json), topic)
    from tier_store import Store
    with Store.open(root, json.loads(conf_json), create=False) as s:
        latest = s.topic(topic).latest_offsets()
    return {"rows": rows, "sum": total, "latest": latest, **_stats(stats)}


def steps(spark, root: str, conf_json: str, plan_json: str, stats: str) -> list:
    """Several jobs in one application (one cluster start): ``plan_json`` is a list of
    ``["write", topic, n]``, ``["stream", source, target, checkpoint]``, ``["read", topic]``
    and ``["wipe", directory]`` (empty a host's tier 1 between jobs); one result each."""
    out = []
    for step in json.loads(plan_json):
        kind, args = step[0], [str(a) for a in step[1:]]
        if kind == "write":
            out.append(write(spark, root, conf_json, *args))
        elif kind == "stream":
            out.append(stream_copy(spark, root, conf_json, *args))
        elif kind == "read":
            out.append(read(spark, root, conf_json, args[0], stats))
        elif kind == "wipe":
            import shutil
            for name in os.listdir(args[0]):
                shutil.rmtree(os.path.join(args[0], name), ignore_errors=True)
            out.append({"wiped": args[0]})
        else:
            raise ValueError(f"unknown step {step!r}")
    return out
