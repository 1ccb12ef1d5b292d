"""Observing a pafka streaming query: its lag in Spark's progress, track_lag's samples checked
against the store's own offsets, the tier-1 share of a batch, short errors."""

import json
import logging
import time

import pytest

from tier_store import Store

from .support import fill_keyed


def _read(spark, root, ckpt, name, **opts):
    """Read topic ``src`` to the end under AvailableNow (a noop sink), as query ``name``."""
    reader = spark.readStream.format("pafka").option("topic", "src")
    for k, v in {"startingOffsets": "earliest", **opts}.items():
        reader = reader.option(k, v)
    q = (reader.load(str(root)).writeStream.format("noop").queryName(name)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    q.awaitTermination(180)
    return q


def _parts(offsets, topic="src"):
    return {int(p): o for p, o in offsets[topic].items()}


def _wait_for(predicate, seconds=60):
    """Listener events arrive asynchronously: wait for them, generously."""
    deadline = time.time() + seconds
    while not predicate() and time.time() < deadline:
        time.sleep(0.1)
    return predicate()


def test_progress_names_the_topic_and_carries_the_lag_after_each_batch(spark, tmp_path):
    store, topic = fill_keyed(tmp_path, "src", 3000, partitions=2)
    q = _read(spark, tmp_path, tmp_path / "ck", "lag_in_progress", maxOffsetsPerTrigger=1000)
    progress = [p for p in q.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in progress] == [1000, 1000, 1000]
    latest = topic.latest_offsets()
    behind = []
    for p in progress:
        src = p["sources"][0]
        end, reported = json.loads(src["endOffset"]), json.loads(src["latestOffset"])
        assert "src" in end and end["_ids"] == {"src": topic.id}  # the topic, by name and id
        assert _parts(reported) == latest  # nothing was written meanwhile
        lag = reported["_lag"]["src"]
        records = sum(latest[p] - o for p, o in _parts(end).items())
        assert lag["records"] == records
        assert lag["bytes"] == sum(topic.bytes_between(p, o, latest[p])
                                   for p, o in _parts(end).items())
        assert lag["tier1Share"] == 1.0  # the default store keeps everything on tier 1
        behind.append(records)
    assert behind == [2000, 1000, 0]


def test_track_lag_keeps_and_logs_each_batchs_lag_as_the_store_counts_it(spark, tmp_path,
                                                                          caplog):
    import pafka_source
    store, topic = fill_keyed(tmp_path, "src", 3000, partitions=2)
    tracker = pafka_source.track_lag(spark)
    assert pafka_source.track_lag(spark) is tracker  # one per session
    try:
        with caplog.at_level(logging.INFO, logger="pafka_source.progress"):
            q = _read(spark, tmp_path, tmp_path / "ck", "tracked", maxOffsetsPerTrigger=1200)
            # No waiting: history() takes the events Spark posted before it was called.
            samples = tracker.history("tracked")
            assert len(samples) >= 3 and samples[-1].batch_id == q.lastProgress["batchId"]
        assert tracker.history(str(q.id)) == samples and tracker.latest("tracked") == samples[-1]
        latest = topic.latest_offsets()
        ends = {p["batchId"]: json.loads(p["sources"][0]["endOffset"]) for p in q.recentProgress}
        for sample in samples:
            end = ends[sample.batch_id]
            assert sample.source == f"pafka src at {tmp_path}"
            assert sample.query_name == "tracked" and set(sample.topics) == {"src"}
            lag = sample.topics["src"]
            assert lag.partitions == {p: latest[p] - o for p, o in _parts(end).items()}
            assert sample.records == sum(lag.partitions.values())
            assert sample.bytes == sum(topic.bytes_between(p, o, latest[p])
                                       for p, o in _parts(end).items())
            assert sample.tier1_share == 1.0
        assert [s.records for s in samples[:3]] == [1800, 600, 0]
        assert [s.input_rows for s in samples[:3]] == [1200, 1200, 600]
        assert samples[0].bytes > samples[1].bytes > samples[2].bytes == 0
        logged = [r.getMessage() for r in caplog.records if r.name == "pafka_source.progress"]
        assert any("query tracked batch 0, pafka src at" in m and
                   "1800 records" in m and "100% of the batch on tier 1" in m for m in logged)
        # More records, no query: the last sample stays what it measured.
        topic.append(topic.read(0, 0).__next__())
        assert tracker.latest("tracked").records == 0
    finally:
        spark.streams.removeListener(tracker.listener)
        del spark._pafka_lag_tracker


def test_tier1_share_is_the_share_of_the_batchs_bytes_in_tier1_segments(spark, tmp_path):
    import pafka_source
    store, topic = fill_keyed(tmp_path, "src", 40_000, partitions=1, per_append=2000,
                              **{"storage.tiers.types": "FILE,HDD",
                                 "log.segment.bytes": "64k", "storage.migrate.threshold": -1})
    sealed = [s for s in topic.segments() if s.sealed]
    assert len(sealed) >= 4
    for s in sealed[: len(sealed) // 2]:  # the oldest half down to tier 2
        store.move_segment(s.id, 2, topic="src")
    segments = topic.refresh().segments()
    expected = sum(s.bytes for s in segments if s.tier == 1) / sum(s.bytes for s in segments)
    assert 0.2 < expected < 0.9
    tracker = pafka_source.track_lag(spark)
    try:
        q = _read(spark, tmp_path, tmp_path / "ck", "tiered")
        assert _wait_for(lambda: tracker.latest("tiered") is not None)
        assert tracker.latest("tiered").tier1_share == pytest.approx(expected, abs=1e-6)
        reported = json.loads(q.recentProgress[0]["sources"][0]["latestOffset"])
        assert reported["_lag"]["src"]["tier1Share"] == pytest.approx(expected, abs=1e-4)
    finally:
        spark.streams.removeListener(tracker.listener)
        del spark._pafka_lag_tracker


HIDE = "spark.sql.execution.pyspark.udf.hideTraceback.enabled"


def _failure(spark, root, ckpt):
    """The message of a query that fails in its source (the checkpoint names a deleted topic)."""
    from pyspark.errors import StreamingQueryException
    q = (spark.readStream.format("pafka").option("topic", "src").load(str(root))
         .writeStream.format("noop").option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException) as failed:
        q.awaitTermination(180)
    return str(failed.value).splitlines()


def test_a_pafka_error_in_a_streaming_query_is_one_line_whether_tracebacks_are_hidden_or_not(
        spark, tmp_path):
    fill_keyed(tmp_path, "src", 2000, partitions=2)
    _read(spark, tmp_path, tmp_path / "ck", "before_delete")
    Store.open(tmp_path).delete_topic("src")
    fill_keyed(tmp_path, "src", 3000, partitions=2)
    error = "tier_store.errors.TopicDeleted: topic 'src' was deleted and created again"
    shown = spark.conf.get(HIDE)
    try:
        spark.conf.set(HIDE, "false")
        full = _failure(spark, tmp_path, tmp_path / "ck")
        spark.conf.set(HIDE, "true")
        short = _failure(spark, tmp_path, tmp_path / "ck")
    finally:
        spark.conf.set(HIDE, shown)
    # Spark's own part, from "=== Streaming Query ===" on, follows; the source's part is the
    # one line Spark prefixes, naming the error and the topic, with no Python traceback.
    for lines in (full, short):
        python = lines[:lines.index("=== Streaming Query ===")]
        assert not any("Traceback" in line or "File " in line for line in python), python
        assert python[0].endswith("perform latestOffset: " + error[:20]) or error in python[0]
        assert len(python) <= 2


def test_a_running_query_whose_topic_is_deleted_stops_in_one_line_naming_it(spark, tmp_path):
    from pyspark.errors import StreamingQueryException
    fill_keyed(tmp_path, "src", 2000, partitions=2)
    shown = spark.conf.get(HIDE)
    spark.conf.set(HIDE, "false")  # Spark's default: tracebacks shown
    try:
        q = (spark.readStream.format("pafka").option("topic", "src")
             .option("startingOffsets", "earliest").load(str(tmp_path))
             .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="200 milliseconds").start())
        # Any batch that read rows: the newest progress may be an empty batch's.
        assert _wait_for(lambda: any(p["numInputRows"] > 0 for p in q.recentProgress))
        Store.open(tmp_path).delete_topic("src")
        with pytest.raises(StreamingQueryException) as failed:
            q.awaitTermination(120)
    finally:
        spark.conf.set(HIDE, shown)
        if q.isActive:
            q.stop()
    lines = str(failed.value).splitlines()
    python = lines[:lines.index("=== Streaming Query ===")]
    assert not any("Traceback" in line or "File " in line for line in python), python
    assert len(python) <= 2, python
    assert "TopicDeleted: topic 'src' was deleted while this query read it" in python[0]
