"""Bad and edge options of the pafka format: each fails early with a clear message, or has a
documented behaviour. Most cases call the data source in this process, as Spark's Python
workers do; the ones that depend on Spark's own handling run on the real SparkSession."""

import json
import logging
import os

import pyarrow as pa
import pytest
from pyspark.sql.datasource import CaseInsensitiveDict, InputPartition
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pafka_source.offsets import split_ids
from pafka_source.options import SinkOptions, SourceOptions
from pafka_source.source import PafkaDataSource
from tier_store import DataLoss, PafkaError, Store

from .conftest import SCHEMA, make_batch


@pytest.fixture
def root(tmp_path):
    """A store with topic 't' (3 partitions, 300 records) and an empty topic 'empty'."""
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "1m"})
    t = s.create_topic("t", SCHEMA, partitions=3)
    for start in range(0, 300, 50):
        t.append(make_batch(start, 50), key="key")
    s.create_topic("empty", SCHEMA, partitions=2)
    return str(tmp_path / "store")


def source(root, **options):
    """The data source as Spark builds it: options in a case-insensitive dict, with the path."""
    return PafkaDataSource(CaseInsensitiveDict({"path": root, **options}))


def batch_partitions(root, **options):
    ds = source(root, **options)
    return ds.reader(ds.schema()).partitions()


def raises(fn, match):
    with pytest.raises(PafkaError, match=match) as e:
        fn()
    return str(e.value)


def test_batch_read_with_nothing_to_read_gives_no_rows(spark, root):
    # PySpark plans one InputPartition(None) when partitions() returns none; read() of it
    # must yield nothing rather than fail on the missing plan.
    latest = Store.open(root).topic("t").latest_offsets()
    at_end = json.dumps({"t": {str(p): o for p, o in latest.items()}})
    for options in ({"topic": "empty"}, {"topic": "t", "startingTimestamp": "99999999999999"},
                    {"topic": "t", "startingOffsets": at_end, "endingOffsets": at_end}):
        reader = spark.read.format("pafka")
        for k, v in options.items():
            reader = reader.option(k, v)
        assert reader.load(root).count() == 0, options
    ds = source(root, topic="t")
    schema = ds.schema()
    for reader in (ds.reader(schema), ds.streamReader(schema)):
        assert list(reader.read(InputPartition(None))) == []


def test_offsets_naming_a_missing_topic_or_partition_fail_at_load(spark, root):
    cases = [
        ("startingOffsets", '{"t": {"9": 0}}',
         "'startingOffsets' names partition 9 of topic 't', which has partitions 0..2"),
        ("startingOffsets", '{"nope": {"0": 0}}',
         "'startingOffsets' names topic 'nope', which this read does not read \\(it reads t\\)"),
        ("endingOffsets", '{"t": {"3": 5}}', "'endingOffsets' names partition 3 of topic 't'"),
        ("startingOffsetsByTimestamp", '{"t": {"9": 0}}',
         "'startingOffsetsByTimestamp' names partition 9 of topic 't', which has partitions"),
        ("startingOffsetsByTimestamp", '{"nope": {"0": 0}}',
         "'startingOffsetsByTimestamp' names topic 'nope'"),
    ]
    for option, value, message in cases:
        with pytest.raises(Exception, match=message):  # load() alone: no action runs
            spark.read.format("pafka").option("topic", "t").option(option, value).load(root)
        with pytest.raises(Exception, match=message):
            spark.readStream.format("pafka").option("topic", "t").option(option, value) \
                .load(root)


