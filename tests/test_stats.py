"""Chunk statistics: what a chunk records when written, and reads that skip chunks by them
(and by the key a chunk was routed by) without ever losing a row."""

import datetime
import logging
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet  # noqa: F401 - pa.parquet
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tier_store import InvalidArgument, Store, chunk_filter, partition_of
from tier_store.stats import compute, parsed

UTC = datetime.UTC
SCHEMA = pa.schema([("user", pa.int32()), ("score", pa.float64()), ("name", pa.string()),
                    ("at", pa.timestamp("ms", tz="UTC")), ("day", pa.date32()),
                    ("flag", pa.bool_())])


def _table(lo: int, n: int, rng: np.random.Generator) -> pa.Table:
    users = rng.integers(lo, lo + 50, n).astype(np.int32)
    score = rng.normal(size=n)
    score[rng.random(n) < 0.05] = np.nan
    names = [None if rng.random() < 0.1 else f"u{u:04d}" for u in users]
    at = pa.array(lo * 60_000 + rng.integers(0, 60_000, n), pa.timestamp("ms", tz="UTC"))
    return pa.table({"user": users, "score": score, "name": pa.array(names, pa.string()),
                     "at": at, "day": pa.array(lo // 10 + rng.integers(0, 3, n).astype(np.int32),
                                               pa.date32()),
                     "flag": rng.random(n) < 0.5}, schema=SCHEMA)


@pytest.fixture(scope="module")
def topic(tmp_path_factory):
    """Four partitions of chunks routed by ``user``, each chunk over a band of users."""
    s = Store.open(str(tmp_path_factory.mktemp("stats")), {"log.segment.bytes": "256k",
                                                          "log.chunk.statistics": "all"})
    t = s.create_topic("t", SCHEMA, partitions=4)
    rng = np.random.default_rng(7)
    for lo in range(0, 2000, 50):
        t.append(_table(lo, 200, rng), key="user")
    return t


def _all(t, p):
    return pa.Table.from_batches(list(t.read(p, 0)), SCHEMA)


def test_a_chunk_records_bounds_nulls_and_its_routing():
    nan = float("nan")
    b = pa.record_batch({"i": pa.array([3, None, -2], pa.int8()),
                         "f": pa.array([1.5, nan, -0.5]),
                         "g": pa.array([None, None], pa.float32()).take([0, 1, 0]),
                         "s": pa.array(["b" * 70, "a", None]),
                         "ns": pa.array([1_001, 2_999, 5], pa.timestamp("ns")),
                         "d64": pa.array([86_400_000 + 1, 3 * 86_400_000 - 1, 0], pa.date64()),
                         "x": pa.array([True, False, None])})
    got = compute([b], b.schema, ("i", 8))
    c = got["c"]
    assert c["i"] == [-2, 3, 1]
    assert c["f"] == [-0.5, None, 0]  # a NaN: no upper bound (Spark puts NaN above all)
    assert c["g"] == [None, None, 3]
    assert c["s"] == ["a", None, 1]  # the longest string is cut: no upper bound
    assert c["ns"] == [0, 3, 0]  # microseconds, rounded outwards
    assert c["d64"] == [0, 3, 0]
    assert "x" not in c and got["r"] == ["i", 8]
    long_min = compute([pa.record_batch({"s": ["é" * 80]})], pa.schema([("s", pa.string())]))
    assert long_min["c"]["s"] == ["é" * 64, None, 0]


def test_reads_with_conditions_give_exactly_the_rows_and_skip_chunks(topic):
    t = topic
    full = pa.concat_tables(_all(t, p) for p in range(4))
    for where in ([("user", "=", 1234)], [("user", "in", [7, 1999, 5000])],
                  [("at", ">=", datetime.datetime(1970, 1, 1, 20, tzinfo=UTC))],
                  [("score", ">", 2.5)], [("name", "is null"), ("user", "<", 100)],
                  [("name", "<=", "u0100")], [("day", "=", datetime.date(1970, 2, 1))]):
        want = full.filter(_expr(where))
        got = [b for p in range(4) for b in t.read(p, 0, where=where)]
        got = pa.Table.from_batches(got, SCHEMA) if got else SCHEMA.empty_table()
        assert _rows(got) == _rows(want), where
    # user = 1234 is read from one chunk of its partition.
    keep = chunk_filter(t.schema, [("user", "=", 1234)])
    planned = {p: len(t.plan_reads([(p, 0, None)], keep)[0].chunks) for p in range(4)}
    home = int(partition_of(pa.array([1234], pa.int32()), 4)[0])
    assert planned == {p: int(p == home) for p in range(4)}
    # A column selection with a condition on another column.
    got = list(t.read(home, 0, columns=["name"], where=[("user", "=", 1234)]))
    assert got and all(b.schema.names == ["name"] for b in got)


