"""The pafka format on a real SparkSession (local[2])."""

import datetime
import json
import os
import time

import pyarrow as pa
import pytest

from tier_store import Store

from .conftest import SCHEMA, make_batch
from .support import fill_keyed as _fill


def _keys(spark, root, topic):
    df = spark.read.format("pafka").option("topic", topic).load(str(root))
    return sorted(r[0] for r in df.select("key").collect())


@pytest.mark.parametrize("workers", ["python3 elsewhere", "python3 is this one", "set"])
def test_reading_spark_conf_names_the_python_sparks_workers_would_run(tmp_path, workers):
    # With no PYSPARK_PYTHON, Spark's workers run python3 from PATH: one without pyspark and
    # pafka fails format("pafka") with DATA_SOURCE_NOT_FOUND, which names neither cause.
    import subprocess
    import sys

    from .support import isolated_env
    env = isolated_env(sys.executable)
    del env["PYSPARK_PYTHON"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if workers == "python3 is this one":
        (bindir / "python3").symlink_to(sys.executable)
    if workers == "set":
        env["PYSPARK_PYTHON"] = sys.executable
    env["PATH"] = str(bindir)
    code = ("import pafka_source, logging; logging.basicConfig(); import pafka_source.cli; "
            "print('cli imported'); c = pafka_source.SPARK_CONF; c = pafka_source.SPARK_CONF")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "cli imported" in out.stdout, out.stderr
    if workers == "python3 elsewhere":
        assert out.stderr.count("PYSPARK_PYTHON is not set") == 1, out.stderr  # once
        assert "DATA_SOURCE_NOT_FOUND" in out.stderr and \
            f"Set PYSPARK_PYTHON={sys.executable}" in out.stderr, out.stderr
    else:
        assert "PYSPARK_PYTHON" not in out.stderr, out.stderr


def test_format_is_discovered_without_registration_and_register_works_too(spark, tmp_path):
    _fill(tmp_path, "t", 10)
    assert spark.read.format("pafka").option("topic", "t").load(str(tmp_path)).count() == 10
    import pafka_source
    pafka_source.register(spark)
    assert spark.read.format("pafka").option("topic", "t").load(str(tmp_path)).count() == 10


def test_round_trip_of_every_type_spark_and_arrow_share(spark, tmp_path):
    df = spark.sql("""
        select cast(id as tinyint) b, cast(id as smallint) s, cast(id as int) i, id l,
               cast(id as float) f, cast(id as double) d, cast(id / 3 as decimal(20, 6)) dec,
               cast(id as string) str, cast(cast(id as string) as binary) bin,
               timestamp_micros(id * 1000003) ts, date_add(date'2024-01-01', cast(id as int)) dt,
               id % 2 = 0 bo, array(id, id + 1) arr, named_struct('a', id, 'b', 'x') st,
               map('k', id) mp, cast(null as string) nul,
               case when id % 3 = 0 then null else id end maybe,
               cast(timestamp_micros(id) as timestamp_ntz) ntz,
               make_dt_interval(id, 0, 0, id / 7) iv
        from range(50)""")
    df.write.format("pafka").option("topic", "types").mode("append").save(str(tmp_path))
    back = spark.read.format("pafka").option("topic", "types").load(str(tmp_path))
    assert back.schema.simpleString() == df.schema.simpleString().replace(
        "not null", "")  or [f.dataType for f in back.schema] == [f.dataType for f in df.schema]
    assert sorted(back.collect()) == sorted(df.collect())


def test_recommended_spark_settings_write_exactly_the_rows(spark, tmp_path):
    """Under pafka_source.SPARK_CONF Spark cuts the batches it sends to a writer by row count
    alone; batch and streaming writes still store exactly the rows."""
    from pafka_source import SPARK_CONF
    assert SPARK_CONF
    before = {k: spark.conf.get(k, None) for k in SPARK_CONF}
    for k, v in SPARK_CONF.items():
        spark.conf.set(k, v)
    try:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7000")
        df = spark.sql("""select id key, cast(id as string) s, array(id, id) arr,
                                 named_struct('a', id) st from range(25000)""").repartition(2)
        df.write.format("pafka").option("topic", "t").mode("append").save(str(tmp_path))
        back = spark.read.format("pafka").option("topic", "t").load(str(tmp_path))
        assert sorted(back.collect()) == sorted(df.collect())

        src = (spark.readStream.format("pafka").option("topic", "t")
               .option("startingOffsets", "earliest").load(str(tmp_path)).select("key"))
        q = (src.writeStream.format("pafka").option("topic", "copy")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
             .start(str(tmp_path)))
        q.awaitTermination()
        assert _keys(spark, tmp_path, "copy") == list(range(25000))
        # A failing read shows pafka's error alone, with no Python traceback above it.
        with pytest.raises(Exception) as err:
            spark.read.format("pafka").option("topic", "nope").load(str(tmp_path)).collect()
        assert "TopicNotFound: topic 'nope' does not exist" in str(err.value)
        assert "Traceback" not in str(err.value) and len(str(err.value).splitlines()) <= 3
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def test_topic_written_from_python_with_types_spark_lacks_reads_widened(spark, tmp_path):
    s = Store.open(tmp_path)
    schema = pa.schema([("u8", pa.uint8()), ("u32", pa.uint32()), ("ls", pa.large_string()),
                        ("fb", pa.binary(3)), ("ms", pa.timestamp("ms", tz="Europe/Paris")),
                        ("dur", pa.duration("ms"))])
    t = s.create_topic("py", schema)
    t.append(pa.record_batch([pa.array([255], pa.uint8()), pa.array([4_000_000_000], pa.uint32()),
                              pa.array(["x"], pa.large_string()), pa.array([b"abc"], pa.binary(3)),
                              pa.array([1_700_000_000_123], pa.timestamp("ms", tz="Europe/Paris")),
                              pa.array([1500], pa.duration("ms"))],
                             schema=schema))
    row = spark.read.format("pafka").option("topic", "py").load(str(tmp_path)).collect()[0]
    assert (row.u8, row.u32, row.ls, bytes(row.fb)) == (255, 4_000_000_000, "x", b"abc")
    assert row.ms == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert row.dur == datetime.timedelta(seconds=1.5)


def test_batch_read_with_metadata_offsets_and_ending_offsets(spark, tmp_path):
    _fill(tmp_path, "t", 1000, partitions=2)
    df = (spark.read.format("pafka").option("topic", "t").option("includeMetadata", "true")
          .option("startingOffsets", json.dumps({"t": {"0": 10, "1": -2}}))
          .option("endingOffsets", json.dumps({"t": {"0": 20, "1": -1}})).load(str(tmp_path)))
    rows = df.select("_topic", "_partition", "_offset", "_timestamp").collect()
    p0 = sorted(r._offset for r in rows if r._partition == 0)
    assert p0 == list(range(10, 20))
    latest1 = Store.open(tmp_path).topic("t").latest_offsets()[1]
    assert sorted(r._offset for r in rows if r._partition == 1) == list(range(latest1))
    assert {r._topic for r in rows} == {"t"}
    assert all(r._timestamp.year >= 2024 for r in rows)


def test_batch_write_is_one_atomic_append_and_overwrite_is_refused(spark, tmp_path):
    df = spark.range(5000).selectExpr("id as key", "id as ts", "cast(id as string) as value")
    df.write.format("pafka").option("topic", "w").option("partitions", 4).mode("append").save(
        str(tmp_path))
    t = Store.open(tmp_path).topic("w")
    assert t.version == 1  # create, then one append entry
    assert sum(t.latest_offsets().values()) == 5000
    assert all(v > 0 for v in t.latest_offsets().values())  # two tasks fill four partitions
    with pytest.raises(Exception, match="append-only log"):
        df.write.format("pafka").option("topic", "w").mode("overwrite").save(str(tmp_path))


def test_a_store_deleted_and_created_again_under_one_root_is_written_afresh(spark, tmp_path):
    # Spark's Python processes cache store handles; a stale one must not outlive its store.
    import shutil
    root = tmp_path / "store"
    df = spark.range(100).selectExpr("id as key", "id as ts", "cast(id as string) as value")
    for _ in range(2):
        shutil.rmtree(root, ignore_errors=True)
        df.write.format("pafka").option("topic", "w").mode("append").save(str(root))
        assert _keys(spark, root, "w") == list(range(100))


def test_key_option_routes_rows_by_the_stores_hash(spark, tmp_path):
    df = spark.range(2000).selectExpr("id % 50 as key", "id as ts", "cast(id as string) as value")
    df.write.format("pafka").option("topic", "k").option("partitions", 3).option("key", "key") \
        .mode("append").save(str(tmp_path))
    t = Store.open(tmp_path).topic("k")
    seen = {}
    for p in range(3):
        for b in t.read(p, 0):
            for k in b.column("key").to_pylist():
                seen.setdefault(k, set()).add(p)
    assert len(seen) == 50 and all(len(v) == 1 for v in seen.values())


def test_schema_mismatch_fails_at_save_naming_the_columns(spark, tmp_path):
    _fill(tmp_path, "t", 10)
    bad = spark.range(3).selectExpr("cast(id as int) as key", "id as ts", "'x' as value")
    with pytest.raises(Exception, match="column 'key': topic has int64, DataFrame has int32"):
        bad.write.format("pafka").option("topic", "t").mode("append").save(str(tmp_path))


def test_nullable_column_into_non_null_field_casts_or_fails_naming_it(spark, tmp_path):
    s = Store.open(tmp_path)
    s.create_topic("nn", pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    ok = spark.sql("select case when id < 100 then id end as id from range(10)")
    ok.write.format("pafka").option("topic", "nn").mode("append").save(str(tmp_path))
    assert Store.open(tmp_path).topic("nn").latest_offsets() == {0: 10}
    bad = spark.sql("select case when id < 5 then id end as id from range(10)")
    with pytest.raises(Exception, match="'id' is not nullable"):
        bad.write.format("pafka").option("topic", "nn").mode("append").save(str(tmp_path))
    assert Store.open(tmp_path).topic("nn").latest_offsets() == {0: 10}


@pytest.mark.parametrize("options,message", [
    ({"topic": "nope"}, "topic 'nope' does not exist.*topics: t"),
    ({"topic": "t", "startingOffsets": "{bad"}, "invalid value .{bad. for option"),
    ({"topic": "t", "startingOffsets": '{"t": {"9": 0}}'},
     "'startingOffsets' names partition 9 of topic 't', which has partitions 0..1"),
    ({"topic": "t", "maxOffsetsPerTrigger": "-5"}, "'maxOffsetsPerTrigger'.*positive integer"),
    ({"topic": "t", "startingOfsets": "earliest"}, "unknown source option 'startingofsets'; "
                                                   "did you mean startingOffsets"),
    ({"subscribe": "t", "topic": "t"}, "exactly one of"),
    ({"topic": "t", "log.segment.bytes": "1"}, "log.segment.bytes.*out of range"),
])
def test_bad_source_options_fail_at_load_with_a_clear_error(spark, tmp_path, options, message):
    _fill(tmp_path, "t", 10)
    reader = spark.read.format("pafka")
    for k, v in options.items():
        reader = reader.option(k, v)
    with pytest.raises(Exception, match=message) as e:
        reader.load(str(tmp_path)).collect()
    assert "pyarrow" not in str(e.value).split("\n")[0]


def test_bad_sink_option_fails_the_query_at_its_first_batch(spark, tmp_path):
    # Spark builds a Python stream writer only when the first micro-batch runs, so the error
    # surfaces there (as the query's exception), before anything is written.
    df = spark.readStream.format("rate").option("rowsPerSecond", 10).load()
    q = df.writeStream.format("pafka").option("topic", "x").option("keys", "value") \
        .option("checkpointLocation", str(tmp_path / "c")).start(str(tmp_path / "r"))
    with pytest.raises(Exception, match="unknown sink option 'keys'; did you mean key\\?"):
        q.awaitTermination(120)
    assert not os.path.exists(tmp_path / "r" / "x")


def _run_available_now(spark, root, src, dst, ckpt, **opts):
    reader = spark.readStream.format("pafka").option("topic", src)
    for k, v in opts.items():
        reader = reader.option(k, v)
    q = (reader.load(str(root)).writeStream.format("pafka").option("topic", dst)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start(str(root)))
    q.awaitTermination(180)
    return q


def test_streaming_write_then_read_gives_exactly_the_rows_and_restart_continues(spark, tmp_path):
    _fill(tmp_path, "src", 20_000, partitions=3)
    ck = tmp_path / "ck"
    q = _run_available_now(spark, tmp_path, "src", "dst", ck, startingOffsets="earliest")
    assert sum(p["numInputRows"] for p in q.recentProgress) == 20_000
    assert _keys(spark, tmp_path, "dst") == list(range(20_000))
    # More input, then restart from the same checkpoint: only the new rows, once.
    t = Store.open(tmp_path).topic("src")
    for start in range(20_000, 25_000, 1000):
        t.append(make_batch(start, 1000), key="key")
    q = _run_available_now(spark, tmp_path, "src", "dst", ck, startingOffsets="earliest")
    assert sum(p["numInputRows"] for p in q.recentProgress) == 5_000
    assert _keys(spark, tmp_path, "dst") == list(range(25_000))


def test_read_limits_make_the_batch_sizes_asked_for_under_available_now(spark, tmp_path):
    _fill(tmp_path, "src", 10_000, partitions=2)
    q = _run_available_now(spark, tmp_path, "src", "dst", tmp_path / "ck",
                           startingOffsets="earliest", maxOffsetsPerTrigger=3000)
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert sizes == [3000, 3000, 3000, 1000]
    assert _keys(spark, tmp_path, "dst") == list(range(10_000))


def test_max_bytes_per_trigger_bounds_each_batch(spark, tmp_path):
    s, t = _fill(tmp_path, "src", 10_000, partitions=1)
    per_record = sum(x.bytes for x in t.segments()) / 10_000
    q = _run_available_now(spark, tmp_path, "src", "dst", tmp_path / "ck",
                           startingOffsets="earliest", maxBytesPerTrigger=int(per_record * 2500))
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 4 and max(sizes) <= 2600 and sum(sizes) == 10_000


def test_read_limits_under_a_processing_time_trigger(spark, tmp_path):
    _fill(tmp_path, "src", 6000, partitions=2)
    q = (spark.readStream.format("pafka").option("topic", "src")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 2000)
         .load(str(tmp_path)).writeStream.format("pafka").option("topic", "dst")
         .option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="100 milliseconds")
         .start(str(tmp_path)))
    try:
        q.processAllAvailable()
        sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    finally:
        q.stop()
    assert sizes == [2000, 2000, 2000]
    assert _keys(spark, tmp_path, "dst") == list(range(6000))


