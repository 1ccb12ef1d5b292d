"""A Spark job run in its own process by the Spark crash and cluster tests.

    python -m tests.spark_job stream ROOT CKPT MASTER TRIGGER   # pafka topic "src" -> "dst"
    python -m tests.spark_job cluster ROOT                      # batch and stream on a cluster
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def session(master: str):
    from pyspark.sql import SparkSession
    s = (SparkSession.builder.master(master).appName("pafka-test-job")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    return s


def stream(root: str, ckpt: str, master: str, trigger: str) -> None:
    spark = session(master)
    q = (spark.readStream.format("pafka").option("topic", "src")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 5000)
         .load(root).writeStream.format("pafka").option("topic", "dst")
         .option("checkpointLocation", ckpt))
    q = q.trigger(availableNow=True) if trigger == "availableNow" else \
        q.trigger(processingTime="200 milliseconds")
    q.start(root).awaitTermination()
    spark.stop()


def cluster(root: str) -> None:
    spark = session("local-cluster[2,1,1024]")
    sc = spark.sparkContext
    df = spark.range(0, 40_000, numPartitions=4).selectExpr(
        "id as key", "id * 10 as ts", "cast(id as string) as value")
    df.write.format("pafka").option("topic", "c").option("partitions", 4).mode("append") \
        .save(root)
    # minPartitions: ranges this small would otherwise share one task.
    back = spark.read.format("pafka").option("topic", "c").option("includeMetadata", "true") \
        .option("minPartitions", 4).load(root)
    # The executors that read must be two distinct processes.
    pids = back.rdd.mapPartitions(lambda _: [os.getpid()]).distinct().count()
    total = back.selectExpr("sum(key)", "count(*)").first()
    q = (spark.readStream.format("pafka").option("topic", "c")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 15_000).load(root)
         .writeStream.format("pafka").option("topic", "c2")
         .option("checkpointLocation", os.path.join(root, "_ck")).trigger(availableNow=True)
         .start(root))
    q.awaitTermination()
    copied = spark.read.format("pafka").option("topic", "c2").load(root).selectExpr(
        "sum(key)", "count(*)").first()
    print(f"RESULT executors={sc._jsc.sc().getExecutorIds().size()} pids={pids} "
          f"sum={total[0]} count={total[1]} copied_sum={copied[0]} copied_count={copied[1]}")
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        stream(*sys.argv[2:6])
    else:
        cluster(sys.argv[2])