def test_batch_offsets_outside_the_log_fail_at_planning_naming_the_range(root):
    latest0 = Store.open(root).topic("t").latest_offsets()[0]
    where = f"topic 't' partition 0 \\(earliest 0, latest {latest0}\\)"
    cases = [
        ({"startingOffsets": '{"t": {"0": 99999}}'},
         f"startingOffsets: offset 99999 of {where} is beyond the latest offset"),
        ({"endingOffsets": '{"t": {"0": 99999}}'},
         f"endingOffsets: offset 99999 of {where} is beyond the latest offset"),
        ({"startingOffsets": '{"t": {"0": 5}}', "endingOffsets": '{"t": {"0": 1}}'},
         f"endingOffsets: offset 1 of {where} is below the starting offset 5"),
        # As in Kafka's source: a batch read neither starts at latest nor ends at earliest.
        ({"startingOffsets": "latest"}, "'startingOffsets' is 'latest' in a batch read"),
        ({"startingOffsets": '{"t": {"1": -1}}'},
         "'startingOffsets' is -1 \\(latest\\) for t partition 1 in a batch read"),
        ({"endingOffsets": '{"t": {"0": -2}}'}, "'endingOffsets'.*-2, earliest, cannot end"),
        ({"endingOffsets": "earliest"}, "'endingOffsets'.*cannot end at the earliest"),
        ({"startingOffsets": '{"t": {"00": 5, "0": 6}}'},
         "'startingOffsets' gives partition 0 of topic 't' twice \\(as '00' and '0'\\)"),
        ({"startingOffsets": '{"t": {"0": 5, "0": 6}}'}, "'startingOffsets' gives '0' twice"),
    ]
    for options, message in cases:
        raises(lambda options=options: batch_partitions(root, topic="t", **options), message)
    (part,) = batch_partitions(root, topic="t", startingOffsets='{"t": {"0": 5}}',
                               endingOffsets='{"t": {"0": 5, "1": 7}}')
    # Partition 2, which endingOffsets does not name, is read to its latest offset.
    assert [(p.partition, p.start, p.end) for p in part.plans] == [
        (1, 0, 7), (2, 0, Store.open(root).topic("t").latest_offsets()[2])]


def test_streaming_position_beyond_the_latest_offset_is_data_loss(root, caplog):
    # Offsets only grow: a start beyond the latest offset is a mistake or a topic created
    # again, not records still to come. As Kafka's source: fail, or with failOnDataLoss=false
    # continue from the latest offset.
    latest = Store.open(root).topic("t").latest_offsets()
    beyond = '{"t": {"0": 99999}}'
    ds = source(root, topic="t", startingOffsets=beyond)
    with pytest.raises(DataLoss, match="startingOffsets: offset 99999 of topic 't' partition 0 "
                                       f"\\(earliest 0, latest {latest[0]}\\)"):
        ds.streamReader(ds.schema()).initialOffset()
    lenient = source(root, topic="t", startingOffsets=beyond, failOnDataLoss="false")
    reader = lenient.streamReader(lenient.schema())
    with caplog.at_level(logging.WARNING):
        assert reader.initialOffset()["t"]["0"] == latest[0]
    assert "continuing from the latest offset" in caplog.text
    # The same for a checkpointed position beyond the log (the topic was created again).
    reader = ds.streamReader(ds.schema())
    start = {"t": {"0": 500, "1": 0, "2": 0}}
    with pytest.raises(DataLoss, match="position 500 in topic 't' partition 0"):
        reader.latestOffset(start, reader.getDefaultReadLimit())
    assert lenient.streamReader(lenient.schema()).latestOffset(
        start, reader.getDefaultReadLimit())["t"]["0"] == latest[0]


def test_stream_reader_errors_are_raised_from_its_first_call_not_masked(spark, root, tmp_path):
    # PySpark's streaming runner masks an error raised by streamReader() with its own
    # UnboundLocalError; with .schema(...) no pafka code runs at load(), so the query fails.
    from pafka_source.reader import FailedStreamReader
    ds = source(root, topic="nope")
    reader = ds.streamReader(StructType([StructField("key", LongType())]))
    assert isinstance(reader, FailedStreamReader)
    with pytest.raises(PafkaError, match="topic 'nope' does not exist"):
        reader.initialOffset()
    schema = "key bigint, ts bigint, value string"
    cases = [({"topic": "nope"}, schema, "topic 'nope' does not exist"),
             ({"topic": "t"}, "a int", "do not set another with .schema\\(\\)"),
             ({"topic": "t", "endingOffsets": "latest"}, None,
              "option 'endingOffsets' applies to batch reads \\(spark.read\\) only")]
    for i, (options, given, message) in enumerate(cases):
        r = spark.readStream.format("pafka")
        r = r.schema(given) if given else r
        for k, v in options.items():
            r = r.option(k, v)
        q = r.load(root).writeStream.format("noop").trigger(availableNow=True) \
            .option("checkpointLocation", str(tmp_path / f"ck{i}")).start()
        with pytest.raises(Exception, match=message) as e:
            q.awaitTermination(120)
        assert "UnboundLocalError" not in str(e.value)


