import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tier_store import (
    CommitConflict,
    ConfigError,
    DataLoss,
    PafkaError,
    SchemaMismatch,
    Store,
    TierRelocated,
    TopicExists,
    TopicNotFound,
    check_topic,
)
from tier_store.layout import log_dir

from .conftest import SCHEMA, make_batch, read_all, settle
from .support import log_versions, pmem_hdd_config, root_listing
from .support import record_fsyncs as _record_fsyncs


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".", "..", "x" * 250, "sp ace", "_log"])
def test_bad_topic_names_fail_clearly_and_touch_no_file(file_store, name):
    before = root_listing(file_store.root)
    with pytest.raises(PafkaError, match="invalid topic name"):
        file_store.create_topic(name, SCHEMA)
    assert root_listing(file_store.root) == before


def test_create_twice_raises_topic_exists(file_store):
    file_store.create_topic("t", SCHEMA)
    with pytest.raises(TopicExists, match="'t' already exists"):
        file_store.create_topic("t", SCHEMA)


@pytest.mark.parametrize("key, why", [("storage.migrate.threshold", "whole store"),
                                      ("log.segment.bytes", "one size in the whole store"),
                                      ("retention.mss", "a topic may set")])
def test_create_topic_refuses_keys_a_topic_cannot_set(file_store, key, why):
    with pytest.raises(ConfigError, match=why):
        file_store.create_topic("t", SCHEMA, config={key: "1"})
    assert file_store.topics() == []
    t = file_store.create_topic("t", SCHEMA, config={"retention.ms": "2500"})
    assert t.config == {"log.retention.ms": 2500}


def test_unknown_topic_lists_the_existing_topics(file_store):
    file_store.create_topic("clicks", SCHEMA)
    file_store.create_topic("views", SCHEMA)
    with pytest.raises(TopicNotFound, match="'nope'.*clicks, views"):
        file_store.topic("nope")


def test_append_assigns_gapless_offsets_and_reads_exactly_the_range(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=1)
    for i in range(10):
        res = t.append(make_batch(i * 100, 100))
        assert [(r.partition, r.base_offset, r.records) for r in res] == [(0, i * 100, 100)]
    assert t.latest_offsets() == {0: 1000}
    assert read_all(t, 0) == list(range(1000))
    assert read_all(t, 0, 150, 777) == list(range(150, 777))
    assert read_all(t, 0, 999) == [999]
    assert read_all(t, 0, 1000) == []
    assert read_all(t, 0, 5000) == []


def test_read_yields_arrow_batches_that_share_the_mapped_memory(file_store, monkeypatch):
    from tier_store import MAPS
    t = file_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 1000))
    # A read of a few KiB copies them (cheaper than a mapping); any larger one maps.
    assert MAPS.copy_bytes > 1000 * 20
    small = list(t.read(0, 0))
    seg = t.segments()[0]
    assert seg.path not in MAPS.pinned()  # other tests' readers may pin their own
    assert read_all(t, 0) == list(range(1000))
    monkeypatch.setattr(MAPS, "copy_bytes", 1024)
    batches = list(t.read(0, 0))
    assert all(isinstance(b, pa.RecordBatch) for b in batches)
    # Zero copy: the value buffer lives inside the segment's mapping, not in a fresh allocation.
    addr = batches[0].column(0).buffers()[1].address
    mapped = MAPS._maps[seg.path].buf
    assert mapped.address <= addr < mapped.address + mapped.size
    assert small[0].equals(batches[0])


def test_reads_cross_chunk_and_segment_boundaries(file_store):
    t = file_store.create_topic("t", SCHEMA)  # 64 KiB segments
    for i in range(60):
        t.append(make_batch(i * 500, 500))
    assert len(t.segments()) > 3
    assert read_all(t, 0) == list(range(30000))
    assert read_all(t, 0, 499, 501) == [499, 500]
    assert read_all(t, 0, 12345, 23456) == list(range(12345, 23456))