def test_min_offsets_per_trigger_waits_for_enough_records_or_the_delay(spark, tmp_path):
    s, t = _fill(tmp_path, "src", 100, partitions=1)
    q = (spark.readStream.format("pafka").option("topic", "src")
         .option("startingOffsets", "earliest").option("minOffsetsPerTrigger", 500)
         .option("maxTriggerDelay", "3s").load(str(tmp_path))
         .writeStream.format("noop").trigger(processingTime="100 milliseconds").start())
    try:
        time.sleep(1.0)
        early = sum(p["numInputRows"] for p in q.recentProgress)
        t.append(make_batch(100, 450))
        deadline = time.time() + 60
        while sum(p["numInputRows"] for p in q.recentProgress) < 550 and time.time() < deadline:
            time.sleep(0.1)
    finally:
        q.stop()
    assert early == 0
    assert sum(p["numInputRows"] for p in q.recentProgress) == 550


def test_fail_on_data_loss_both_ways_after_retention(spark, tmp_path):
    s, t = _fill(tmp_path, "src", 20_000, partitions=1, per_append=500,
                 **{"log.segment.bytes": "64k"})
    s2 = Store.open(tmp_path, {"log.retention.bytes": "300k"})
    deleted = s2.topic("src").apply_retention()
    assert deleted
    earliest = s2.topic("src").earliest_offsets()[0]
    start = json.dumps({"src": {"0": 0}})
    with pytest.raises(Exception, match=rf"partition 0: offsets \[0, {earliest}\) were deleted"):
        spark.read.format("pafka").option("topic", "src").option("startingOffsets", start) \
            .load(str(tmp_path)).collect()
    rows = spark.read.format("pafka").option("topic", "src").option("startingOffsets", start) \
        .option("failOnDataLoss", "false").load(str(tmp_path)).count()
    assert rows == 20_000 - earliest


