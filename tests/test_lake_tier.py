"""The LAKE tier: a store's oldest segments as a Delta table, read back by pafka as its log
and by other engines as a table."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import textwrap
import time

import deltalake
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from migration import MigrationService
from tier_store import ConfigError, Consumer, CorruptSegment, Store, check_topic, execute
from tier_store.awsenv import delta_storage_options
from tier_store.maintenance.demote import LAKE_POINTS
from tier_store.tiers import LakeTier

from .conftest import PYTHON, ROOT, SCHEMA, make_batch
from .support import pmem_hdd_config


def _lake_store(path, **extra):
    return Store.open(str(path), {"storage.tiers.types": "FILE,LAKE",
                                  "storage.tiers.1.sizes": "256k", "log.segment.bytes": "64k",
                                  "log.cleanup.grace.ms": 0,
                                  "storage.migrate.threshold": 0.5, **extra})


def _fill(topic, batches=80, per=150, partitions=2, seed=1):
    rng = random.Random(seed)
    at = [0] * partitions
    for i in range(batches):
        p = i % partitions
        n = rng.randint(1, per)
        topic.append(make_batch(p * 1_000_000 + at[p], n), partition=p)
        at[p] += n
        if i % 10 == 9:  # commit times over several milliseconds, however fast the disk
            time.sleep(0.003)


def _log_view(topic, p, start=0, end=None):
    """(offset, key, commit time) of each record read through the log."""
    out = []
    for pb in execute(topic.plan_read(p, start, end)):
        keys = pb.batch.column("key").to_pylist()
        out += [(pb.offset + i, k, pb.timestamp) for i, k in enumerate(keys)]
    return out


def _duckdb_rows(uri):
    """(partition, offset) of every row of the Delta table at ``uri``, read by DuckDB's delta
    extension (installed from PyPI: no download at run time)."""
    import glob

    import duckdb
    import duckdb_extension_delta
    ext = glob.glob(os.path.join(os.path.dirname(duckdb_extension_delta.__file__),
                                 "extensions", "*", "delta.duckdb_extension"))
    con = duckdb.connect()
    con.execute(f"LOAD '{ext[0]}'")
    return sorted(con.execute(f"SELECT _partition, _offset FROM delta_scan('{uri}')")
                  .fetchall())


def _table(store, topic):
    return deltalake.DeltaTable(store.tier(len(store.tiers)).table_uri(topic.name, topic.id))


def test_a_lake_tier_comes_last_holds_no_appends_and_takes_no_size(tmp_path):
    for types in ("LAKE,FILE", "FILE,LAKE,HDD", "LAKE"):
        with pytest.raises(ConfigError, match="LAKE tier .* comes last"):
            Store.open(str(tmp_path / types.replace(",", "-")), {"storage.tiers.types": types})
    with pytest.raises(ConfigError, match="storage.tiers.2.sizes=1048576: a LAKE tier"):
        Store.open(str(tmp_path / "sized"), {"storage.tiers.types": "FILE,LAKE",
                                             "storage.tiers.2.sizes": "1m"})
    s = _lake_store(tmp_path / "s")
    assert isinstance(s.tier(2), LakeTier)
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, partitions=1)
    assert {x.tier for x in t.segments()} == {1}  # appends never land in the lake


def test_demoted_segments_read_the_same_through_the_log_and_every_engine(tmp_path):
    s = _lake_store(tmp_path / "s")
    t = s.create_topic("clicks", SCHEMA, partitions=2)
    _fill(t)
    before = [_log_view(t, p) for p in range(2)]
    results = MigrationService(s).run_once()
    assert results and {r.to_tier for r in results} == {2}
    fresh = Store.open(str(tmp_path / "s")).topic("clicks")
    tiers = {x.tier for x in fresh.segments()}
    assert tiers == {1, 2}  # the fresh data stays on tier 1
    # The log reads the same records, offsets and commit times, across the boundary too.
    assert [_log_view(fresh, p) for p in range(2)] == before
    rng = random.Random(7)
    for _ in range(20):
        p = rng.randrange(2)
        end = fresh.latest_offsets()[p]
        a = rng.randrange(end)
        b = rng.randrange(a, end + 1)
        assert _log_view(fresh, p, a, b) == before[p][a:b]
    c = Consumer(s, "clicks", None)
    got = {0: [], 1: []}
    while batches := c.poll(max_records=10_000):
        for fb in batches:
            got[fb.partition] += fb.batch.column("key").to_pylist()
    assert [got[p] for p in range(2)] == [[k for _, k, _ in before[p]] for p in range(2)]
    assert check_topic(fresh).ok

    # Other engines read the table: every demoted record once, with its offset and time.
    lake = [(p, o, k, ts) for p in range(2) for x in fresh.segments() if x.partition == p
            and x.tier == 2 for o, k, ts in before[p][x.base_offset:x.end_offset]]
    table = _table(s, fresh).to_pyarrow_table()
    rows = sorted(zip(table.column("_partition").to_pylist(),
                      table.column("_offset").to_pylist(), table.column("key").to_pylist(),
                      table.column("_timestamp").cast(pa.timestamp("ms", tz="UTC"))
                      .cast(pa.int64()).to_pylist(), strict=True))
    assert rows == sorted(lake)
    df = pl.scan_delta(_table(s, fresh).table_uri).filter(pl.col("_partition") == 1).collect()
    assert sorted(df["_offset"].to_list()) == [o for p, o, _, _ in sorted(lake) if p == 1]
    assert _duckdb_rows(_table(s, fresh).table_uri) == sorted((p, o) for p, o, _, _ in lake)
    # Any Parquet reader reads the table's files as they are.
    files = _table(s, fresh).file_uris()
    direct = pa.concat_tables([pq.read_table(f) for f in files])
    assert direct.num_rows == len(lake)


def test_checkpoints_keep_lake_segments_and_older_releases_are_told(tmp_path):
    s = _lake_store(tmp_path / "s", **{"log.checkpoint.interval": 2})
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, partitions=1)
    before = _log_view(t, 0)
    MigrationService(s).run_once()
    t.append(make_batch(10**7, 3), partition=0)  # a checkpoint after the move
    t.write_checkpoint()
    fresh = Store.open(str(tmp_path / "s")).topic("t")
    assert _log_view(fresh, 0)[:len(before)] == before
    lakes = [x for x in fresh.state().segments.values() if x.lake is not None]
    assert lakes and all(x.tier == 2 for x in lakes)


def test_retention_drops_lake_segments_from_the_log_and_the_table_keeps_them(tmp_path):
    s = _lake_store(tmp_path / "s")
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, partitions=1)
    MigrationService(s).run_once()
    in_lake = sum(x.records for x in t.segments() if x.tier == 2)
    assert in_lake
    t.set_config({"retention.bytes": 1})
    dropped = t.apply_retention()
    assert dropped and not [x for x in t.segments() if x.tier == 2]
    MigrationService(s).run_once()  # and garbage collection leaves the table alone
    assert _table(s, t).to_pyarrow_table().num_rows == in_lake
    assert all(os.path.exists(f) for f in _table(s, t).file_uris())
    # Deleting the topic keeps its table too.
    uri = _table(s, t).table_uri
    s.delete_topic("t")
    assert deltalake.DeltaTable(uri).to_pyarrow_table().num_rows == in_lake


def test_a_damaged_lake_file_is_corrupt_naming_it_never_a_wrong_row(tmp_path):
    s = _lake_store(tmp_path / "s")
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, partitions=1)
    MigrationService(s).run_once()
    seg = next(x for x in t.segments() if x.tier == 2)
    path = seg.path
    rows = t.state().part(0).chunks.segment_rows(int(seg.id.split("-")[1]))
    pos = int(rows["pos"][0]) + int(rows["length"][0]) // 2
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptSegment, match=os.path.basename(path)):
        list(t.read(0, seg.base_offset, seg.end_offset))
    report = check_topic(t)
    assert not report.ok and os.path.basename(path) in report.problems[0]
    # A reader that skips corrupt data skips exactly that row group, and says so.
    kept = [b for b in t.read(0, seg.base_offset, seg.end_offset, skip_corrupt=True)]
    assert sum(b.num_rows for b in kept) == seg.records - int(rows["records"][0])


def test_a_tiered_store_demotes_from_its_last_disk_tier(tmp_path, shm_dir):
    conf = pmem_hdd_config(shm_dir, **{"storage.tiers.types": "PMEM,HDD,LAKE",
                                       "storage.tiers.2.sizes": "256k",
                                       "log.cleanup.grace.ms": 0,
                                       "storage.migrate.threshold": 0.5})
    s = Store.open(str(tmp_path / "s"), conf)
    t = s.create_topic("t", SCHEMA, partitions=2)
    for seed in range(6):  # as a stream fills it, with the service keeping up
        _fill(t, batches=60, per=300, seed=seed)
        MigrationService(s).run_once()
    before = [_log_view(t, p) for p in range(2)]
    MigrationService(s).run_once()
    assert {x.tier for x in t.segments()} >= {2, 3}
    assert [_log_view(t, p) for p in range(2)] == before
    assert check_topic(t).ok
    # The lake holds the oldest records: every lake segment is older than every other.
    for p in range(2):
        segs = sorted((x for x in t.segments() if x.partition == p), key=lambda x: x.base_offset)
        tiers = [x.tier for x in segs]
        assert tiers == sorted(tiers, reverse=True)


@pytest.mark.parametrize("lake_on", ["disk", "s3"])
@pytest.mark.parametrize("point", [*LAKE_POINTS, "move.committed"])
def test_a_demotion_killed_at_any_step_leaves_no_duplicate_and_loses_nothing(
        tmp_path, point, lake_on, request):
    lake = {} if lake_on == "disk" else \
        {"storage.tiers.2.paths": request.getfixturevalue("s3_root") + "/lake"}
    s = _lake_store(tmp_path / "s", **lake)
    t = s.create_topic("t", SCHEMA, partitions=2)
    _fill(t)
    want = [_log_view(t, p) for p in range(2)]
    code = textwrap.dedent(f"""
        from migration import MigrationService
        from tier_store import Store
        MigrationService(Store.open({str(tmp_path / "s")!r})).run_once()
    """)
    env = dict(os.environ, PAFKA_CRASH_POINT=point, PAFKA_CRASH_AFTER="1")
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    after = Store.open(str(tmp_path / "s")).topic("t")
    assert [_log_view(after, p) for p in range(2)] == want
    assert check_topic(after).ok
    s2 = Store.open(str(tmp_path / "s"))
    MigrationService(s2).run_once()
    t2 = s2.topic("t")
    assert [_log_view(t2, p) for p in range(2)] == want
    assert check_topic(t2).ok
    # The table holds each demoted record once, and only those the log says are there.
    table = _table(s2, t2).to_pyarrow_table() if lake_on == "disk" else \
        deltalake.DeltaTable(s2.tier(2).table_uri("t", t2.id),
                             storage_options=delta_storage_options()).to_pyarrow_table()
    keys = table.column("key").to_pylist()
    assert len(keys) == len(set(keys))
    in_lake = {(x.partition, o) for x in t2.segments() if x.tier == 2
               for o in range(x.base_offset, x.end_offset)}
    held = set(zip(table.column("_partition").to_pylist(), table.column("_offset").to_pylist(),
                   strict=True))
    assert in_lake <= held
    # A crash after the table's commit leaves rows the log does not name yet: the next run
    # names them, never adding them again.
    assert len(held) == len(keys)
    assert np.all(np.diff(sorted(o for p, o in held if p == 0)) >= 1)


def test_the_pafka_command_shows_the_lake_and_consumes_across_it(tmp_path):
    import json

    from .support import pafka
    s = _lake_store(tmp_path / "s")
    t = s.create_topic("t", SCHEMA, partitions=2)
    _fill(t)
    want = {(p, o, k, ts) for p in range(2) for o, k, ts in _log_view(t, p)}
    MigrationService(s).run_once()
    root = str(tmp_path / "s")
    d = json.loads(pafka("describe", root, "t", "--json").stdout)
    lake = d["lake"]
    in_lake = [x for x in d["segments"] if x["tier_type"] == "LAKE"]
    assert in_lake and lake["version"] >= 1 and lake["files"] >= 1
    assert lake["rows"] == sum(x["end_offset"] - x["base_offset"] for x in in_lake)
    text = pafka("describe", root, "t").stdout
    assert f"lake table {lake['table']}: version {lake['version']}" in text
    tiers = json.loads(pafka("tiers", root, "--json").stdout)["tiers"]
    assert tiers[1]["lake"] == {k: lake[k] for k in ("files", "rows", "bytes")} | {"tables": 1}
    assert "tier 2 LAKE" in pafka("tiers", root).stdout
    r = pafka("consume", root, "t", "--format", "json")
    assert r.returncode == 0, r.stderr
    got = {(x["_partition"], x["_offset"], x["key"], x["_timestamp"])
           for x in map(json.loads, r.stdout.splitlines())}
    assert {(p, o, k) for p, o, k, _ in got} == {(p, o, k) for p, o, k, _ in want}


@pytest.mark.parametrize("root_on", ["disk", "s3"])
def test_a_lake_on_s3_commits_with_conditional_puts_and_reads_back(tmp_path, s3_root, root_on):
    # The table on the suite's Ceph radosgw: delta-rs commits with conditional puts there. The
    # store's root is local, or on S3 too (its commit logs there, tier 1 on this host).
    root = str(tmp_path / "s") if root_on == "disk" else f"{s3_root}/root"
    s = _lake_store(root, **{"storage.tiers.1.paths": str(tmp_path / "t1"),
                             "storage.tiers.2.paths": f"{s3_root}/lake"})
    assert s.tier(2).url
    t = s.create_topic("t", SCHEMA, partitions=2)
    _fill(t)
    before = [_log_view(t, p) for p in range(2)]
    assert MigrationService(s).run_once()
    fresh = Store.open(root).topic("t")
    assert 2 in {x.tier for x in fresh.segments()}
    assert [_log_view(fresh, p) for p in range(2)] == before
    assert check_topic(fresh).ok
    uri = s.tier(2).table_uri("t", t.id)
    assert uri.startswith(s3_root)
    opts = delta_storage_options()
    table = deltalake.DeltaTable(uri, storage_options=opts).to_pyarrow_table()
    in_lake = sum(x.records for x in fresh.segments() if x.tier == 2)
    assert table.num_rows == in_lake
    assert len(set(zip(table.column("_partition").to_pylist(),
                       table.column("_offset").to_pylist(), strict=True))) == in_lake
    df = pl.scan_delta(uri, storage_options=opts).select("key").collect()
    assert df.height == in_lake


def test_spark_reads_the_log_across_the_lake_and_the_tables_files(spark, tmp_path):
    s = _lake_store(tmp_path / "s")
    t = s.create_topic("t", SCHEMA, partitions=2)
    _fill(t)
    MigrationService(s).run_once()
    assert 2 in {x.tier for x in t.segments()}
    want = sorted((p, o, k, ts) for p in range(2) for o, k, ts in _log_view(t, p))
    root = str(tmp_path / "s")
    df = (spark.read.format("pafka").option("topic", "t").option("includeMetadata", "true")
          .load(root))
    got = sorted((r._partition, r._offset, r.key, int(r._timestamp.timestamp() * 1000))
                 for r in df.select("_partition", "_offset", "key", "_timestamp").collect())
    assert got == want
    q = (spark.readStream.format("pafka").option("topic", "t")
         .option("startingOffsets", "earliest").load(root).select("key")
         .writeStream.format("pafka").option("topic", "copy")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True)
         .start(root))
    q.awaitTermination()
    copy = spark.read.format("pafka").option("topic", "copy").load(root)
    assert sorted(r.key for r in copy.collect()) == sorted(k for _, _, k, _ in want)
    # Spark's own Parquet reader on the table's files: the lake's rows, as they are.
    files = _table(s, t).file_uris()
    lake = spark.read.parquet(*files).select("_offset", "key").collect()
    in_lake = {(o, k) for p, o, k, _ in want for x in t.segments()
               if x.tier == 2 and x.partition == p and x.base_offset <= o < x.end_offset}
    assert sorted((r._offset, r.key) for r in lake) == sorted(in_lake)


def test_lake_retention_removes_whole_old_files_from_the_table_and_the_log(tmp_path):
    from tier_store import apply_lake_retention
    s = _lake_store(tmp_path / "s", **{"log.retention.ms": -1})
    t = s.create_topic("t", SCHEMA, partitions=2)
    _fill(t)
    MigrationService(s).run_once()
    dt = _table(s, t)
    files = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    assert apply_lake_retention(t) == 0  # -1 by default: the table keeps every row
    # A cut at the newest file's time: every file older goes, whole; the newest stays.
    newest = max(f["max._timestamp"] for f in files)
    cut = round(newest.timestamp() * 1000)  # round: a float may fall just below the ms
    t.set_config({"lake.retention.ms": 0})
    old = [f for f in files if round(f["max._timestamp"].timestamp() * 1000) < cut]
    removed = apply_lake_retention(t, now_ms=cut)
    assert removed == sum(f["num_records"] for f in old) > 0
    left = pa.table(_table(s, t).get_add_actions(flatten=True)).to_pylist()
    assert {f["path"] for f in left} == {f["path"] for f in files} - {f["path"] for f in old}
    # The log no longer names those rows, and reads what is left the same as before.
    for p in range(2):
        starts = t.earliest_offsets()[p]
        gone = [f for f in old if f["partition._partition"] == p]
        if gone:
            assert starts == max(f["max._offset"] for f in gone) + 1
        assert [o for o, _, _ in _log_view(t, p, starts)][:1] == [starts]
    assert check_topic(t).ok


def test_delete_topic_keeps_the_table_unless_purged(tmp_path):
    import json

    from .support import pafka
    root = str(tmp_path / "s")
    s = _lake_store(root, **{"storage.tiers.1.sizes": "1m", "storage.migrate.threshold": 0.1})
    for name in ("kept", "purged"):
        t = s.create_topic(name, SCHEMA, partitions=1)
        _fill(t, partitions=1)
        MigrationService(s).run_once()
    uris = {n: s.tier(2).table_uri(n, s.topic(n).id) for n in ("kept", "purged")}
    r = json.loads(pafka("delete-topic", root, "kept", "--json").stdout)
    assert r["lake_table"] == uris["kept"] and not r["lake_purged"]
    assert deltalake.DeltaTable(uris["kept"]).to_pyarrow_table().num_rows > 0
    out = pafka("delete-topic", root, "purged", "--purge-lake")
    assert f"its lake table {uris['purged']} was deleted" in out.stdout, out.stderr
    assert not os.path.exists(uris["purged"])


def test_demotions_go_in_any_order_and_a_committed_run_is_published_first(tmp_path):
    # What the table holds is read from its files: a later segment may go first, and a run
    # committed to the table before a crash is published alone when planned with more.
    from tier_store.maintenance.demote import demote
    s = _lake_store(tmp_path / "s", **{"storage.migrate.threshold": -1,
                                       "storage.tiers.1.sizes": "4m"})
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, batches=200, partitions=1)
    want = _log_view(t, 0)
    sealed = sorted((x for x in t.segments() if x.sealed), key=lambda x: x.base_offset)
    assert len(sealed) >= 4
    a, b, c, d = sealed[:4]
    assert s.move_segment(b.id, 2, topic="t").to_tier == 2  # b before a
    assert s.move_segment(a.id, 2, topic="t").to_tier == 2
    # c's file committed to the table, its move never published (a crash between the two).
    with t.snapshot() as st:
        seg_c = st.segments[c.id]
        rows = st.part(0).chunks.segment_rows(seg_c.seq)
        demote(t, s.tier(2), [seg_c], rows)
    assert [x.tier for x in t.segments() if x.id == c.id] == [1]
    # Planned now with d: c goes alone, on its committed file; then d.
    r = s.move_segment(c.id, 2, merge_with=[d.id], topic="t")
    assert r.sources == (c.id,)
    assert s.move_segment(d.id, 2, topic="t").sources == (d.id,)
    assert _log_view(Store.open(str(tmp_path / "s")).topic("t"), 0) == want
    table = _table(s, t).to_pyarrow_table()
    offsets = table.column("_offset").to_pylist()
    assert len(offsets) == len(set(offsets)) == sum(x.records for x in (a, b, c, d))
    assert check_topic(t).ok


def test_a_demotion_reads_the_commits_since_the_last_not_the_whole_table(tmp_path):
    # A table grows for as long as the topic lives: what a demotion reads of it must not.
    from tier_store import SegmentId
    from tier_store.maintenance.demote import lake_table
    s = _lake_store(tmp_path / "s", **{"storage.migrate.threshold": -1,
                                       "storage.tiers.1.sizes": "8m"})
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, batches=300, partitions=1)
    sealed = sorted((x for x in t.segments() if x.sealed), key=lambda x: x.base_offset)
    assert len(sealed) >= 6
    s.move_segment(sealed[0].id, 2, topic="t")  # makes the table
    # Another handle (another process's service) demotes one: one more commit to read.
    Store.open(str(tmp_path / "s")).move_segment(sealed[1].id, 2, topic="t")
    s.move_segment(sealed[2].id, 2, topic="t")
    table = lake_table(t, s.tier(2))
    assert table.loads == 1  # its files' list, read whole once per handle
    for x in sealed[3:6]:
        s.move_segment(x.id, 2, topic="t")
    assert table.loads == 1 and lake_table(t, s.tier(2)) is table
    seqs = [SegmentId.parse(x.id).seq for x in sealed[:6]]
    assert sorted(table.held(0)) == [(q, q) for q in seqs]
    # Removals (lake retention's, here without the log's) are read the same way.
    table.remove_below({0: sealed[1].base_offset}, vacuum_hours=0)
    assert sorted(table.held(0)) == [(q, q) for q in seqs[1:]] and table.loads == 1

    # A kept handle that fails to update (an object store's error) is loaded afresh.
    class Failing:
        def update_incremental(self):
            raise OSError("connection reset")
    table._dt = Failing()
    assert sorted(table.held(0)) == [(q, q) for q in seqs[1:]] and table.loads == 3


def test_the_service_looks_over_a_tables_files_for_retention_once_per_check_interval(tmp_path):
    # Lake retention reads the table's whole file list: not on every run of the service.
    from tier_store.maintenance.demote import lake_table
    s = _lake_store(tmp_path / "s", **{"lake.retention.ms": 86_400_000})
    t = s.create_topic("t", SCHEMA, partitions=1)
    _fill(t, partitions=1)
    svc = MigrationService(s)
    svc.run_once()
    table = lake_table(t, s.tier(2))
    before = table.loads
    for _ in range(5):
        svc.run_once()
    assert table.loads == before  # the default interval is 5 minutes
    from tier_store import apply_lake_retention
    assert apply_lake_retention(t) == 0 and table.loads == before + 1  # asked: it looks