def _expr(where):
    from tier_store.stats import expression
    return expression(where)


def _rows(table):
    return sorted(map(str, table.to_pylist()))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_no_condition_ever_skips_a_chunk_holding_a_row_it_passes(topic, data):
    """A chunk whose statistics are said to exclude a condition holds no row passing it."""
    t = topic
    p = data.draw(st.integers(0, 3))
    col = data.draw(st.sampled_from(["user", "score", "name", "at", "day"]))
    op = data.draw(st.sampled_from(["=", "<", "<=", ">", ">=", "in", "is null",
                                    "is not null"]))
    value = {"user": st.integers(-10, 2100), "score": st.floats(-4, 4),
             "name": st.text("u0123456789", max_size=6),
             "at": st.integers(-10, 130_000_000).map(
                 lambda ms: datetime.datetime.fromtimestamp(ms / 1000, UTC)),
             "day": st.integers(-2, 210).map(
                 lambda d: datetime.date(1970, 1, 1) + datetime.timedelta(days=d))}[col]
    if op in ("is null", "is not null"):
        cond = (col, op)
    elif op == "in":
        cond = (col, op, data.draw(st.lists(value, min_size=1, max_size=3)))
    else:
        cond = (col, op, data.draw(value))
    keep = chunk_filter(t.schema, [cond])
    plan = t.plan_read(p, 0)
    kept = {c.base for c in t.plan_reads([(p, 0, None)], keep)[0].chunks}
    expr = _expr([cond])
    for c in plan.chunks:
        if c.base in kept:
            continue
        rows = pa.Table.from_batches(list(t.read(p, c.base, c.base + c.records)), SCHEMA)
        assert rows.filter(expr).num_rows == 0, (cond, c.base)


def test_by_default_string_columns_have_no_statistics(tmp_path):
    t = Store.open(str(tmp_path)).create_topic("t", SCHEMA, partitions=1)
    t.append(_table(0, 100, np.random.default_rng(5)), partition=0)
    st = parsed(t.state().part(0).chunks.overlapping(0, 100)["st"][0])
    assert sorted(st["c"]) == ["at", "day", "score", "user"]
    keep = chunk_filter(t.schema, [("name", "=", "zzz")])  # kept: nothing bounds it
    assert len(t.plan_reads([(0, 0, None)], keep)[0].chunks) == 1
    assert list(t.read(0, 0, where=[("name", "=", "zzz")])) == []


def test_routing_survives_added_partitions(tmp_path):
    s = Store.open(str(tmp_path))
    t = s.create_topic("t", SCHEMA, partitions=3)
    rng = np.random.default_rng(1)
    t.append(_table(0, 500, rng), key="user")
    t.add_partitions(2)
    t.append(_table(0, 500, rng), key="user")
    full = pa.concat_tables(_all(t, p) for p in range(5))
    for u in range(0, 50, 7):
        where = [("user", "=", u)]
        got = sum(b.num_rows for p in range(5) for b in t.read(p, 0, where=where))
        assert got == full.filter(pc.field("user") == u).num_rows > 0
        keep = chunk_filter(t.schema, where)
        assert sum(len(t.plan_reads([(p, 0, None)], keep)[0].chunks) for p in range(5)) == 2