def test_uncommitted_chunks_are_invisible_until_commit(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=2)
    refs = t.write_chunks(make_batch(0, 100), key="key")
    assert {r.partition for r in refs} == {0, 1}
    other = Store.open(file_store.root).topic("t")
    assert other.latest_offsets() == {0: 0, 1: 0}
    assert read_all(other, 0) == [] and read_all(other, 1) == []
    t.commit(refs)
    assert sum(other.latest_offsets().values()) == 100
    assert sorted(read_all(other, 0) + read_all(other, 1)) == list(range(100))


def test_deferred_chunks_are_synced_once_then_committed_across_segment_rolls(store_root):
    store = store_root.open({"log.segment.bytes": "64k"})
    topic = store.create_topic("t", SCHEMA, partitions=3)
    refs = []
    for i in range(30):  # several chunks per segment, several segments per partition
        refs += topic.write_chunks(make_batch(i * 300, 300), partition=i % 3, durable=False)
    assert len({(r.partition, r.seq) for r in refs}) >= 6
    assert topic.latest_offsets() == {0: 0, 1: 0, 2: 0}
    # Rolled segments are sealed at once (another handle appends after them), while their
    # flush runs in the background until sync.
    other = Store.open(store_root.url).topic("t")
    for r in refs:
        if (r.seq, r.tier) != other.active_segment(r.partition):
            tier = store.tier(r.tier)
            assert tier.read_header(tier.segment_path("t", r.partition, r.seq)).sealed
    topic.sync()
    topic.commit(refs)
    for p in range(3):
        keys = [k for b in topic.read(p, 0) for k in b.column("key").to_pylist()]
        assert keys == [k for i in range(p, 30, 3) for k in range(i * 300, i * 300 + 300)]
    assert check_topic(topic).ok
    topic.sync()  # nothing left: a no-op


def test_threads_sharing_a_handle_write_deferred_chunks_sync_and_commit_at_once(store_root):
    store = store_root.open({"log.segment.bytes": "64k"})
    topic = store.create_topic("t", SCHEMA, partitions=2)
    errors = []

    def writer(w: int) -> None:
        try:
            for round_ in range(4):
                refs = []
                for i in range(6):  # rolls segments that other threads' chunks share
                    start = ((w * 4 + round_) * 6 + i) * 200
                    refs += topic.write_chunks(make_batch(start, 200), partition=i % 2,
                                               durable=False)
                topic.sync()
                topic.commit(refs)
        except Exception as e:  # surfaced below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = sorted(read_all(topic, 0) + read_all(topic, 1))
    assert got == list(range(3 * 4 * 6 * 200))
    assert check_topic(topic).ok
    store.close()


def test_one_commit_is_atomic_across_partitions(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=4)
    refs = t.write_chunks(make_batch(0, 1000), key="key")
    res = t.commit(refs)
    assert len({r.version for r in res}) == 1
    assert sum(r.records for r in res) == 1000


def test_replayed_batch_is_not_appended_twice(file_store):
    t = file_store.create_topic("t", SCHEMA)
    t.commit(t.write_chunks(make_batch(0, 10)), writer_id="q1", batch_id=0)
    t.commit(t.write_chunks(make_batch(10, 10)), writer_id="q1", batch_id=1)
    assert t.commit(t.write_chunks(make_batch(10, 10)), writer_id="q1", batch_id=1) == []
    assert t.commit(t.write_chunks(make_batch(0, 10)), writer_id="q1", batch_id=0) == []
    t.commit(t.write_chunks(make_batch(20, 10)), writer_id="q2", batch_id=0)
    assert read_all(t, 0) == list(range(30))
    # The writer's progress survives a reopen (and checkpoints).
    again = Store.open(file_store.root).topic("t")
    assert again.commit(again.write_chunks(make_batch(0, 5)), writer_id="q1", batch_id=1) == []


def test_committing_the_same_refs_twice_appends_once(file_store):
    t = file_store.create_topic("t", SCHEMA)
    refs = t.write_chunks(make_batch(0, 10))
    t.commit(refs)
    assert t.commit(refs) == []
    assert t.latest_offsets() == {0: 10}


