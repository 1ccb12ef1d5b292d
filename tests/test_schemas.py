"""Schema evolution rules and reading old data in a new schema (tier_store.schemas)."""

from __future__ import annotations

import decimal

import pyarrow as pa
import pytest

from tier_store import SchemaMismatch
from tier_store.schemas import Adapter, changes, check, merge, problems, widens

BASE = pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string()),
                  ("score", pa.float32()), ("price", pa.decimal128(10, 2))])


def _with(schema: pa.Schema, name: str, field: pa.Field) -> pa.Schema:
    return schema.set(schema.get_field_index(name), field)


@pytest.mark.parametrize("old,new", [
    (pa.int8(), pa.int16()), (pa.int8(), pa.int64()), (pa.int16(), pa.int32()),
    (pa.int32(), pa.int64()), (pa.float16(), pa.float32()), (pa.float32(), pa.float64()),
    (pa.decimal128(10, 2), pa.decimal128(12, 2)), (pa.decimal128(30, 4), pa.decimal256(40, 4)),
])
def test_allowed_widenings(old, new):
    assert widens(old, new) and not widens(new, old) and not widens(old, old)


@pytest.mark.parametrize("old,new", [
    (pa.int64(), pa.int32()), (pa.int32(), pa.float64()), (pa.uint8(), pa.int16()),
    (pa.float64(), pa.float32()), (pa.decimal128(10, 2), pa.decimal128(12, 3)),
    (pa.decimal128(10, 2), pa.decimal128(9, 2)), (pa.string(), pa.large_string()),
    (pa.timestamp("ms"), pa.timestamp("us")), (pa.int32(), pa.string()),
])
def test_other_type_changes_are_not_widenings(old, new):
    assert not widens(old, new)


def test_each_allowed_change_passes_and_is_described():
    cases = {
        "added note string": BASE.append(pa.field("note", pa.string())),
        "added first int64": BASE.insert(0, pa.field("first", pa.int64())),
        "widened id int32 → int64": _with(BASE, "id", pa.field("id", pa.int64(), False)),
        "widened score float → double": _with(BASE, "score", pa.field("score", pa.float64())),
        "widened price decimal128(10, 2) → decimal128(18, 2)":
            _with(BASE, "price", pa.field("price", pa.decimal128(18, 2))),
        "made id nullable": _with(BASE, "id", pa.field("id", pa.int32())),
    }
    for said, new in cases.items():
        assert problems(BASE, new) == [], said
        check(BASE, new, "t")
        assert changes(BASE, new) == [said]
    assert problems(BASE, BASE) == [] and changes(BASE, BASE) == []
    # A time zone only says how an instant is shown: not a change of the data.
    ts = pa.schema([("at", pa.timestamp("ms", tz="UTC"))])
    assert problems(ts, pa.schema([("at", pa.timestamp("ms", tz="Europe/Paris"))])) == []


@pytest.mark.parametrize("new,words", [
    (BASE.remove(1), ["'name'", "is gone", "never dropped or renamed"]),
    (_with(BASE, "name", pa.field("label", pa.string())), ["'name'", "is gone"]),
    (pa.schema([BASE.field(1), BASE.field(0), BASE.field(2), BASE.field(3)]),
     ["change their order", "never moves"]),
    (BASE.append(pa.field("note", pa.string(), nullable=False)),
     ["new column 'note'", "must be nullable"]),
    (_with(BASE, "id", pa.field("id", pa.int16(), False)),
     ["'id'", "int32 → int16", "never narrows"]),
    (_with(BASE, "name", pa.field("name", pa.int64())),
     ["'name'", "string → int64", "only widens"]),
    (_with(BASE, "score", pa.field("score", pa.float32(), nullable=False)),
     ["'score' becomes non-null", "stays nullable"]),
    (_with(BASE, "price", pa.field("price", pa.decimal128(12, 3))),
     ["'price'", "same scale"]),
    (BASE.append(pa.field("name", pa.int8())), ["'name'", "more than once"]),
    (pa.schema([("tags", pa.list_(pa.field("item", pa.string(), nullable=False)))]),
     ["'tags'", "a nested type never changes"]),
])
def test_each_refused_change_names_the_column_and_the_rule(new, words):
    old = BASE if "tags" not in new.names else pa.schema([("tags", pa.list_(pa.string()))])
    found = problems(old, new)
    assert found, new
    with pytest.raises(SchemaMismatch) as e:
        check(old, new, "clicks")
    text = str(e.value)
    assert "topic 'clicks'" in text and "allowed: add a nullable column" in text
    for w in words:
        assert w in text, (w, text)