def test_consumer_group_records_the_committed_position(spark, tmp_path):
    _fill(tmp_path, "src", 3000, partitions=2)
    _run_available_now(spark, tmp_path, "src", "dst", tmp_path / "ck",
                       startingOffsets="earliest", consumerGroup="g1",
                       maxOffsetsPerTrigger=1000)
    t = Store.open(tmp_path).topic("src")
    pos = t.positions()["g1"]
    # The source's commit lags one batch; all but the last batch's end are recorded.
    assert 0 < sum(pos.values()) <= 3000


def test_track_groups_records_the_last_batch_so_a_stopped_query_shows_no_lag(spark, tmp_path):
    import pafka_source
    _fill(tmp_path, "src", 3000, partitions=2)
    listener = pafka_source.track_groups(spark)
    assert pafka_source.track_groups(spark) is listener  # one per session
    try:
        _run_available_now(spark, tmp_path, "src", "dst", tmp_path / "ck",
                           startingOffsets="earliest", consumerGroup="g1",
                           maxOffsetsPerTrigger=1000)
        t = Store.open(tmp_path).topic("src")
        deadline = time.time() + 30  # listener events are delivered asynchronously
        while t.positions().get("g1") != t.latest_offsets() and time.time() < deadline:
            time.sleep(0.1)
        assert t.positions()["g1"] == t.latest_offsets()
        assert sum(t.latest_offsets().values()) == 3000
        # Each micro-batch's end, not only the last: of 3 batches, at least 2. Events are
        # delivered asynchronously, and on a loaded machine the first batch's progress can
        # be handled before the listener could read the query's options (CI saw 2).
        assert listener.tracker.recorded >= 2
        # A query without consumerGroup records nothing.
        _run_available_now(spark, tmp_path, "src", "dst2", tmp_path / "ck2",
                           startingOffsets="earliest")
        assert set(Store.open(tmp_path).topic("src").positions()) == {"g1"}
    finally:
        spark.streams.removeListener(listener)
        del spark._pafka_group_listener