def test_a_chunk_whose_place_was_reused_before_its_commit_conflicts(file_store):
    # A crash that loses a segment's header update (its `end`) before the chunk it covers was
    # committed lets the next writer append at the same place: the first chunk's bytes are
    # gone, so committing it must fail rather than pass for "already committed".
    from tier_store.segment import END_OFFSET, WORD
    t = file_store.create_topic("t", SCHEMA, partitions=1)
    lost = t.write_chunks(make_batch(0, 10))
    r = lost[0]
    path = file_store.tier(r.tier).segment_path("t", 0, r.seq)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, WORD.pack(r.pos), END_OFFSET)
    finally:
        os.close(fd)
    # Another handle, as after a crash: the writer of `lost` would not append over it.
    kept = Store.open(file_store.root).topic("t").append(make_batch(100, 20))
    assert [(k.base_offset, k.records) for k in kept] == [(0, 20)]
    with pytest.raises(CommitConflict, match=f"segment 0-{r.seq} holds another committed "
                       f"chunk at {r.pos}.*write the batch again"):
        t.commit(lost)
    assert read_all(t, 0) == list(range(100, 120))


def test_schema_mismatch_names_the_differing_fields(file_store):
    t = file_store.create_topic("t", SCHEMA)
    bad = pa.record_batch({"key": pa.array([1], pa.int32()), "ts": [1], "value": ["a"]})
    with pytest.raises(SchemaMismatch, match="'key': topic has int64, data has int32"):
        t.append(bad)
    with pytest.raises(SchemaMismatch, match=r"missing columns \['value'\]"):
        t.append(pa.record_batch({"key": [1], "ts": [1]}))
    assert t.latest_offsets() == {0: 0}


def test_columns_in_another_order_are_reordered_by_name(file_store):
    t = file_store.create_topic("t", SCHEMA)
    b = make_batch(0, 3)
    t.append(b.select(["value", "key", "ts"]))
    assert read_all(t, 0) == [0, 1, 2]


def test_non_null_field_casts_when_no_nulls_and_fails_naming_it_otherwise(file_store):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.string())])
    t = file_store.create_topic("nn", schema)
    t.append(pa.record_batch({"id": [1, 2], "v": ["a", None]}))
    with pytest.raises(SchemaMismatch, match="'id' is not nullable.*1 nulls"):
        t.append(pa.record_batch({"id": [3, None], "v": ["a", "b"]}))
    assert next(t.read(0, 0)).schema == schema


def test_key_routing_is_stable_and_nulls_go_to_partition_zero(file_store):
    t = file_store.create_topic("t", pa.schema([("k", pa.string()), ("n", pa.int64())]),
                                partitions=4)
    keys = [f"user-{i}" for i in range(200)] + [None] * 5
    refs = t.write_chunks(pa.record_batch({"k": keys, "n": list(range(205))}), key="k")
    t.commit(refs)
    where = {}
    for p in range(4):
        for b in t.read(p, 0):
            for k in b.column("k").to_pylist():
                where.setdefault(k, set()).add(p)
    assert where[None] == {0}
    assert all(len(ps) == 1 for ps in where.values())
    assert len({next(iter(ps)) for ps in where.values()}) == 4


def test_no_key_spreads_appends_over_all_partitions(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=4)
    for i in range(8):
        t.append(make_batch(i * 10, 10))
    assert all(v == 20 for v in t.latest_offsets().values())


def test_explicit_partition_and_bad_partition(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=2)
    t.append(make_batch(0, 5), partition=1)
    assert t.latest_offsets() == {0: 0, 1: 5}
    with pytest.raises(PafkaError, match="no partition 2: it has partitions 0..1"):
        t.append(make_batch(0, 5), partition=2)
    with pytest.raises(PafkaError, match="no partition 7"):
        list(t.read(7, 0))


def test_wrong_data_type_is_a_clear_error(file_store):
    t = file_store.create_topic("t", SCHEMA)
    with pytest.raises(PafkaError, match="expected a pyarrow RecordBatch, Table"):
        t.append({"key": [1]})


def test_add_partitions_is_seen_by_other_handles(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=1)
    other = Store.open(file_store.root).topic("t")
    assert t.add_partitions(2) == 3
    assert other.latest_offsets() == {0: 0, 1: 0, 2: 0}
    other.append(make_batch(0, 3), partition=2)
    assert read_all(t, 2) == [0, 1, 2]