def test_statistics_live_on_in_checkpoints_pieces_and_the_lake(tmp_path):
    from migration import MigrationService
    root = str(tmp_path / "s")
    s = Store.open(root, {"storage.tiers.types": "FILE,LAKE", "log.segment.bytes": "64k",
                          "storage.tiers.1.sizes": "1m", "log.checkpoint.interval": 5,
                          "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA, partitions=1)
    rng = np.random.default_rng(3)
    service = MigrationService(s)
    for lo in range(0, 1000, 25):
        t.append(_table(lo, 500, rng), partition=0)
        service.run_once()
    service.run_once()
    assert any(x.tier == 2 for x in t.segments())
    where = [("user", ">=", 990)]
    for again in (t, Store.open(root).topic("t")):  # this handle, and one from the log
        plan = again.plan_read(0, 0)
        keep = chunk_filter(again.schema, where)
        kept = again.plan_reads([(0, 0, None)], keep)[0].chunks
        assert 0 < len(kept) < len(plan.chunks) / 4
        lake = [c for c in plan.chunks if c.lake is not None]
        assert lake and not {c.base for c in lake} <= {c.base for c in kept}
        got = sum(b.num_rows for b in again.read(0, 0, where=where))
        assert got == pa.Table.from_batches(list(again.read(0, 0)), SCHEMA).filter(
            pc.field("user") >= 990).num_rows > 0
    # The Delta table's add actions bound each file's columns, as outside readers trust them.
    import deltalake
    import polars as pl
    uri = s.tier(2).table_uri(t.name, t.id)
    dt = deltalake.DeltaTable(uri)
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert len(adds) >= 2
    for a in adds:
        rows = pa.parquet.read_table(os.path.join(uri, a["path"]))
        for col in ("user", "score", "name", "at", "day"):
            mm = pc.min_max(rows.column(col))
            assert a[f"null_count.{col}"] == rows.column(col).null_count
            if col != "score":  # a NaN leaves a float column's max out
                assert a[f"min.{col}"] <= mm["min"].as_py() and \
                    a[f"max.{col}"] >= mm["max"].as_py(), (col, a)
    lake_rows = sum(x.records for x in t.segments() if x.tier == 2)
    for lo in (0, 500, 990):
        want = pl.scan_delta(uri).filter(pl.col("user") >= lo).select(pl.len()).collect().item()
        mine = sum(b.num_rows for x in t.segments() if x.tier == 2
                   for b in t.read(0, x.base_offset, x.end_offset, where=[("user", ">=", lo)]))
        assert want == mine <= lake_rows


def test_chunks_without_statistics_are_read(tmp_path, caplog):
    s = Store.open(str(tmp_path), {"log.chunk.statistics": "none"})
    t = s.create_topic("t", SCHEMA, partitions=1)
    rng = np.random.default_rng(2)
    for lo in (0, 500):
        t.append(_table(lo, 100, rng), partition=0)
    keep = chunk_filter(t.schema, [("user", "<", 0)])
    assert len(t.plan_reads([(0, 0, None)], keep)[0].chunks) == 2
    assert list(t.read(0, 0, where=[("user", "<", 0)])) == []
    # Statistics that do not parse, or of the wrong types, skip nothing.
    caplog.set_level(logging.WARNING)
    assert keep.keeps("{not json", 5, 0)
    assert keep.keeps({"c": {"user": ["a", 5, 0]}}, 5, 0)
    assert keep.keeps({"c": {"user": [1, 2, 9]}}, 5, 0)  # more nulls than rows: ignored
    assert keep.keeps({"c": [1]}, 5, 0) and parsed({"c": [1]}) is None
    assert not keep.keeps({"c": {"user": [1, 2, 0]}}, 5, 0)


@pytest.mark.parametrize("cond, why", [
    (("nope", "=", 1), "not a column"),
    (("user", "~", 1), "op '~' is not one of"),
    (("user", "=", "1"), "is not a value of a int32 column"),
    (("user", "in", []), "non-empty list"),
    (("flag", "=", True), "has no statistics"),
    (("user", "is null", 3), "takes no value"),
    (("user", "="), "needs a value"),
    (("user",), "a filter is"),
])
def test_a_bad_condition_names_the_filter(topic, cond, why):
    with pytest.raises(InvalidArgument, match=why):
        list(topic.read(0, 0, where=[cond]))


def test_float_bounds_stay_finite():
    b = pa.record_batch({"f": [-math.inf, 1.0, math.inf]})
    assert compute([b], b.schema)["c"]["f"] == [None, None, 0]