def test_a_query_whose_checkpoint_names_a_deleted_topic_fails_instead_of_reading_a_new_one(
        spark, tmp_path):
    from pyspark.errors import StreamingQueryException
    _fill(tmp_path, "src", 3000, partitions=2)
    ck = tmp_path / "ck"
    _run_available_now(spark, tmp_path, "src", "dst", ck, startingOffsets="earliest")
    Store.open(tmp_path).delete_topic("src")
    # The same name again, with more records than the query had read.
    _fill(tmp_path, "src", 5000, partitions=2)
    with pytest.raises(StreamingQueryException, match="deleted and created again"):
        q = _run_available_now(spark, tmp_path, "src", "dst", ck)
        if q.exception() is not None:
            raise q.exception()
    assert _keys(spark, tmp_path, "dst") == list(range(3000))
    # With failOnDataLoss=false the query reads the new topic from its earliest offset.
    _run_available_now(spark, tmp_path, "src", "dst", ck, failOnDataLoss="false")
    assert _keys(spark, tmp_path, "dst") == sorted(list(range(3000)) + list(range(5000)))


def test_a_sink_writing_a_deleted_topics_name_starts_a_new_incarnation(spark, tmp_path):
    df = spark.range(100).selectExpr("id as key", "id as ts", "cast(id as string) as value")
    df.write.format("pafka").option("topic", "t").mode("append").save(str(tmp_path))
    first = Store.open(tmp_path).topic("t").id
    Store.open(tmp_path).delete_topic("t")
    df.where("id < 10").write.format("pafka").option("topic", "t").mode("append") \
        .save(str(tmp_path))
    again = Store.open(tmp_path).topic("t")
    assert again.id and again.id != first
    assert _keys(spark, tmp_path, "t") == list(range(10))