def test_positions_are_recorded_per_group(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=2)
    for p in range(2):
        t.append(make_batch(p * 10, 10), partition=p)
    t.set_position("g1", {0: 5, 1: 7})
    t.set_position("g2", {"1": 3})
    assert Store.open(file_store.root).topic("t").positions() == {"g1": {0: 5, 1: 7},
                                                                  "g2": {1: 3}}
    with pytest.raises(PafkaError, match="must be a non-negative integer"):
        t.set_position("g1", {0: -1})
    with pytest.raises(PafkaError, match="offset 11 for partition 1 of topic 't' is past its "
                                         "latest offset 10"):
        t.set_position("g1", {1: 11})
    t.set_position("g1", {1: 10})  # the end of the log: nothing left to read


def test_set_position_merges_into_the_groups_other_partitions(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=3)
    for p in range(3):
        t.append(make_batch(p * 10, 10), partition=p)
    t.set_position("g", {0: 5, 1: 7, 2: 9})
    t.set_position("g", {0: 0})  # overrides partition 0 only
    assert t.positions()["g"] == {0: 0, 1: 7, 2: 9}
    with pytest.raises(PafkaError, match="names no partition; delete_group"):
        t.set_position("g", {})
    assert Store.open(file_store.root).topic("t").positions()["g"] == {0: 0, 1: 7, 2: 9}


