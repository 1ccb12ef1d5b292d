"""Filters Spark pushes to a batch read (pushFilters=true) on a real SparkSession: a skipped
range is never a wrong answer."""

import random

import pyarrow as pa
import pytest

from .support import fill_keyed as _fill

PUSHDOWN = "spark.sql.python.filterPushdown.enabled"


@pytest.fixture
def pushdown(spark):
    spark.conf.set(PUSHDOWN, "true")
    yield spark
    spark.conf.unset(PUSHDOWN)


def _read(spark, root, push: bool):
    r = spark.read.format("pafka").option("topic", "t").option("includeMetadata", "true")
    if push:
        r = r.option("pushFilters", "true")
    return r.load(str(root))


def _predicate(rng: random.Random, micros: list[int]) -> str:
    """A random conjunction over the metadata columns."""
    terms = []
    if rng.random() < 0.5:
        terms.append(rng.choice(["_partition = 1", "_partition in (0, 2)", "_partition >= 1",
                                 "_partition < 1", "_partition <= 0", "_partition > 2"]))
    if rng.random() < 0.5:
        a = rng.randrange(0, 1200)
        terms.append(rng.choice([f"_offset >= {a}", f"_offset > {a}", f"_offset < {a}",
                                 f"_offset <= {a}", f"_offset = {a}",
                                 f"_offset in ({a}, {a + 7})"]))
    if rng.random() < 0.7 or not terms:
        t = rng.choice(micros) + rng.choice([-1, 0, 0, 1, 999, 1000])
        op = rng.choice([">", ">=", "<", "<=", "="])
        terms.append(f"_timestamp {op} timestamp_micros({t})")
    if rng.random() < 0.2:
        terms.append(rng.choice(["_topic = 't'", "_topic = 'x'", "_topic in ('t', 'u')"]))
    if rng.random() < 0.6:  # the data columns: chunk statistics and the key's routing
        k = rng.randrange(-5, 3005)
        terms.append(rng.choice([f"key = {k}", f"key in ({k}, {k + 1}, {k * 7 % 3000})",
                                 f"key > {k}", f"key <= {k}", f"ts >= {k * 10}",
                                 f"ts < {k * 10}", f"value = 'v{k}'", f"value > 'v{k}'",
                                 "key is not null", "value is null"]))
    return " and ".join(terms)


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_pushed_filters_give_the_rows_of_the_same_query_without_them(pushdown, tmp_path,
                                                                     zone):
    spark = pushdown
    _fill(tmp_path, "t", 3000, partitions=3, per_append=50)  # 60 commits, one ms or more apart
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        plain, pushing = _read(spark, tmp_path, False), _read(spark, tmp_path, True)
        micros = sorted({r[0] for r in plain.selectExpr("unix_micros(_timestamp)").collect()})
        assert len(micros) > 10
        rng = random.Random(zone)
        for _ in range(10):
            where = _predicate(rng, micros)
            want = sorted(tuple(r) for r in plain.where(where).select("key", "_offset").collect())
            got = sorted(tuple(r) for r in pushing.where(where).select("key", "_offset")
                         .collect())
            assert got == want, where
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")


def test_pushed_filters_skip_partitions_and_offsets_before_reading(tmp_path):
    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThan, StringContains

    from pafka_source.options import SourceOptions
    from pafka_source.reader import PafkaFilteringBatchReader
    from pafka_source.types import spark_schema
    _, t = _fill(tmp_path, "t", 3000, partitions=3)
    opts = SourceOptions.parse({"path": str(tmp_path), "topic": "t",
                                "includeMetadata": "true", "pushFilters": "true"})
    reader = PafkaFilteringBatchReader(opts, spark_schema(t.schema, True))
    filters = [In(("_partition",), (1, 2)), GreaterThan(("_offset",), 99),
               LessThan(("_offset",), 120), EqualTo(("_topic",), "t"),
               StringContains(("value",), "x")]
    assert list(reader.pushFilters(filters)) == filters  # all back to Spark
    plans = [p for part in reader.partitions() for p in part.plans]
    assert sorted((p.partition, p.start, p.end) for p in plans) == [(1, 100, 120),
                                                                   (2, 100, 120)]
    list(reader.pushFilters([EqualTo(("_topic",), "other")]))
    assert reader.partitions() == []
    # Contradicting filters keep nothing (not the last one's topic).
    list(reader.pushFilters([EqualTo(("_topic",), "u"), EqualTo(("_topic",), "u"),
                             In(("_topic",), ("t",))]))
    assert reader.partitions() == []


def test_data_column_filters_skip_chunks_by_statistics_and_the_key(tmp_path):
    from pyspark.sql.datasource import EqualTo, GreaterThanOrEqual, In, IsNull, LessThan

    from pafka_source.options import SourceOptions
    from pafka_source.reader import PafkaFilteringBatchReader
    from pafka_source.types import spark_schema
    from tier_store import partition_of
    _, t = _fill(tmp_path, "t", 3000, partitions=3, per_append=100)  # 30 chunks a partition
    opts = SourceOptions.parse({"path": str(tmp_path), "topic": "t", "pushFilters": "true"})
    reader = PafkaFilteringBatchReader(opts, spark_schema(t.schema, False))

    def planned(filters):
        list(reader.pushFilters(filters))
        return [(p.partition, c.base) for part in reader.partitions() for p in part.plans
                for c in p.chunks]

    assert len(planned([])) == 90
    # key = 1234: the one chunk of its partition whose keys span it (appends of 100 keys).
    home = int(partition_of(pa.array([1234]), 3)[0])
    got = planned([EqualTo(("KEY",), 1234)])  # Spark's names are case-insensitive
    assert len(got) == 1 and got[0][0] == home
    assert len(planned([In(("key",), (5, 2995))])) <= 2
    # A range: the chunks of keys 2500.. in each partition (5 appends), none of the others.
    assert len(planned([GreaterThanOrEqual(("ts",), 25000)])) == 15
    assert planned([LessThan(("key",), 0)]) == []
    assert planned([IsNull(("ts",))]) == []  # no chunk holds a null
    # A string column has no statistics by default (log.chunk.statistics=numeric).
    assert len(planned([IsNull(("value",))])) == 90


def test_push_filters_without_the_spark_setting_names_it(spark, tmp_path):
    _fill(tmp_path, "t", 10)
    with pytest.raises(Exception, match=PUSHDOWN.replace(".", "\\.")):
        _read(spark, tmp_path, True).where("_partition = 0").collect()
