"""A topic's schema evolving under Spark: the sink's mergeSchema, and a streaming query that
meets a change (a real SparkSession, local[2])."""

import pyarrow as pa
import pytest

from tier_store import Store

from .conftest import SCHEMA
from .support import fill_keyed as _fill

WITH_COUNTRY = SCHEMA.append(pa.field("country", pa.string()))


def _rows(spark, root, topic):
    df = spark.read.format("pafka").option("topic", topic).load(str(root))
    return sorted(tuple(r) for r in df.collect())


def test_merge_schema_evolves_the_topic_and_reads_old_rows_with_nulls(spark, tmp_path):
    _fill(tmp_path, "t", 100)
    more = spark.sql("select id + 100 as key, id as ts, 'v' as value, 'fr' as country "
                     "from range(5)")
    sink = more.write.format("pafka").option("topic", "t").mode("append")
    with pytest.raises(Exception, match="unexpected column 'country'"):
        sink.save(str(tmp_path))  # without mergeSchema: refused as before
    assert Store.open(tmp_path).topic("t").schema.equals(SCHEMA)
    sink.option("mergeSchema", "true").save(str(tmp_path))
    t = Store.open(tmp_path).topic("t")
    assert t.schema.equals(WITH_COUNTRY)
    rows = _rows(spark, tmp_path, "t")
    assert len(rows) == 105 and [r[3] for r in rows] == [None] * 100 + ["fr"] * 5
    # A DataFrame without a column of the topic writes nulls there.
    fewer = spark.sql("select id + 200 as key, id as ts, 'de' as country from range(2)")
    fewer.write.format("pafka").option("topic", "t").option("mergeSchema", "true") \
        .mode("append").save(str(tmp_path))
    assert _rows(spark, tmp_path, "t")[-2:] == [(200, 0, None, "de"), (201, 1, None, "de")]
    # A type no allowed change reaches is refused, naming the column.
    bad = spark.sql("select 'a' as key, 0L as ts, 'x' as value")
    with pytest.raises(Exception, match="column 'key' as string, which the topic's int64 "
                                        "cannot take or widen to"):
        bad.write.format("pafka").option("topic", "t").option("mergeSchema", "true") \
            .mode("append").save(str(tmp_path))
    assert sum(Store.open(tmp_path).topic("t").latest_offsets().values()) == 107


def test_a_running_query_stops_when_its_topic_evolves_and_a_restart_reads_all(spark,
                                                                             tmp_path):
    from pyspark.errors import StreamingQueryException
    _, src = _fill(tmp_path, "src", 1000)
    ck = tmp_path / "ck"

    def start():
        return (spark.readStream.format("pafka").option("topic", "src")
                .option("startingOffsets", "earliest").load(str(tmp_path))
                .writeStream.format("pafka").option("topic", "dst")
                .option("mergeSchema", "true").option("checkpointLocation", str(ck))
                .trigger(processingTime="200 milliseconds").start(str(tmp_path)))

    q = start()
    try:
        q.processAllAvailable()
        src.evolve(WITH_COUNTRY)
        src.append(pa.record_batch([pa.array([1000, 1001]), pa.array([0, 0]),
                                    pa.array(["v", "v"]), pa.array(["fr", "fr"])],
                                   schema=WITH_COUNTRY), key="key")
        with pytest.raises(StreamingQueryException) as e:
            q.awaitTermination(120)
    finally:
        q.stop()
    text = str(e.value)
    assert "topic 'src' changed its schema after this query started (added country " \
           "string): restart the query" in text, text[-3000:]
    assert "Traceback" not in text.splitlines()[0]
    # Nothing of the new schema went through; every older record did, once.
    assert [r[0] for r in _rows(spark, tmp_path, "dst")] == list(range(1000))
    # Restarted from its checkpoint, the query reads on in the new schema, exactly once.
    q = start()
    try:
        q.processAllAvailable()
    finally:
        q.stop()
    rows = _rows(spark, tmp_path, "dst")
    assert [r[0] for r in rows] == list(range(1002))
    assert [r[3] for r in rows[-2:]] == ["fr", "fr"] and rows[0][3] is None


def test_the_columns_option_reads_those_columns_in_that_order(spark, tmp_path):
    _, t = _fill(tmp_path, "t", 50)
    t.evolve(WITH_COUNTRY)
    df = (spark.read.format("pafka").option("topic", "t").option("columns", "country, key")
          .option("includeMetadata", "true").load(str(tmp_path)))
    assert df.columns == ["country", "key", "_topic", "_partition", "_offset", "_timestamp"]
    rows = df.select("country", "key").collect()
    assert sorted(r[1] for r in rows) == list(range(50)) and {r[0] for r in rows} == {None}
    with pytest.raises(Exception, match="option 'columns' \\(topic 't'\\): no column\\(s\\) "
                                        "'nope'; the columns are key, ts, value, country"):
        spark.read.format("pafka").option("topic", "t").option("columns", "key,nope") \
            .load(str(tmp_path)).collect()