def test_set_position_merges_against_the_state_it_publishes_on(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=2)
    for p in range(2):
        t.append(make_batch(p * 10, 10), partition=p)
    stale = Store.open(file_store.root).topic("t")
    stale.state()  # this handle last looked before the other's commit below
    t.set_position("g", {1: 7})
    stale.set_position("g", {0: 5})  # merged with what was published since, not forgotten
    assert t.positions()["g"] == {0: 5, 1: 7}
    # Many handles committing their own partitions at once: none is lost.
    t.add_partitions(6)
    handles = [Store.open(file_store.root).topic("t") for _ in range(8)]
    threads = [threading.Thread(target=h.set_position, args=("h", {p: 0}))
               for p, h in enumerate(handles)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.positions()["h"] == {p: 0 for p in range(8)}


def test_advance_position_never_moves_a_committed_offset_back(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=2)
    for p in range(2):
        t.append(make_batch(p * 10, 10), partition=p)
    stale = Store.open(file_store.root).topic("t")
    stale.state()  # looked before the later position below was recorded
    t.set_position("g", {0: 8})
    version = t.version
    stale.advance_position("g", {0: 5})  # behind what the log holds now: nothing published
    assert t.refresh().version == version and t.positions()["g"] == {0: 8}
    stale.advance_position("g", {0: 6, 1: 4})  # partition 1 moves, partition 0 stays
    assert t.positions()["g"] == {0: 8, 1: 4}
    with pytest.raises(PafkaError, match="past its latest offset 10"):
        t.advance_position("g", {1: 11})


def test_reset_position_replaces_the_whole_position_and_delete_group_forgets_it(store_root):
    s = store_root.open({"log.checkpoint.interval": 2})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for p in range(2):
        t.append(make_batch(p * 10, 10), partition=p)
    t.set_position("g", {0: 5, 1: 7})
    t.set_position("keep", {0: 1})
    t.reset_position("g", {1: 2})
    assert t.positions() == {"g": {1: 2}, "keep": {0: 1}}
    t.reset_position("new", {0: 3})  # a group with no position yet is created
    t.delete_group("g")
    for _ in range(3):  # past a checkpoint: what it carries is what replay gives
        t.append(make_batch(100, 1), partition=0)
    assert Store.open(store_root.url).topic("t").positions() == {"keep": {0: 1}, "new": {0: 3}}
    with pytest.raises(PafkaError, match="topic 't' has no consumer group 'g'; its groups: "
                                         "keep, new"):
        t.delete_group("g")
    with pytest.raises(PafkaError, match="offset 99 for partition 0 of topic 't' is past"):
        t.reset_position("keep", {0: 99})
    with pytest.raises(PafkaError, match="consumer group must be a non-empty string"):
        t.reset_position("", {0: 1})
    assert t.positions()["keep"] == {0: 1}


def test_retention_bytes_deletes_oldest_sealed_segments_and_reads_below_raise_data_loss(
        store_root):
    s = store_root.open({"log.segment.bytes": "64k", "log.retention.bytes": "200k",
                         "log.cleanup.grace.ms": 0, "log.retention.check.interval.ms": 0})
    t = s.create_topic("t", SCHEMA)
    for i in range(100):
        t.append(make_batch(i * 200, 200))
    earliest = t.earliest_offsets()[0]
    assert earliest > 0
    assert sum(seg.bytes for seg in t.segments()) <= 200 * 1024 + 64 * 1024
    assert read_all(t, 0, earliest) == list(range(earliest, 20000))
    with pytest.raises(DataLoss, match=f"earliest offset is {earliest}"):
        list(t.read(0, 0))


def test_retention_ms_deletes_old_segments_but_keeps_the_newest(store_root):
    s = store_root.open({"log.segment.bytes": "64k", "log.retention.ms": 3_600_000})
    t = s.create_topic("t", SCHEMA)
    for i in range(20):
        t.append(make_batch(i * 200, 200))
    n = len(t.segments())
    future = t.state().last_ts + 2 * 3_600_000
    deleted = t.apply_retention(now_ms=future)
    assert len(deleted) == n - 1
    assert len(t.segments()) == 1
    assert t.latest_offsets() == {0: 4000}


def test_deleted_segment_files_are_reclaimed_only_after_the_grace_period(store_root):
    s = store_root.open({"log.segment.bytes": "64k", "log.retention.bytes": "100k",
                         "log.cleanup.grace.ms": 3_600_000,
                         "log.retention.check.interval.ms": 0})
    t = s.create_topic("t", SCHEMA)
    for i in range(60):
        t.append(make_batch(i * 200, 200))
    gone = [key.split("@")[0] for key in t.state().tombstones]
    assert gone
    tier = s.tiers[0]
    paths = [tier.segment_path("t", 0, int(sid.split("-")[1])) for sid in gone]
    assert all(os.path.exists(p) for p in paths)
    assert s.collect_garbage(t) == 0  # still inside the grace period
    import time

    from tier_store.maintenance.garbage import collect_garbage
    assert collect_garbage(t, now=time.time() + 7200) >= len(paths)
    assert not any(os.path.exists(p) for p in paths)
    assert read_all(t, 0, t.earliest_offsets()[0])[-1] == 11999


def test_commit_of_a_chunk_whose_segment_was_deleted_conflicts(store_root):
    s = store_root.open({"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA)
    late = t.write_chunks(make_batch(0, 200))
    for i in range(40):
        t.append(make_batch(1000 + i * 200, 200))
    sid = f"0-{late[0].seq}"
    from tier_store.entries import DeleteEntry
    st = t.state()
    assert t.log.publish(st, DeleteEntry(st.last_ts, (sid,)))
    with pytest.raises(CommitConflict, match=f"segment {sid} was moved or deleted"):
        t.commit(late)


def test_checkpoints_bound_the_log_and_reopen_reads_only_the_tail(store_root):
    s = store_root.open({"log.checkpoint.interval": 10, "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA)
    for i in range(95):
        t.append(make_batch(i, 1))
    entries, checkpoints = log_versions(t)
    assert len(entries) <= 30 and checkpoints
    assert t.log.commit_log.store.last_checkpoint_hint() == max(checkpoints)
    again = Store.open(store_root.url).topic("t")
    assert again.version == 95 and again.latest_offsets() == {0: 95}
    assert read_all(again, 0) == list(range(95))


def test_a_stale_handle_refreshes_past_cleaned_up_entries(store_root):
    s = store_root.open({"log.checkpoint.interval": 5, "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA)
    stale = Store.open(store_root.url).topic("t")
    assert stale.version == 0
    for i in range(40):
        t.append(make_batch(i, 1))
    assert 1 not in log_versions(t)[0]
    assert stale.latest_offsets() == {0: 40}
    assert read_all(stale, 0) == list(range(40))


# Local root only: 10,000 commits take ~4 minutes on the S3 server (one conditional PUT
# each, ~25 ms on loopback); test_shared_log.py bounds the log on S3 at a smaller size.
def test_ten_thousand_small_appends_make_segments_by_size_and_a_bounded_log(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "1m", "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA)
    for i in range(10_000):
        t.append(make_batch(i * 100, 100))
    settle()
    segs = t.segments()
    total = sum(x.bytes for x in segs)
    assert len(segs) <= total // (1024 * 1024 - 4096) + 2
    assert 5 < len(segs) < 200
    files = os.listdir(log_dir(s.root, "t"))
    assert len(files) <= 205
    assert t.latest_offsets() == {0: 1_000_000}
    assert read_all(t, 0, 999_900) == list(range(999_900, 1_000_000))


def test_event_time_column_min_max_is_kept_per_chunk(file_store):
    t = file_store.create_topic("t", SCHEMA)
    refs = t.write_chunks(make_batch(5, 10), timestamp_column="ts")
    assert (refs[0].tmin, refs[0].tmax) == (50, 140)
    t.commit(refs)
    rows = t.state().chunks[0].rows()
    assert (int(rows["tmin"][0]), int(rows["tmax"][0])) == (50, 140)


def test_compressed_chunks_round_trip(store_root):
    s = store_root.open({"compression.type": "zstd"})
    t = s.create_topic("t", SCHEMA)
    t.append(make_batch(0, 5000))
    assert read_all(t, 0) == list(range(5000))
    assert t.segments()[0].bytes < make_batch(0, 5000).nbytes


@pytest.mark.parametrize("how", ["default", "verify=True"])
def test_a_read_verifies_checksums_and_names_file_and_offsets_of_a_damaged_chunk(
        file_store, how):
    from tier_store import CorruptSegment
    t = file_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 100))
    seg = t.segments()[0]
    rows = t.state().chunks[0].rows()
    with open(seg.path, "r+b") as f:
        f.seek(int(rows["pos"][0]) + int(rows["length"][0]) - 40)
        f.write(b"\xff" * 8)
    fresh = Store.open(file_store.root).topic("t")
    kwargs = {} if how == "default" else {"verify": True}
    with pytest.raises(CorruptSegment, match=r"offsets \[0, 100\) in .*\.seg"):
        list(fresh.read(0, 0, **kwargs))
    # verify=False trusts the bytes: no checksum error (the damage is inside a value).
    assert len(list(fresh.read(0, 0, verify=False))) >= 1


def test_missing_segment_file_raises_data_loss_naming_it(file_store):
    t = file_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 10))
    os.unlink(t.segments()[0].path)
    fresh = Store.open(file_store.root).topic("t")
    with pytest.raises(DataLoss, match="missing"):
        list(fresh.read(0, 0))
    # Writers go on: the active segment is rolled.
    fresh.append(make_batch(10, 5))
    assert read_all(fresh, 0, 10) == list(range(10, 15))


def test_a_writer_whose_segment_file_was_removed_rolls_instead_of_failing_each_commit(
        file_store):
    # The same handle, whose writer still holds the removed file open: without the check
    # each append wrote there and each commit was refused ("found no file"), forever.
    t = file_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 10))
    os.unlink(t.segments()[0].path)
    for i in range(3):
        t.append(make_batch(10 + 5 * i, 5))
    assert read_all(t, 0, 10) == list(range(10, 25))
    assert len(t.segments()) == 2


def test_a_chunk_bigger_than_a_segment_is_split_or_gets_its_own_segment(file_store):
    t = file_store.create_topic("t", SCHEMA)  # 64 KiB segments
    big = make_batch(0, 20_000)
    assert big.nbytes > 64 * 1024
    t.append(big)
    assert read_all(t, 0) == list(range(20_000))
    wide = pa.record_batch({"key": [1], "ts": [1], "value": ["x" * 100_000]})
    t.append(wide)
    assert t.latest_offsets() == {0: 20_001}
    assert np.array_equal(read_all(t, 0, 20_000), [1])


def test_segment_older_than_segment_ms_is_rolled_on_the_next_append(store_root):
    import time
    # 2 s: two appends on S3 under load can take more than 50 ms between them.
    s = store_root.open({"log.segment.ms": 2000})
    t = s.create_topic("t", SCHEMA)
    t.append(make_batch(0, 10))
    t.append(make_batch(10, 10))
    assert len(t.segments()) == 1
    time.sleep(2.1)
    t.append(make_batch(20, 10))
    segs = t.segments()
    assert len(segs) == 2 and segs[0].sealed and not segs[1].sealed
    assert read_all(t, 0) == list(range(30))


# The partition pointers below are in Store.pointer_dir: the root's topic directory, or for an
# s3:// root this host's directory.
def _store_of_kind(kind: str, store_root, shm_dir) -> Store:
    """A store of 64 KiB segments on a file tier, or on a pmem tier of 32 pool files."""
    conf = {"log.segment.bytes": "64k"}
    if kind == "pmem":
        conf.update(pmem_hdd_config(shm_dir, **{"storage.tiers.first.sizes": "2m"}))
    return store_root.open(conf)


@pytest.mark.parametrize("kind", ["file", "pmem"])
@pytest.mark.parametrize("durable", [True, False])
def test_a_segment_made_in_a_directory_a_dead_writer_left_syncs_the_directory_entries(
        kind, durable, store_root, shm_dir, monkeypatch):
    store = _store_of_kind(kind, store_root, shm_dir)
    topic = store.create_topic("t", SCHEMA, partitions=1)
    tier = store.tiers[0]
    # A deferred writer that died before its first sync made <tier>/t/0 and left the entries
    # of t/ and 0/ in their parents unsynced; the next writer sees the directories exist.
    os.makedirs(os.path.join(tier.path, "t", "0"))
    calls = _record_fsyncs(monkeypatch)
    if durable:
        topic.append(make_batch(0, 10))
    else:
        refs = topic.write_chunks(make_batch(0, 10), partition=0, durable=False)
        topic.sync()
        topic.commit(refs)
    synced = {path for _thread, path in calls}
    assert {tier.path, os.path.join(tier.path, "t"), os.path.join(tier.path, "t", "0")} \
        <= synced


@pytest.mark.parametrize("kind", ["file", "pmem"])
def test_deferred_rolls_leave_every_fsync_to_sync_which_covers_new_files_and_pointers(
        kind, store_root, shm_dir, monkeypatch):
    store = _store_of_kind(kind, store_root, shm_dir)
    topic = store.create_topic("t", SCHEMA, partitions=2)
    calls = _record_fsyncs(monkeypatch)
    refs = []
    for i in range(40):  # several rolls per partition
        refs += topic.write_chunks(make_batch(i * 300, 300), partition=i % 2, durable=False)
    segments = {(r.partition, r.seq, r.tier) for r in refs}
    assert len(segments) >= 6
    me = threading.current_thread().name
    assert [c for c in calls if c[0] == me] == []  # rolls and appends waited on no flush
    topic.sync()
    synced = {path for _, path in calls}
    parts = store.pointer_dir("t")
    assert parts in synced
    for p in range(2):
        assert os.path.join(parts, f"{p}.active") in synced
    for p, seq, tier in segments:
        path = store.tier(tier).segment_path("t", p, seq)
        assert os.path.dirname(path) in synced, path
        if kind == "file":
            assert path in synced, path
    topic.commit(refs)
    assert sorted(read_all(topic, 0) + read_all(topic, 1)) == list(range(40 * 300))
    # Another handle appending to a segment this one rolled to makes the pointer and the
    # segment's directory entry durable itself before its chunks can be committed.
    other = Store.open(store_root.url).topic("t")
    topic.write_chunks(make_batch(10**6, 300), partition=0, durable=False)  # rolls, unsynced
    calls.clear()
    ref = other.write_chunks(make_batch(2 * 10**6, 300), partition=0, durable=False)
    other.sync()
    seg = store.tier(ref[0].tier).segment_path("t", 0, ref[0].seq)
    synced = {path for _, path in calls}
    assert {os.path.join(parts, "0.active"), parts, os.path.dirname(seg)} <= synced
    other.commit(ref)
    assert 2 * 10**6 in read_all(other, 0)


@pytest.mark.parametrize("pointer", [b"", b'{"seq": 1', b"\0" * 24])
def test_an_unreadable_pointer_after_a_machine_crash_starts_a_segment_past_all_committed(
        store_root, pointer, caplog):
    root = store_root.url
    store = store_root.open({"log.segment.bytes": "64k"})
    topic = store.create_topic("t", SCHEMA, partitions=1)
    for i in range(8):
        topic.append(make_batch(i * 300, 300), partition=0)
    last = max(s.seq for s in topic.state().segments.values())
    parts = store.pointer_dir("t")
    store.close()
    # What a deferred roll's rename can leave when the machine stops before sync.
    with open(os.path.join(parts, "0.active"), "wb") as f:
        f.write(pointer)
    again = Store.open(root).topic("t")
    assert again.active_segment(0) is None
    assert "unreadable" in caplog.text and "0.active" in caplog.text
    again.append(make_batch(8 * 300, 300), partition=0)
    first = again.active_segment(0)
    refs = again.write_chunks(make_batch(9 * 300, 300), partition=0, durable=False)
    again.sync()
    again.commit(refs)
    assert first[0] == last + 1
    assert read_all(again, 0) == list(range(10 * 300))
    assert check_topic(again).ok


def test_a_chunk_naming_no_topic_id_or_relocation_count_is_refused(file_store):
    from dataclasses import replace
    t = file_store.create_topic("t", SCHEMA)
    refs = t.write_chunks(make_batch(0, 10))
    with pytest.raises(CommitConflict, match=f"expected a chunk naming the topic's id {t.id}, "
                                             "found one naming none"):
        t.commit([replace(r, topic_id=None) for r in refs])
    with pytest.raises(TierRelocated):
        t.commit([replace(r, relocation=None) for r in refs])
    assert t.latest_offsets() == {0: 0} and t.commit(refs)[0].records == 10


def test_a_planned_chunk_is_read_from_another_copy_when_its_file_is_missing(file_store,
                                                                            tmp_path):
    from dataclasses import replace

    from tier_store import CorruptSegment, execute
    t = file_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 50))
    plan = t.plan_read(0, 0)
    (c,) = plan.chunks
    original = Path(c.path).read_bytes()
    copy = tmp_path / "copy.seg"
    copy.write_bytes(b"\0" * 100 + original)
    damaged = tmp_path / "damaged.seg"
    damaged.write_bytes(original[: c.pos] + b"\xff" * c.length)
    gone = replace(c, path=str(tmp_path / "gone.seg"),
                   elsewhere=((str(damaged), c.pos), (str(copy), c.pos + 100)))
    rows = [pb.batch.num_rows for pb in execute(replace(plan, chunks=(gone,)), replan=False)]
    assert sum(rows) == 50
    # The other copy is there but damaged: corrupt, naming both places.
    with pytest.raises(CorruptSegment, match="gone.seg and .*damaged.seg at byte 4096 does not"):
        list(execute(replace(plan, chunks=(replace(gone, elsewhere=((str(damaged), c.pos),)),)),
                     replan=False))
    with pytest.raises(DataLoss, match="gone.seg and .*nowhere.seg at byte 4096, each missing"):
        list(execute(replace(plan, chunks=(replace(gone, elsewhere=(
            (str(tmp_path / "nowhere.seg"), c.pos),)),)), replan=False))


def test_nulls_in_a_column_marked_non_null_are_refused_on_append(file_store):
    schema = pa.schema([pa.field("id", pa.int32(), nullable=False)])
    t = file_store.create_topic("t", schema)
    # from_arrays trusts the schema: the array still holds a null.
    bad = pa.Table.from_arrays([pa.array([1, None], pa.int32())], schema=schema)
    with pytest.raises(SchemaMismatch, match="'id' is not nullable .* 1 nulls"):
        t.append(bad)
    assert t.latest_offsets() == {0: 0}