def test_merge_adds_new_columns_and_widens_where_the_data_needs():
    data = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float32()),
                      ("price", pa.decimal128(10, 2)), ("country", pa.string())])
    merged = merge(BASE, data, "t")
    assert merged.names == ["id", "name", "score", "price", "country"]
    # A nullable DataFrame column leaves NOT NULL as it is (Spark's columns are nullable).
    assert merged.field("id").type == pa.int64() and not merged.field("id").nullable
    assert merged.field("country").nullable
    assert changes(BASE, merged) == ["widened id int32 → int64", "added country string"]
    # Data in the topic's own schema, or narrower, or lacking a nullable column, fits as is.
    assert merge(BASE, BASE, "t") is BASE
    narrow = _with(BASE, "score", pa.field("score", pa.float16())).remove(1)
    assert merge(BASE, narrow, "t") is BASE
    with pytest.raises(SchemaMismatch, match="column 'name' as int64.*cannot take or widen"):
        merge(BASE, _with(BASE, "name", pa.field("name", pa.int64())), "t")


def test_an_adapter_reads_an_old_batch_in_the_new_schema():
    old = pa.record_batch([pa.array([1, 2, 3], pa.int32()), pa.array(["a", None, "c"]),
                           pa.array([1.5, 2.5, None], pa.float32()),
                           pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("3.00")],
                                    pa.decimal128(10, 2))],
                          schema=BASE)
    new = pa.schema([pa.field("first", pa.int8()), pa.field("id", pa.int64()),
                     ("name", pa.string()), ("score", pa.float64()),
                     ("price", pa.decimal128(18, 2)), ("note", pa.string())])
    assert problems(BASE, new) == []
    got = Adapter(BASE, new)(old)
    assert got.schema.equals(new)
    assert got.to_pydict() == {
        "first": [None] * 3, "id": [1, 2, 3], "name": ["a", None, "c"],
        "score": [1.5, 2.5, None], "price": [decimal.Decimal("1.25"), None,
                                             decimal.Decimal("3.00")], "note": [None] * 3}
    # An unchanged column is the same memory, not a copy.
    assert got.column(2).buffers()[2].address == old.column(1).buffers()[2].address
    same = Adapter(BASE, BASE)
    assert same.identity and same(old) is old


# -- a topic's schema evolving in its commit log ---------------------------------------------
V1 = pa.schema([pa.field("id", pa.int32(), nullable=False), ("name", pa.string())])
V2 = pa.schema([pa.field("id", pa.int64()), ("name", pa.string()), ("country", pa.string())])


def _v1(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int32()),
                            pa.array([f"n{i}" for i in range(start, start + n)])], schema=V1)


def _v2(start: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(start, start + n), pa.int64()),
                            pa.array([f"n{i}" for i in range(start, start + n)]),
                            pa.array(["fr"] * n)], schema=V2)


def _rows(topic, partition: int = 0) -> list[tuple]:
    out = []
    for b in topic.read(partition, 0):
        assert b.schema.equals(topic.schema)
        d = b.to_pydict()
        out += list(zip(*(d[n] for n in b.schema.names), strict=True))
    return out


def test_a_topic_evolves_and_reads_its_old_chunks_in_the_new_schema(file_store):
    from tier_store import Store
    t = file_store.create_topic("t", V1, partitions=1)
    for i in range(0, 3000, 100):  # several 64 KiB segments of the old schema
        t.append(_v1(i, 100))
    before = t.version
    assert t.evolve(V2).equals(V2) and t.version == before + 1
    assert t.evolve(V2).equals(V2) and t.version == before + 1  # idempotent: no entry
    t.append(_v2(3000, 10))
    want = [(i, f"n{i}", None) for i in range(3000)] + \
        [(i, f"n{i}", "fr") for i in range(3000, 3010)]
    assert _rows(t) == want
    # Another process's handle, from the entries; then from a checkpoint holding the history.
    root = file_store.root
    assert _rows(Store.open(root, create=False).topic("t")) == want
    t.write_checkpoint()
    fresh = Store.open(root, create=False).topic("t")
    assert fresh.schema.equals(V2) and _rows(fresh) == want
    history = fresh.state().schemas
    assert [h[0] for h in history] == [0, before + 1]
    # Data in the old schema is refused now, naming what differs, as any other mismatch.
    with pytest.raises(SchemaMismatch, match="missing columns \\['country'\\]"):
        t.append(_v1(0, 1))