def test_max_bytes_per_trigger_is_a_size_with_bounds_of_its_own():
    base = {"path": "/r", "topic": "t"}
    assert SourceOptions.parse({**base, "maxBytesPerTrigger": "1k"}).max_bytes == 1024
    assert SourceOptions.parse({**base, "maxBytesPerTrigger": "2000g"}).max_bytes == 2000 << 30
    for bad in ("0", "-1", "abc", "1.5m"):
        raises(lambda bad=bad: SourceOptions.parse({**base, "maxBytesPerTrigger": bad}),
               f"invalid value '{bad}' for option 'maxBytesPerTrigger': expected a size in "
               "bytes from 1 to 2\\^63-1")


def test_options_that_cannot_work_together_or_are_empty_are_rejected():
    base = {"path": "/r", "topic": "t"}
    cases = [
        ({"minOffsetsPerTrigger": "100", "maxOffsetsPerTrigger": "10"},
         "minOffsetsPerTrigger=100 is above maxOffsetsPerTrigger=10"),
        ({"consumerGroup": ""}, "invalid value '' for option 'consumerGroup'"),
        ({"startingTimestamp": "-5"}, "invalid value '-5' for option 'startingTimestamp'.*>= 0"),
    ]
    for options, message in cases:
        raises(lambda options=options: SourceOptions.parse({**base, **options}), message)
    for option in ("writerId", "key", "timestampColumn"):
        raises(lambda option=option: SinkOptions.parse({**base, option: " "}),
               f"invalid value ' ' for option '{option}'")


def test_options_without_effect_are_logged(root, caplog):
    with caplog.at_level(logging.WARNING):
        batch_partitions(root, topic="t", maxOffsetsPerTrigger="5", consumerGroup="g")
    assert "maxOffsetsPerTrigger, consumerGroup only apply to streaming reads" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ds = source(root, topic="t", maxTriggerDelay="5s")
        ds.streamReader(ds.schema())
    assert "maxTriggerDelay has no effect without minOffsetsPerTrigger" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        source(root, topic="w", writerId="me").writer(StructType([StructField("x", LongType())]),
                                                      False)
    assert "writerId only applies to streaming writes" in caplog.text


def test_reading_a_path_without_a_store_fails_and_creates_nothing(spark, tmp_path):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(Exception, match=f"no pafka store at {missing} \\(no _store.json\\)"):
        spark.read.format("pafka").option("topic", "t").load(str(missing))
    ds = source(str(missing), topic="t")
    reader = ds.streamReader(StructType([StructField("key", LongType())]))
    with pytest.raises(PafkaError, match="no pafka store at"):
        reader.initialOffset()
    assert not missing.exists()


def test_messages_spell_options_as_users_do_and_list_one_sides_options(root):
    base = {"path": root, "topic": "t"}
    msg = raises(lambda: SourceOptions.parse({**base, "foo": "1"}), "unknown source option 'foo'")
    assert "'foo'. Known source options: columns, consumerGroup, endingOffsets" in msg
    assert "writerId" not in msg and "key," not in msg
    raises(lambda: SourceOptions.parse({**base, "startingoffset": "earliest"}),
           "did you mean startingOffsets or startingOffsetsByTimestamp\\? Known source options")
    raises(lambda: SourceOptions.parse({**base, "key": "k"}),
           "option 'key' applies to a write, not to a read")
    raises(lambda: SinkOptions.parse({**base, "startingoffsets": "earliest"}),
           "option 'startingOffsets' applies to a read, not to a write. Known sink options")
    raises(lambda: SourceOptions.parse({**base, "minpartitions": "0"}),
           "option 'minPartitions'")
    raises(lambda: SourceOptions.parse({**base, "startingtimestamp": "1", "startingoffsets": "x"}),
           "set at most one of startingOffsets, startingTimestamp")
    msg = raises(lambda: SourceOptions.parse({**base, "endingoffsets": "bogus"}),
                 "for option 'endingOffsets': expected latest, or JSON")
    assert "earliest" not in msg


def _sink(root, fields, **options):
    return source(root, **options).writer(StructType(fields), False)


