"""The lake's files and table (tier_store.lake, tier_store.lake_table): what pafka writes,
read back verified by pafka, and read by engines written elsewhere (delta-rs, Polars)."""

from __future__ import annotations

import os

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tier_store.errors import CorruptSegment, PafkaError
from tier_store.lake import (
    LakeFile,
    build_file,
    decode_groups,
    decode_timed,
    file_rel,
    table_schema,
    write_local,
)

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.string())])
TS = 1_700_000_000_000


def runs(base: int, batches: int, rows: int, ts: int = TS):
    """``batches`` batches of ``rows`` records from offset ``base``, one commit time each."""
    out = []
    for i in range(batches):
        at = base + i * rows
        keys = np.arange(at, at + rows)
        out.append((pa.record_batch([pa.array(keys), pa.array([f"v{k}" for k in keys])],
                                    schema=SCHEMA), at, ts + i, True))
    return out


def fetch(data: pa.Buffer, f: LakeFile, groups):
    footer = data.slice(f.footer_pos, f.footer_length)
    return footer, [(g, data.slice(g.pos, g.length)) for g in groups]


def test_a_file_holds_its_offsets_in_row_groups_the_log_can_name(tmp_path):
    f, data = build_file(SCHEMA, 3, (1000, 21000), runs(1000, 40, 500), group_bytes=64 << 10)
    assert f.rel == file_rel(3, 1000, 21000) == "_partition=3/00000000000000001000-" \
        "00000000000000021000.parquet"
    assert len(f.groups) > 3 and (f.base, f.end) == (1000, 21000)
    assert [g.base for g in f.groups] == sorted(g.base for g in f.groups)
    assert sum(g.records for g in f.groups) == 20000
    for a, b in zip(f.groups, f.groups[1:], strict=False):
        assert a.base + a.records == b.base and a.pos + a.length <= b.pos
    # Any one row group reads back alone, from its bytes and the footer only.
    g = f.groups[2]
    footer, parts = fetch(data, f, [g])
    batch = pa.Table.from_batches(decode_groups("x", f, footer, parts, SCHEMA))
    assert batch.schema == SCHEMA
    assert batch.column("key").to_pylist() == list(range(g.base, g.base + g.records))
    # Batches are cut where the commit time changes, as the log's chunks were.
    timed = decode_timed("x", f, footer, parts, SCHEMA)
    assert [(b.num_rows, ts) for b, ts in timed] == \
        [(500, TS + (g.base + i - 1000) // 500) for i in range(0, g.records, 500)]
    # Only some columns: the others' bytes are not decoded.
    only = pa.Table.from_batches(decode_groups("x", f, footer, parts, SCHEMA,
                                               columns=["value"]))
    assert only.schema.names == ["value"] and only.num_rows == g.records


def test_a_damaged_or_swapped_file_is_corrupt_never_wrong_rows(tmp_path):
    f, data = build_file(SCHEMA, 0, (0, 0), runs(0, 20, 500), group_bytes=32 << 10)
    g = f.groups[1]
    footer, parts = fetch(data, f, [g])
    raw = bytearray(parts[0][1].to_pybytes())
    raw[len(raw) // 2] ^= 0x40
    with pytest.raises(CorruptSegment, match="does not match its checksum"):
        decode_groups("x", f, footer, [(g, pa.py_buffer(bytes(raw)))], SCHEMA)
    bad_footer = bytearray(footer.to_pybytes())
    bad_footer[10] ^= 1
    with pytest.raises(CorruptSegment, match="footer"):
        decode_groups("x", f, pa.py_buffer(bytes(bad_footer)), parts, SCHEMA)
    # Another file's bytes under the same name (same sizes, other offsets): checksums differ.
    other, odata = build_file(SCHEMA, 0, (1, 1), runs(10_000, 20, 500), group_bytes=32 << 10)
    ofooter, oparts = fetch(odata, other, [other.groups[1]])
    with pytest.raises(CorruptSegment):
        decode_groups("x", f, ofooter, [(g, oparts[0][1])], SCHEMA)
    # A log that names the wrong offsets for a good group: its _offset column says no.
    og = other.groups[1]
    lying = LakeFile(other.rel, other.size, other.footer_pos, other.footer_length,
                     other.footer_checksum,
                     (type(og)(og.pos, og.length, 0, og.records, og.checksum, og.ts),))
    with pytest.raises(CorruptSegment, match="does not hold offsets"):
        decode_groups("x", lying, ofooter, [(lying.groups[0], oparts[0][1])], SCHEMA)


def test_rows_go_in_offset_order_a_gap_starts_a_group_and_lake_columns_are_reserved():
    with pytest.raises(PafkaError, match="offset 400 came after 500"):
        build_file(SCHEMA, 0, (0, 1), [*runs(0, 1, 500), *runs(400, 1, 10)])
    # Another writer's segment holds [500, 600): the file's groups each hold a run.
    f, _ = build_file(SCHEMA, 0, (0, 1), [*runs(0, 1, 500), *runs(600, 1, 10)])
    assert [(g.base, g.records) for g in f.groups] == [(0, 500), (600, 10)]
    assert (f.base, f.end) == (0, 610)
    with pytest.raises(PafkaError, match="_offset"):
        table_schema(pa.schema([("_offset", pa.int64())]))


def _write_and_add(table, root, partition, base, txn, batches=4, rows=250):
    f, data = build_file(SCHEMA, partition, (txn - 1, txn - 1), runs(base, batches, rows),
                         group_bytes=8 << 10)
    write_local(os.path.join(table.uri, f.rel), data)
    return f, table.add(partition, f, TS, TS + batches - 1, txn)


def test_demotions_commit_once_each_and_engines_read_the_table(tmp_path):
    from tier_store.lake_table import LakeTable
    table = LakeTable(str(tmp_path / "lake"), "clicks", "a" * 32, SCHEMA)
    assert table.committed_version(0) == 0 and table.version() == -1
    f0, v0 = _write_and_add(table, tmp_path, 0, 0, 1)
    f1, v1 = _write_and_add(table, tmp_path, 1, 0, 1)
    f2, v2 = _write_and_add(table, tmp_path, 0, 1000, 3)
    assert (v0, v1, v2) == (1, 2, 3)  # version 0 created the table
    assert table.committed_version(0) == 3 and table.committed_version(1) == 1
    assert table.held(0) == {(0, 0): f0.rel, (2, 2): f2.rel} and table.held(1) == {(0, 0): f1.rel}
    # A file added again (a demotion retried by another process) is still counted once:
    # Delta keys files by path.
    assert table.add(0, f2, TS, TS, 3) == 4
    assert deltalake.DeltaTable(table.uri).version() == 4 == table.version()

    # delta-rs: every row once, with the lake's columns.
    got = deltalake.DeltaTable(table.uri).to_pyarrow_table()
    assert got.num_rows == 3000
    assert sorted(zip(got.column("_partition").to_pylist(), got.column("_offset").to_pylist(),
                      strict=True)) == \
        sorted([(0, o) for o in range(2000)] + [(1, o) for o in range(1000)])
    assert set(got.schema.names) == {"key", "value", "_offset", "_timestamp", "_partition"}
    # Polars: a scan pruned by partition and offset.
    df = (pl.scan_delta(table.uri).filter((pl.col("_partition") == 0) & (pl.col("_offset")
          >= 1990)).select("key", "_offset").collect())
    assert df["_offset"].to_list() == list(range(1990, 2000))
    assert df["key"].to_list() == list(range(1990, 2000))
    # The statistics delta-rs keeps let it skip files by offset.
    files = pa.table(deltalake.DeltaTable(table.uri).get_add_actions(flatten=True)).to_pydict()
    assert sorted(files["min._offset"]) == [0, 0, 1000]
    assert sorted(files["max._offset"]) == [999, 999, 1999]


def test_a_recreated_topic_gets_a_table_of_its_own(tmp_path):
    from tier_store.lake_table import LakeTable
    old = LakeTable(str(tmp_path / "lake"), "t", "1" * 32, SCHEMA)
    _write_and_add(old, tmp_path, 0, 0, 1)
    new = LakeTable(str(tmp_path / "lake"), "t", "2" * 32, SCHEMA)
    assert new.uri != old.uri and new.committed_version(0) == 0
    with pytest.raises(PafkaError, match="no id"):
        LakeTable(str(tmp_path / "lake"), "t", "", SCHEMA)