def test_a_read_of_some_columns_gives_those_in_the_order_asked(file_store):
    from tier_store import InvalidArgument
    t = file_store.create_topic("t", V1, partitions=1)
    t.append(_v1(0, 3))
    t.evolve(V2)
    t.append(_v2(3, 2))
    got = [b for b in t.read(0, 0, columns=["country", "id"])]
    assert all(b.schema.names == ["country", "id"] for b in got)
    assert pa.Table.from_batches(got).to_pydict() == {"country": [None] * 3 + ["fr"] * 2,
                                                      "id": [0, 1, 2, 3, 4]}
    assert pa.Table.from_batches(list(t.read(0, 3, columns=("name",)))).column(0).to_pylist() \
        == ["n3", "n4"]
    for bad, words in ((["nope"], "no column(s) 'nope'; the columns are id, name, country"),
                       (["id", "id"], "a column named twice"), ([], "no column named"),
                       ("id", "as a list of names")):
        with pytest.raises(InvalidArgument, match=words.replace("(", "\\(").replace(
                ")", "\\)")):
            list(t.read(0, 0, columns=bad))


def test_a_refused_evolution_publishes_nothing(file_store):
    t = file_store.create_topic("t", V1, partitions=1)
    t.append(_v1(0, 5))
    v = t.version
    for bad in (V1.remove(1), _with(V1, "id", pa.field("id", pa.int16(), False)),
                V1.append(pa.field("x", pa.int8(), nullable=False))):
        with pytest.raises(SchemaMismatch, match="topic 't' cannot change its schema"):
            t.evolve(bad)
    with pytest.raises(Exception, match="evolve takes a pyarrow.Schema, got dict"):
        t.evolve({"id": "int64"})
    assert t.version == v and t.schema.equals(V1) and _rows(t) == [(i, f"n{i}") for i in range(5)]


def test_concurrent_evolutions_are_decided_one_after_another(file_store):
    from tier_store import Store
    a = file_store.create_topic("t", V1, partitions=1)
    b = Store.open(file_store.root, create=False).topic("t")  # a stale handle: at V1
    a.evolve(V1.append(pa.field("x", pa.string())))
    # b proposes V1 + y against the schema a left: x would be dropped, so it is refused.
    with pytest.raises(SchemaMismatch, match="column 'x' \\(string\\) is gone"):
        b.evolve(V1.append(pa.field("y", pa.string())))
    both = V1.append(pa.field("x", pa.string())).append(pa.field("y", pa.string()))
    assert b.evolve(both).equals(both) and a.refresh().schema.equals(both)


def test_a_forged_schema_entry_is_a_corrupt_log():
    from tier_store import CorruptLog
    from tier_store.entries import CreateEntry, SchemaEntry
    from tier_store.schemas import schema_to_text
    from tier_store.state import TopicState
    st = TopicState("t")
    st.apply(0, CreateEntry(1, schema_to_text(V1), 1, {}, "id"))
    narrow = _with(V1, "id", pa.field("id", pa.int8(), False))
    with pytest.raises(CorruptLog, match="version 1 changes the schema as no evolution may: "
                                         "column 'id' changes type int32 → int8"):
        st.apply(1, SchemaEntry(2, schema_to_text(narrow)))
    with pytest.raises(CorruptLog, match="holds a malformed schema"):
        st.apply(1, SchemaEntry(2, "bm90IGEgc2NoZW1h"))
    assert st.version == 0 and st.schema.equals(V1)
    st.apply(1, SchemaEntry(2, schema_to_text(V2)))
    assert st.schema.equals(V2) and [h[0] for h in st.schemas] == [0, 1]


PAD = "x" * 200  # enough bytes that the migration service demotes segments