def test_a_new_query_starts_at_its_consumer_groups_committed_offsets(spark, tmp_path):
    s, t = _fill(tmp_path, "src", 3000, partitions=2)
    # A first query records group g's position as it goes.
    _run_available_now(spark, tmp_path, "src", "dst", tmp_path / "ck1",
                       startingOffsets="earliest", consumerGroup="g", maxOffsetsPerTrigger=1000)
    recorded = t.positions()["g"]
    assert recorded[0] > 0
    # As after `pafka groups ... --reset-to`: partition 1 has no committed offset now.
    t.reset_position("g", {0: recorded[0]})
    t.append(make_batch(3000, 200), partition=1)
    latest = t.latest_offsets()
    q = (spark.readStream.format("pafka").option("topic", "src")
         .option("startingOffsets", "group").option("consumerGroup", "g")
         .option("includeMetadata", "true").load(str(tmp_path))
         .select("_partition", "_offset").writeStream.format("memory")
         .queryName("from_group").option("checkpointLocation", str(tmp_path / "ck2"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    got = sorted(tuple(r) for r in spark.sql("select * from from_group").collect())
    assert got == [(0, o) for o in range(recorded[0], latest[0])] + \
        [(1, o) for o in range(latest[1])]  # no position: from the earliest offset


def test_a_limited_query_behind_a_range_lost_to_retention_jumps_it_in_one_step(spark, tmp_path):
    s, t = _fill(tmp_path, "src", 500, partitions=1, per_append=100,
                 **{"log.segment.bytes": "64k"})
    ck = tmp_path / "ck"
    opts = {"startingOffsets": "earliest", "failOnDataLoss": "false",
            "maxOffsetsPerTrigger": 500}
    _run_available_now(spark, tmp_path, "src", "dst", ck, **opts)
    # The query is at 500; while it is stopped the topic grows and retention deletes a range
    # of many batches past it.
    for start in range(500, 8500, 100):
        t.append(make_batch(start, 100))
    Store.open(tmp_path, {"log.retention.bytes": "100k"}).topic("src").apply_retention()
    earliest, latest = t.earliest_offsets()[0], t.latest_offsets()[0]
    assert earliest - 500 >= 5 * 500  # the gap would have made five empty batches and more
    q = _run_available_now(spark, tmp_path, "src", "dst", ck, **opts)
    sizes = [p["numInputRows"] for p in q.recentProgress]
    left = latest - earliest
    assert sizes == [500] * (left // 500) + ([left % 500] if left % 500 else [])
    assert _keys(spark, tmp_path, "dst") == list(range(500)) + list(range(earliest, latest))


def test_subscribe_pattern_reads_topics_with_equal_schemas_and_rejects_others(spark, tmp_path):
    _fill(tmp_path, "a.1", 100)
    s, _ = _fill(tmp_path, "a.2", 50)
    df = spark.read.format("pafka").option("subscribePattern", r"a\..*") \
        .option("includeMetadata", "true").load(str(tmp_path))
    counts = dict(df.groupBy("_topic").count().collect())
    assert counts == {"a.1": 100, "a.2": 50}
    s.create_topic("a.3", pa.schema([("x", pa.int32())]))
    with pytest.raises(Exception, match="equal schemas: 'a.3'"):
        spark.read.format("pafka").option("subscribePattern", r"a\..*").load(str(tmp_path)) \
            .collect()


def test_running_query_picks_up_new_partitions_and_new_topics(spark, tmp_path):
    s, t = _fill(tmp_path, "n.1", 100, partitions=1)
    q = (spark.readStream.format("pafka").option("subscribePattern", r"n\..*")
         .option("startingOffsets", "earliest").load(str(tmp_path))
         .writeStream.format("pafka").option("topic", "out")
         .option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="100 milliseconds")
         .start(str(tmp_path)))
    try:
        t.add_partitions(1)
        t.append(make_batch(100, 10), partition=1)
        t2 = s.create_topic("n.2", SCHEMA)
        t2.append(make_batch(1000, 5))
        deadline = time.time() + 90
        out = None
        while time.time() < deadline:
            if "out" in s.topics():
                out = sum(s.topic("out").latest_offsets().values())
                if out >= 115:
                    break
            time.sleep(0.2)
    finally:
        q.stop()
    assert _keys(spark, tmp_path, "out") == list(range(110)) + list(range(1000, 1005))


def test_starting_timestamp_starts_at_the_first_record_committed_then(spark, tmp_path):
    s, t = _fill(tmp_path, "src", 100, partitions=1, per_append=100)
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    t.append(make_batch(100, 50))
    df = spark.read.format("pafka").option("topic", "src") \
        .option("startingTimestamp", str(cut)).load(str(tmp_path))
    assert sorted(r.key for r in df.select("key").collect()) == list(range(100, 150))


def test_two_streaming_queries_write_one_topic_in_one_session(spark, tmp_path):
    _fill(tmp_path, "s1", 3000, partitions=2)
    s, t = _fill(tmp_path, "s2", 0, partitions=1)
    t.append(make_batch(10_000, 3000))
    qs = [(spark.readStream.format("pafka").option("topic", src)
           .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", 500)
           .load(str(tmp_path)).writeStream.format("pafka").option("topic", "both")
           .option("checkpointLocation", str(tmp_path / f"ck-{src}"))
           .trigger(availableNow=True).start(str(tmp_path))) for src in ("s1", "s2")]
    for q in qs:
        q.awaitTermination(180)
    assert _keys(spark, tmp_path, "both") == list(range(3000)) + list(range(10_000, 13_000))


def test_start_migration_runs_the_service_beside_a_streaming_query(spark, tmp_path, shm_dir):
    import pafka_source
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
            "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "2m",
            "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0,
            "storage.migrate.interval.ms": 100}
    s = Store.open(tmp_path, conf)
    service = pafka_source.start_migration(spark, str(tmp_path))
    try:
        df = spark.range(60_000).selectExpr("id as key", "id as ts", "cast(id as string) as value")
        for i in range(6):  # six micro-batch-sized writes fill tier 1 past the threshold
            df.where(f"id % 6 = {i}").write.format("pafka").option("topic", "m") \
                .mode("append").save(str(tmp_path))
        deadline = time.time() + 60
        while service.stats.segments_down == 0 and time.time() < deadline:
            time.sleep(0.1)
    finally:
        service.stop()
    assert service.stats.segments_down > 0 and not service.running
    assert {x.tier for x in s.topic("m").segments()} == {1, 2}
    assert _keys(spark, tmp_path, "m") == list(range(60_000))