def test_sink_checks_column_types_before_it_creates_the_topic(root):
    cases = [
        ([StructField("a", ArrayType(LongType()))], {"key": "a"},
         "cannot partition by a key column of type list<element: int64>"),
        ([StructField("d", DecimalType(10, 2))], {"key": "d"},
         "cannot partition by a key column of type decimal128\\(10, 2\\)"),
        ([StructField("v", StringType())], {"timestampColumn": "v"},
         "timestamp column 'v' must be a timestamp, date or integer \\(milliseconds\\) column, "
         "not string"),
    ]
    for fields, options, message in cases:
        raises(lambda fields=fields, options=options: _sink(root, fields, topic="new",
                                                            **options), message)
    assert "new" not in Store.open(root).topics()


def test_partitions_option_cannot_resize_an_existing_topic(root):
    fields = [StructField(f.name, LongType() if f.type == pa.int64() else StringType())
              for f in SCHEMA]
    raises(lambda: _sink(root, fields, topic="t", partitions="5"),
           "option 'partitions' is 5, but topic 't' already exists with 3 partitions")
    _sink(root, fields, topic="t", partitions="3")
    assert Store.open(root).topic("t").partitions == 3
    assert os.path.exists(os.path.join(root, "_store.json"))


def test_small_ranges_share_spark_partitions_and_big_ones_stay_apart(spark, root, monkeypatch):
    import pafka_source.planning as planning

    def spans(parts):
        return [[(p.partition, p.start, p.end) for p in part.plans] for part in parts]

    latest = Store.open(root).topic("t").latest_offsets()
    assert min(latest.values()) > 10  # each partition holds records of the fixture
    everything = sorted((p, 0, n) for p, n in latest.items())
    # All three ranges are small: one task reads them, one after the other.
    (whole,) = spans(batch_partitions(root, topic="t"))
    assert sorted(whole) == everything
    # minPartitions asks for parallelism: pieces stay apart.
    apart = spans(batch_partitions(root, topic="t", minPartitions="6"))
    assert len(apart) >= 6 and all(len(plans) == 1 for plans in apart)
    # A cap on records per Spark partition holds for packed partitions too.
    capped = spans(batch_partitions(root, topic="t", maxRecordsPerPartition="40"))
    assert all(sum(e - s for _, s, e in plans) <= 40 for plans in capped)
    assert sorted(x for plans in capped for x in plans) == sorted(
        (p, lo, min(n, lo + step)) for p, n in latest.items()
        for step in [-(-n // -(-n // 40))] for lo in range(0, n, step))
    # Ranges at or above the packing size each get their own.
    monkeypatch.setattr(planning, "PACK_RECORDS", min(latest.values()))
    assert sorted(spans(batch_partitions(root, topic="t"))) == [[r] for r in everything]
    monkeypatch.undo()
    # Through Spark: every record once, with its own partition and offset.
    df = spark.read.format("pafka").option("topic", "t").option("includeMetadata", "true") \
        .load(root)
    assert df.rdd.getNumPartitions() == 1
    got = sorted((r["_partition"], r["_offset"]) for r in df.select("_partition", "_offset")
                 .collect())
    assert got == [(p, o) for p, n in sorted(latest.items()) for o in range(n)]


# -- starting from a consumer group ---------------------------------------------------------------
def test_starting_offsets_group_needs_a_consumer_group_and_cannot_end_a_read():
    base = {"path": "/r", "topic": "t"}
    raises(lambda: SourceOptions.parse({**base, "startingOffsets": "group"}),
           "option 'startingOffsets' is 'group', but no 'consumerGroup' is set")
    raises(lambda: SourceOptions.parse({**base, "endingOffsets": "group",
                                        "consumerGroup": "g"}),
           "for option 'endingOffsets'.*cannot end at a consumer group's offsets")
    opts = SourceOptions.parse({**base, "startingOffsets": "Group", "consumerGroup": "g"})
    assert (opts.starting, opts.consumer_group) == ("group", "g")
    msg = raises(lambda: SourceOptions.parse({**base, "startingOffsets": "grop"}),
                 "invalid value 'grop' for option 'startingOffsets'")
    assert "group (with consumerGroup)" in msg


def test_a_stream_starts_at_the_groups_offsets_and_earliest_where_it_has_none(root):
    t = Store.open(root).topic("t")
    t.set_position("g", {0: 7, 2: 11})
    ds = source(root, topic="t", startingOffsets="group", consumerGroup="g")
    first = ds.streamReader(ds.schema()).initialOffset()
    # Beside the offsets, the topic's incarnation (a deleted topic's offsets never apply).
    assert first == {"t": {"0": 7, "1": 0, "2": 11}, "_ids": {"t": t.id}}
    # A batch read starts there too, and reads to the end; it records no position.
    parts = batch_partitions(root, topic="t", startingOffsets="group", consumerGroup="g")
    latest = t.latest_offsets()
    assert sorted((p.partition, p.start, p.end) for part in parts for p in part.plans) == [
        (0, 7, latest[0]), (1, 0, latest[1]), (2, 11, latest[2])]
    assert t.positions() == {"g": {0: 7, 2: 11}}


def test_a_group_the_topics_do_not_have_is_an_error_listing_their_groups(root, caplog):
    t = Store.open(root).topic("t")
    t.set_position("billing", {0: 1})
    t.set_position("audit", {0: 2})
    ds = source(root, topic="t", startingOffsets="group", consumerGroup="biling")
    with pytest.raises(PafkaError, match="option 'startingOffsets' is 'group', but consumer "
                                         "group 'biling' has no committed offsets on topic "
                                         "'t'; groups there: audit, billing"):
        ds.streamReader(ds.schema()).initialOffset()
    with pytest.raises(PafkaError, match="groups there: audit, billing"):
        batch_partitions(root, topic="t", startingOffsets="group", consumerGroup="biling")
    # The batch read uses consumerGroup: it is not reported as a streaming-only option.
    with caplog.at_level(logging.WARNING):
        batch_partitions(root, topic="t", startingOffsets="group", consumerGroup="audit")
    assert "only apply to streaming reads" not in caplog.text


# -- skipping a range lost to retention -------------------------------------------------------
@pytest.fixture
def gap(tmp_path):
    """Topic 'g', one partition of 64 KiB segments, 80 appends of 100 records; retention
    then deleted its oldest segments. Returns (root, earliest, latest)."""
    root = str(tmp_path / "gap")
    t = Store.open(root, {"log.segment.bytes": "64k"}).create_topic("g", SCHEMA)
    for i in range(80):
        t.append(make_batch(i * 100, 100))
    Store.open(root, {"log.retention.bytes": "100k"}).topic("g").apply_retention()
    earliest, latest = t.earliest_offsets()[0], t.latest_offsets()[0]
    assert 100 < earliest < latest - 100
    return root, earliest, latest


def test_a_limited_stream_jumps_over_a_lost_range_in_one_step(gap, caplog):
    from pyspark.sql.streaming.datasource import ReadMaxRows
    root, earliest, latest = gap
    ds = source(root, topic="g", failOnDataLoss="false", maxOffsetsPerTrigger="100")
    reader = ds.streamReader(ds.schema())
    with caplog.at_level(logging.WARNING):
        end = reader.latestOffset({"g": {"0": 20}}, ReadMaxRows(100))
        assert split_ids(end)[0] == {"g": {"0": earliest + 100}}  # not 120: only lost ones
        (part,) = reader.partitions({"g": {"0": 20}}, end)
    assert [(p.start, p.end) for p in part.plans] == [(earliest, earliest + 100)]
    warned = [r.getMessage() for r in caplog.records if "deleted by retention" in r.getMessage()]
    assert warned == [f"topic 'g' partition 0: offsets [20, {earliest}) were deleted by "
                      f"retention before they were read; skipping to offset {earliest} "
                      "(failOnDataLoss=false)"]  # once, though planning sees the gap too
    # failOnDataLoss=true leaves the position alone: planning the batch fails naming the gap.
    strict = source(root, topic="g", maxOffsetsPerTrigger="100")
    reader = strict.streamReader(strict.schema())
    end = reader.latestOffset({"g": {"0": 20}}, ReadMaxRows(100))
    assert split_ids(end)[0] == {"g": {"0": 120}}
    with pytest.raises(DataLoss, match=rf"offsets \[20, {earliest}\) were deleted"):
        reader.partitions({"g": {"0": 20}}, end)


def test_waiting_for_min_offsets_does_not_run_a_batch_over_a_lost_range(gap):
    from pyspark.sql.streaming.datasource import ReadMinRows
    root, earliest, latest = gap
    ds = source(root, topic="g", failOnDataLoss="false", minOffsetsPerTrigger="100000")
    reader = ds.streamReader(ds.schema())
    assert split_ids(reader.latestOffset({"g": {"0": 20}}, ReadMinRows(100000)))[0] == \
        {"g": {"0": 20}}