def test_a_topic_in_a_lake_evolves_its_delta_table_and_reads_old_files(tmp_path):
    import deltalake
    import polars as pl

    from migration import MigrationService
    from tier_store import Store
    s = Store.open(str(tmp_path / "s"), {"storage.tiers.types": "FILE,LAKE",
                                        "storage.tiers.first.paths": str(tmp_path / "t1"),
                                        "storage.tiers.first.sizes": "2m",
                                        "log.segment.bytes": "64k",
                                        "storage.migrate.threshold": 0.1})
    base = V1.append(pa.field("score", pa.float32())).append(
        pa.field("tags", pa.list_(pa.string())))
    t = s.create_topic("t", base, partitions=1)
    # Before the table exists, any allowed change goes: the table is made in the new schema.
    wide = _with(base, "id", pa.field("id", pa.int64(), False))
    t.evolve(wide)
    for i in range(0, 4000, 100):
        t.append(pa.record_batch([pa.array(range(i, i + 100), pa.int64()),
                                  pa.array([f"n{j}" + PAD for j in range(i, i + 100)]),
                                  pa.array([0.5] * 100, pa.float32()),
                                  pa.array([["a", "b"]] * 100)], schema=wide))
    MigrationService(s).run_once()
    uri = s.tier(2).table_uri("t", t.id)
    assert deltalake.DeltaTable(uri).file_uris()
    # Once it holds files, a widening is refused before anything is published...
    v = t.version
    with pytest.raises(SchemaMismatch, match="Delta table, which cannot widen a type.*"
                                             "widened score float → double"):
        t.evolve(_with(wide, "score", pa.field("score", pa.float64())))
    assert t.version == v
    # ... while an added column and a dropped NOT NULL change the table in the same step.
    v2 = _with(wide, "id", pa.field("id", pa.int64())).append(pa.field("country", pa.string()))
    t.evolve(v2)
    fields = {f.name: f for f in deltalake.DeltaTable(uri).schema().fields}
    assert fields["country"].nullable and fields["id"].nullable
    # Readers skip files by the new column's statistics too (a list column has none).
    assert deltalake.DeltaTable(uri).metadata().configuration[
        "delta.dataSkippingStatsColumns"] == "_offset,_timestamp,id,name,score,country"
    t.append(pa.record_batch([pa.array([9000], pa.int64()), pa.array(["late"]),
                              pa.array([1.5], pa.float32()), pa.array([["z"]]),
                              pa.array(["fr"])], schema=v2))
    MigrationService(s).run_once()
    # pafka reads the lake's old files in the new schema; so does another engine.
    got = [r for b in t.read(0, 0) for r in zip(*b.to_pydict().values(), strict=True)]
    # A nested column of an old lake file reads as it was written (not as nulls).
    assert got[:2] == [(0, "n0" + PAD, 0.5, ["a", "b"], None),
                       (1, "n1" + PAD, 0.5, ["a", "b"], None)]
    assert len(got) == 4001
    assert got[-1] == (9000, "late", 1.5, ["z"], "fr")
    lake_part = pa.Table.from_batches(list(t.read(0, 0, 2, columns=["country", "score"])))
    assert lake_part.to_pydict() == {"country": [None, None], "score": [0.5, 0.5]}
    df = pl.read_delta(uri)
    assert 0 < df.height <= 4001 and df["country"].null_count() >= df.height - 1


def test_a_chunk_not_in_the_topics_schema_or_an_older_one_is_refused():
    from tier_store import CorruptSegment
    from tier_store.chunk import _encode
    from tier_store.chunk_decoder import ChunkDecoder
    for schema, data in (
            (pa.schema([("id", pa.string()), ("name", pa.string())]),  # a type it never had
             [pa.array(["1"]), pa.array(["a"])]),
            (pa.schema([("name", pa.string())]), [pa.array(["a"])])):  # NOT NULL id missing
        batch = pa.record_batch(data, schema=schema)
        buf = _encode([batch], schema, "none")
        with pytest.raises(CorruptSegment, match="does not hold the topic's schema or an older"):
            ChunkDecoder(target=V1).batches(buf, lambda: "chunk")
    # A string column written as large_string by an older writer still reads.
    old = pa.schema([pa.field("id", pa.int32(), False), ("name", pa.large_string())])
    buf = _encode([pa.record_batch([pa.array([1], pa.int32()), pa.array(["a"], pa.large_string())],
                                   schema=old)], old, "none")
    assert ChunkDecoder(target=V1).batches(buf, lambda: "chunk")[0].schema.equals(V1)
