"""A log that grows old: no hot path's cost grows with history, partitions or topics.

Each test counts the work a path does (segments scanned, files listed, topics loaded,
bytes written per checkpoint), never wall time, so it fails if a cost turns linear again
whatever the machine's load."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from tier_store import Store
from tier_store.maintenance import retention

from .conftest import ROOT, make_batch, settle


@pytest.fixture
def counted(monkeypatch):
    """Counts of calls to store internals, by name, once patched with ``count``."""
    calls: dict[str, int] = {}

    def count(module, name):
        real = getattr(module, name)

        def spy(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    count.calls = calls
    return count


def _store(tmp_path, **conf):
    return Store.open(str(tmp_path / "store"), {"log.segment.bytes": "16k", **conf})


# -- retention --------------------------------------------------------------------------------
def test_commits_check_retention_once_per_interval_not_after_each(tmp_path, counted):
    store = _store(tmp_path)
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=64)
    counted(retention, "segments_to_delete")
    for i in range(300):
        topic.append(make_batch(i, 1), partition=i % 64)
    assert counted.calls.get("segments_to_delete", 0) == 1  # the first commit's check
    # Another process (a Spark sink commit, say) within the interval: no check either.
    retention._checked.clear()
    other = Store.open(str(tmp_path / "store")).topic("t")
    for i in range(20):
        other.append(make_batch(i, 1), partition=i % 64)
    assert counted.calls["segments_to_delete"] == 1


def test_an_interval_of_zero_checks_after_every_commit_and_retention_still_deletes(tmp_path):
    store = _store(tmp_path, **{"log.retention.check.interval.ms": 0,
                                "log.retention.bytes": "32k"})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(0, 4000, 100):
        topic.append(make_batch(i, 100))
    assert topic.earliest_offsets()[0] > 0  # retention ran from the commits
    assert sum(s.bytes for s in topic.segments()) <= 32 * 1024 + 16 * 1024


def test_the_checkpointing_commit_reclaims_what_retention_dropped(tmp_path):
    # Reclaiming a file takes its partition's append lock without waiting. On the
    # maintenance thread it raced the writer's next append and nearly always lost: a
    # producer's tier 1 filled with dropped files, and its writes went to the slow tier.
    import os
    store = _store(tmp_path, **{"log.retention.check.interval.ms": 0,
                                "log.retention.bytes": "32k", "log.cleanup.grace.ms": 0,
                                "log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    part_dir = os.path.dirname(store.tiers[0].segment_path("t", 0, 0))
    for i in range(0, 10_000, 100):
        topic.append(make_batch(i, 100))
        if topic.version % 10 == 0:  # no wait for the maintenance thread: it is done
            kept = {os.path.basename(s.path) for s in topic.segments()}
            files = {n for n in os.listdir(part_dir) if n.endswith(".seg")}
            assert files <= kept | {max(files)}, (topic.version, sorted(files - kept))
    assert topic.earliest_offsets()[0] > 0


def test_choosing_what_retention_deletes_visits_each_segment_once(tmp_path, monkeypatch):
    store = _store(tmp_path, **{"log.retention.check.interval.ms": 3_600_000})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=32)
    for i in range(0, 3200, 10):
        topic.append(make_batch(i, 10), partition=(i // 10) % 32)
    st = topic.state()
    visited = []
    real = retention._partition_prefix

    def spy(segs, *args):
        visited.extend(s.id for s in segs)
        return real(segs, *args)

    monkeypatch.setattr(retention, "_partition_prefix", spy)
    retention.segments_to_delete(st, 1, -1, 0)
    assert sorted(visited) == sorted(st.segments)  # each once: O(segments), not O(P × S)


def test_retention_keeps_an_offset_prefix_when_segments_interleave(tmp_path):
    from tier_store.state import PartitionState, SegmentState, TopicState
    st = TopicState("t", partitions=1, parts=[PartitionState(0)])
    # Segment 1's offsets interleave with segment 2's: the two go together or not at all.
    for seq, base, end in ((0, 0, 10), (1, 10, 30), (2, 20, 40), (3, 40, 50)):
        st._add_segment(SegmentState(0, seq, 1, base, end, end - base, 100, 100, 1, 0, 0))
    # 400 bytes, 250 kept: 0-0 and 0-1 would go, but 0-1 holds offsets above 0-2's first.
    assert retention.segments_to_delete(st, 250, -1, 0) == ["0-0"]
    assert retention.segments_to_delete(st, 150, -1, 0) == ["0-0", "0-1", "0-2"]
    assert retention.segments_to_delete(st, 0, -1, 0) == ["0-0", "0-1", "0-2"]
    assert retention.segments_to_delete(st, -1, 5, 0) == []


def test_the_marker_of_the_last_check_is_per_topic_incarnation(tmp_path, counted):
    store = _store(tmp_path)
    schema = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.string())])
    a = store.create_topic("a", schema, partitions=1)
    b = store.create_topic("b", schema, partitions=1)
    counted(retention, "segments_to_delete")
    a.append(make_batch(0, 1))
    b.append(make_batch(0, 1))
    assert counted.calls["segments_to_delete"] == 2
    store.delete_topic("a")
    a = store.create_topic("a", schema, partitions=1)
    a.append(make_batch(0, 1))  # a new incarnation checks at once
    assert counted.calls["segments_to_delete"] == 3


# -- placement --------------------------------------------------------------------------------
def _fill_segments(topic, segments: int, partition: int = 0) -> None:
    big = pa.record_batch([pa.array(range(100)), pa.array(range(100)),
                           pa.array(["x" * 120] * 100)], schema=topic.schema)
    for _ in range(segments):  # each append about 12 KiB: one segment of 16 KiB each
        topic.append(big, partition=partition)


def test_new_segments_count_the_stores_usage_once_not_per_segment(tmp_path, monkeypatch):
    from tier_store import placement
    monkeypatch.setattr(placement, "USAGE_MAX_AGE_S", 3600.0)
    store = _store(tmp_path, **{"storage.tiers.first.sizes": "1g"})
    for i in range(20):
        store.create_topic(f"t{i}", make_batch(0, 1).schema, partitions=1)
    topic = store.topic("t0")
    _fill_segments(topic, 30)
    assert len(topic.segments()) >= 25
    assert store._placement.counts == 1  # one count of 20 topics' states, then reservations
    # Each placement reserved a whole segment: the figure runs ahead of the count.
    assert store._placement.used()[1] >= 25 * 16 * 1024


def test_a_new_handle_places_segments_from_the_count_another_left(tmp_path, monkeypatch):
    import os

    from tier_store import placement
    from tier_store import store as store_module
    store = _store(tmp_path, **{"storage.tiers.first.sizes": "1g"})
    for i in range(40):
        store.create_topic(f"t{i}", make_batch(0, 1).schema, partitions=1)
    _fill_segments(store.topic("t0"), 2)  # a count, left at the root
    hint = os.path.join(str(tmp_path / "store"), placement.SEED_FILE)
    assert os.path.exists(hint)
    loaded = []
    real = store_module.readable_states
    monkeypatch.setattr(store_module, "readable_states",
                        lambda *a, **k: loaded.append(1) or real(*a, **k))
    fresh = Store.open(str(tmp_path / "store"))  # a Spark task's process, say
    for i in range(1, 11):
        _fill_segments(fresh.topic(f"t{i}"), 2)
    assert fresh._placement.counts == 0 and loaded == []  # no topic's state was read
    # A hint too old, damaged, or not a file is no figure: the new handle counts.
    for spoil in ("old", "garbage", "fifo"):
        os.unlink(hint)
        if spoil == "old":
            with open(hint, "w") as f:
                f.write('{"time": 1, "used": {"1": 0}}')
        elif spoil == "garbage":
            with open(hint, "wb") as f:
                f.write(b"\x00{not json")
        else:
            os.mkfifo(hint)
        other = Store.open(str(tmp_path / "store"))
        _fill_segments(other.topic("t20"), 1)
        assert other._placement.counts == 1, spoil


def test_the_reserved_figure_still_refuses_a_segment_past_the_capacity(tmp_path, monkeypatch):
    from tier_store import StoreFull, placement
    monkeypatch.setattr(placement, "USAGE_MAX_AGE_S", 3600.0)
    store = _store(tmp_path, **{"storage.tiers.first.sizes": "64k"})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    with pytest.raises(StoreFull, match="no local tier has room"):
        _fill_segments(topic, 10)
    # Never past the capacity: the committed bytes and a whole segment more fit in it.
    held = sum(s.bytes for s in topic.segments())
    assert held + 16 * 1024 <= 64 * 1024 + 16 * 1024 and len(topic.segments()) >= 3
    # Counted again only once the reserved figure said full, to see what moved meanwhile.
    assert 2 <= store._placement.counts <= len(topic.segments())


def test_writers_in_several_processes_fill_a_tier_once_not_once_each(tmp_path):
    # Three processes append at once to a 4 MiB tier 1 (pafka perf, a process each). Each
    # used to account only its own new segments: together they filled tier 1 about 3 times.
    import json
    import os
    import subprocess
    import sys
    root = str(tmp_path / "store")
    Store.open(root, {"storage.tiers.types": "FILE,HDD", "storage.tiers.first.sizes": "4m",
                      "log.segment.bytes": "256k"}).close()
    pafka = os.path.join(os.path.dirname(sys.executable), "pafka")
    r = subprocess.run([pafka, "perf", "produce", root, "p", "--create", "--records", "90000",
                        "--record-size", "100", "--processes", "3", "--batch-records", "500",
                        "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"]["records"] == 90000  # 10 MB: most on tier 2
    usage = {u["tier"]: u for u in Store.open(root).tier_usage()}
    assert usage[2]["used"] > 0
    # At most the capacity, and a segment per writer that a count made meanwhile missed.
    assert usage[1]["used"] <= (4 << 20) + 3 * (256 << 10), usage[1]


def test_a_pool_tier_or_an_unbounded_one_never_counts_usage(tmp_path, shm_dir):
    store = _store(tmp_path, **{"storage.tiers.types": "PMEM,HDD",
                                "storage.tiers.first.paths": shm_dir,
                                "storage.tiers.first.sizes": "256k", "log.pmem.pool.ratio": 1.0})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    _fill_segments(topic, 24)  # 16 in the pool, the rest on the HDD tier (no capacity)
    assert {s.tier for s in topic.segments()} == {1, 2}
    assert store._placement.counts == 0


# -- opening ------------------------------------------------------------------------------------
@pytest.mark.parametrize("after", [0, 1, 37])
def test_opening_a_topic_and_committing_never_loads_the_checkpoints_chunk_rows(tmp_path,
                                                                               after):
    from tier_store.chunk_index import ChunkIndex
    store = _store(tmp_path, **{"log.checkpoint.interval": 50})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=4)
    for i in range(200 + after):  # a checkpoint at 200, then ``after`` entries
        topic.append(make_batch(i, 1), partition=i % 4)
    settle()
    assert topic.checkpointed_version == 200
    before = ChunkIndex.loads
    fresh = Store.open(str(tmp_path / "store")).topic("t")
    assert sum(fresh.latest_offsets().values()) == 200 + after
    fresh.append(make_batch(0, 1), partition=0)  # a commit on the opened handle
    fresh.append(make_batch(0, 1), partition=1)
    assert ChunkIndex.loads == before
    # A read needs the rows: loaded then, once per partition read, and all there.
    assert [b.num_rows for b in fresh.read(0, 0)] and ChunkIndex.loads == before + 1
    assert sum(b.num_rows for b in fresh.read(0, 0)) == fresh.latest_offsets()[0]


# -- reader memory --------------------------------------------------------------------------------
def test_reader_mappings_stay_within_their_byte_budget_whatever_is_read(tmp_path, monkeypatch):
    from tier_store import MAPS
    store = _store(tmp_path)
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=4)
    for p in range(4):
        _fill_segments(topic, 10, partition=p)
    files = {s.id for s in topic.segments()}
    assert len(files) >= 40
    MAPS.clear()
    monkeypatch.setattr(MAPS, "max_bytes", 64 * 1024)
    try:
        seen = 0
        for p in range(4):
            for b in topic.read(p, 0):
                seen += b.num_rows
                assert MAPS.mapped_bytes() <= 64 * 1024 + 16 * 1024  # the one in use may pass
        assert seen == 4000
        assert len(MAPS.pinned()) <= 5
    finally:
        MAPS.clear()


def test_the_map_budget_is_a_store_setting_for_the_process_that_opens_it(tmp_path,
                                                                         monkeypatch):
    from tier_store import MAPS
    monkeypatch.setattr(MAPS, "max_bytes", MAPS.max_bytes)  # restored after the test
    store = _store(tmp_path, **{"log.reader.map.bytes": "1m"})
    assert MAPS.max_bytes == 1 << 20
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=2)
    for p in range(2):
        _fill_segments(topic, 40, partition=p)  # 80 segments of 16 KiB: 1.25 MiB
    MAPS.clear()
    reader = Store.open(str(tmp_path / "store"), create=False).topic("t")  # saved: applies
    seen = 0
    for p in range(2):
        for b in reader.read(p, 0):
            seen += b.num_rows
            assert MAPS.mapped_bytes() <= (1 << 20) + 16 * 1024
    assert seen == 8000
    MAPS.clear()


# -- the commit log ------------------------------------------------------------------------------
def test_cleanup_deletes_known_ranges_without_listing_the_log(tmp_path, monkeypatch):
    import os

    from tier_store.logstore.posix import PosixLogStore
    listed = []
    real = PosixLogStore._names
    monkeypatch.setattr(PosixLogStore, "_names", lambda self: listed.append(1) or real(self))
    store = _store(tmp_path, **{"log.checkpoint.interval": 10, "log.cleanup.grace.ms": 0})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=2)
    for i in range(1000):
        topic.append(make_batch(i, 1), partition=i % 2)
    settle()  # the last checkpoint's cleanup runs on the maintenance thread
    log_dir = os.path.join(str(tmp_path / "store"), "t", "_log")
    left = [n for n in os.listdir(log_dir) if n[0].isdigit()]
    assert len(left) <= 2 * 10 + 4, sorted(left)  # entries since the previous checkpoint
    assert listed == []  # the whole _log/ was never listed
    # A new handle (another process) finds where the log starts by a binary search.
    other = Store.open(str(tmp_path / "store")).topic("t")
    for i in range(100):
        other.append(make_batch(i, 1), partition=0)
    settle()
    assert len([n for n in os.listdir(log_dir) if n[0].isdigit()]) <= 2 * 10 + 4
    assert listed == []
    assert sum(other.latest_offsets().values()) == 1100


def test_a_commit_due_for_a_checkpoint_returns_before_the_checkpoint_is_written(
        tmp_path, monkeypatch):
    # Writing, syncing and cleaning up behind a checkpoint is I/O that grows with the state:
    # the commit leaves it to the maintenance thread, and close waits for it.
    import threading

    from tier_store.logstore.posix import PosixLogStore
    release, writers = threading.Event(), []
    real = PosixLogStore.write_checkpoint

    def held(self, version, data):
        writers.append(threading.current_thread())
        assert release.wait(60)
        return real(self, version, data)
    monkeypatch.setattr(PosixLogStore, "write_checkpoint", held)
    root = str(tmp_path / "store")
    store = _store(tmp_path, **{"log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(25):  # 10 is held; 20 finds it pending and skips; the rest commit on
        topic.append(make_batch(i, 1))
    assert topic.version == 25 and topic.checkpointed_version == 0
    assert len(writers) == 1 and writers[0] is not threading.current_thread()
    closing = threading.Thread(target=store.close)
    closing.start()
    closing.join(0.5)
    assert closing.is_alive()  # close waits for the checkpoint under way
    release.set()
    closing.join(60)
    assert not closing.is_alive() and topic.checkpointed_version == 10
    again = Store.open(root).topic("t")
    assert again.log.commit_log.last_checkpoint() == 10 and again.version == 25


def test_a_process_that_commits_and_exits_at_once_leaves_its_checkpoint(tmp_path):
    import subprocess
    import sys
    root = str(tmp_path / "store")
    script = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "from tier_store import Store\n"
        "from tests.conftest import make_batch\n"
        "t = Store.open(sys.argv[1], {'log.checkpoint.interval': 10}).create_topic(\n"
        "    't', make_batch(0, 1).schema)\n"
        "for i in range(10):\n"
        "    t.append(make_batch(i, 1))\n")  # no close: the interpreter's exit waits
    subprocess.run([sys.executable, "-c", script, root, ROOT], check=True, cwd=ROOT)
    assert Store.open(root).topic("t").log.commit_log.last_checkpoint() == 10


def test_cleanup_looks_up_no_name_that_is_not_there(tmp_path, monkeypatch):
    # Every name looked up and not found stays in the kernel's dentry cache: a cleanup that
    # probed each version's checkpoint made one per commit, millions over a long stream.
    import os

    from tier_store.logstore.posix_cleanup import PosixCleanup
    missed = []
    real = PosixCleanup._mtime

    def mtime(self, name):
        found = real(self, name)
        if found is None:
            missed.append(name)
        return found
    monkeypatch.setattr(PosixCleanup, "_mtime", mtime)
    store = _store(tmp_path, **{"log.checkpoint.interval": 10, "log.cleanup.grace.ms": 0})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(1000):
        topic.append(make_batch(i, 1))
    settle()
    # Only at multiples of the interval: version 0, where no commit writes one, and any
    # a busy maintenance thread skipped (a topic keeps one checkpoint pending at most).
    # Never one name per version.
    looked = [int(m.split(".")[0]) for m in missed if m.endswith(".checkpoint")]
    assert 0 in looked and all(v % 10 == 0 for v in looked), looked
    assert len(missed) <= 10, missed
    # Checkpoints another handle wrote below where this one cleans up are not looked for
    # one by one; the next listing (once per grace period) finds and deletes them.
    log_dir = os.path.join(str(tmp_path / "store"), "t", "_log")
    other = Store.open(str(tmp_path / "store")).topic("t")
    for _ in range(3):
        other.append(make_batch(0, 1))
        other.write_checkpoint()
    mine = topic.log.commit_log
    mine._temporaries_at = float("-inf")  # the grace period since the last listing is over
    for i in range(30):
        topic.append(make_batch(i, 1))
    settle()
    checkpoints = sorted(n for n in os.listdir(log_dir) if n.endswith(".checkpoint"))
    assert len(checkpoints) <= 2, checkpoints
    # Those the other handle deleted, and version 0: a few checkpoints, not versions.
    assert len([m for m in missed if m.endswith(".checkpoint")]) <= 3, missed
    assert sum(Store.open(str(tmp_path / "store")).topic("t").latest_offsets().values()) \
        == 1033


def test_cleanup_keeps_what_is_within_the_grace_period(tmp_path):
    import os
    store = _store(tmp_path, **{"log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(100):
        topic.append(make_batch(i, 1))
    log_dir = os.path.join(str(tmp_path / "store"), "t", "_log")
    assert len([n for n in os.listdir(log_dir) if n.endswith(".json")]) == 101


# -- defaults -----------------------------------------------------------------------------------
def test_a_default_store_takes_its_filesystems_free_space_less_a_reserve(tmp_path,
                                                                        monkeypatch):
    from tier_store import StoreFull
    from tier_store.tiers import space
    store = Store.open(str(tmp_path / "store"), {"log.segment.bytes": "16k"})
    assert store.tiers[0].capacity == -1
    usage = store.tier_usage()[0]
    assert usage["capacity"] >= usage["used"] and usage["capacity"] > 1 << 20
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    _fill_segments(topic, 3)
    assert store._placement.counts == 0  # the filesystem decides: no topic is loaded
    monkeypatch.setattr(space, "room", lambda path: 8 * 1024)  # less than a segment left
    with pytest.raises(StoreFull) as e:
        _fill_segments(topic, 3)
    text = str(e.value)
    assert "The store has one tier" in text and "pafka resize" in text
    assert "sized by its filesystem" in text and "migrat" not in text


def test_a_full_store_with_a_tier_below_advises_the_migration_service(tmp_path):
    from tier_store import StoreFull
    store = _store(tmp_path, **{"storage.tiers.types": "FILE,HDD",
                                "storage.tiers.first.sizes": "64k",
                                "storage.tiers.second.sizes": "64k"})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    with pytest.raises(StoreFull, match="Run the migration service"):
        _fill_segments(topic, 20)


def test_a_pmem_tier_of_size_minus_one_is_a_pool_of_one_gib(tmp_path):
    from tier_store import StoreConfig, load_config
    conf = StoreConfig(load_config({"storage.tiers.types": "PMEM,HDD"}))
    specs = conf.tiers(str(tmp_path))
    assert [(s.type, s.size) for s in specs] == [("PMEM", 1 << 30), ("HDD", 0)]
    conf = StoreConfig(load_config({"storage.tiers.types": "NVME,HDD"}))
    assert [s.size for s in conf.tiers(str(tmp_path))] == [-1, 0]


# -- the Spark driver ---------------------------------------------------------------------------
def test_a_stream_readers_driver_plans_each_topic_at_once_and_loads_no_chunk_index(
        tmp_path, counted):
    from pafka_source.options import SourceOptions
    from pafka_source.reader import PafkaStreamReader
    from pafka_source.types import spark_schema
    from tier_store import Topic
    from tier_store.chunk_index import ChunkIndex
    n = 256
    store = _store(tmp_path, **{"log.segment.bytes": "1m"})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=n)

    def one_batch(i):
        refs = []
        for p in range(n):
            refs += topic.write_chunks(make_batch(i, 1), partition=p)
        topic.commit(refs)

    one_batch(0)
    reader = PafkaStreamReader(SourceOptions.parse({
        "path": str(tmp_path / "store"), "topic": "t", "startingOffsets": "earliest"}),
        spark_schema(topic.schema, include_metadata=False))
    start = reader.initialOffset()
    counted(Topic, "plan_read")
    counted(Topic, "plan_reads")
    counted(Topic, "bytes_between")
    for i in range(1, 4):
        one_batch(i)
        loads = ChunkIndex.loads
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        reader.reportLatestOffset()
        parts = reader.partitions(start, end)
        assert sum(len(x.plans) for x in parts) == n
        assert ChunkIndex.loads == loads  # no index materialized: only what each read spans
        start = end
    assert counted.calls.get("plan_read", 0) == 0
    assert counted.calls["plan_reads"] == 3  # once per topic per batch, not per partition
    assert counted.calls.get("bytes_between", 0) == 0  # caught up: nothing behind to weigh


def test_writing_to_many_partitions_keeps_a_bounded_number_of_lock_files_open(tmp_path,
                                                                              monkeypatch):
    # A descriptor per partition lock ever taken ran a writer of 10,000 partitions out of
    # descriptors (with one per active segment besides).
    import os

    from tier_store import locks
    monkeypatch.setattr(locks, "OPEN_LOCK_FILES", 32)
    s = _store(tmp_path)
    t = s.create_topic("t", pa.schema([("key", pa.int64()), ("ts", pa.int64()),
                                       ("value", pa.string())]), partitions=300)
    before = len(os.listdir("/proc/self/fd"))
    for p in range(300):
        t.append(make_batch(p, 1), partition=p)
        assert locks.open_lock_files() <= 33  # the bound, and the one in use while trimming
    opened = len(os.listdir("/proc/self/fd")) - before
    assert opened <= 300 + 40  # an active segment per partition, and the bounded locks
    # Every partition still locks and appends after its descriptor was closed.
    for p in range(300):
        t.append(make_batch(1000 + p, 1), partition=p)
    assert sum(t.latest_offsets().values()) == 600


def test_finding_a_ranges_chunks_visits_only_the_segments_near_it(tmp_path):
    # A stream's driver plans and weighs each partition's newest chunks every batch: that
    # must not visit every segment the partition ever kept (a year holds thousands).
    from tier_store.chunk_index import ChunkIndex
    store = _store(tmp_path)
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    _fill_segments(topic, 120)
    topic.append(make_batch(0, 1), partition=0)
    assert len(topic.segments()) >= 100
    fresh = Store.open(str(tmp_path / "store")).topic("t")
    end = fresh.latest_offsets()[0]
    before = ChunkIndex.visits
    for _ in range(10):
        assert [b.num_rows for b in fresh.read(0, end - 1, end)] == [1]
        assert fresh.bytes_by_tier([(0, end - 1, end)])
    assert ChunkIndex.visits - before <= 20 * 2  # the newest segment, and one before it
    # The whole range still finds every chunk.
    assert sum(b.num_rows for b in fresh.read(0, 0)) == end


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(0, 3), hst.integers(1, 5)), min_size=1, max_size=60),
       hst.integers(0, 200), hst.integers(1, 60))
def test_the_segments_holding_a_range_are_those_a_full_scan_finds(appends, start, span):
    # Writers interleave segments (each append goes to one of four), so a segment's
    # offsets need not be one range: the ordered search must still find all of them.
    from tier_store.chunk_index import ChunkIndex
    from tier_store.entries import ChunkRecord
    idx = ChunkIndex(0)
    nxt = 0
    for i, (seq, n) in enumerate(appends):
        idx.append(ChunkRecord(0, seq, 1, 4096 + 512 * i, 100, nxt, n, 7), 1)
        nxt += n
        if i % 7 == 3:
            idx._holding(0, 1)  # an order built midway is kept up to date after
    stop = start + span
    want = {s.seq for s in idx._segs.values()
            if s.base >= 0 and s.base < stop and s.end > start}
    assert {s.seq for s in idx._holding(start, stop)} == want
    rows = idx.overlapping(start, stop)
    assert [int(b) for b in rows["base"]] == sorted(
        b for b, n in zip(*[[int(x) for x in idx.rows()[k]] for k in ("base", "records")],
                          strict=True) if b < stop and b + n > start)


def test_a_commit_looks_at_the_segments_it_writes_to_not_at_every_segment(tmp_path,
                                                                          monkeypatch):
    # Finding a retried commit's chunks looked at every segment of the partition, per chunk:
    # thousands after a year of a stream.
    from tier_store.chunk_rows import SegmentRows
    store = _store(tmp_path)
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    _fill_segments(topic, 120)
    assert len(topic.segments()) >= 100
    looked = []
    real = SegmentRows.loose

    def loose(self):
        looked.append(self.seq)
        return real(self)

    monkeypatch.setattr(SegmentRows, "loose", loose)
    for fresh in (topic, Store.open(str(tmp_path / "store")).topic("t")):
        refs = fresh.write_chunks(make_batch(0, 1)) + fresh.write_chunks(make_batch(1, 1))
        looked.clear()
        assert len(fresh.commit(refs)) == 2
        assert len(set(looked)) <= 2, sorted(set(looked))  # the chunks' segments only
        assert fresh.commit(refs) == []  # a retry finds them: nothing appended twice


def test_weighing_a_long_backlog_reads_no_chunk_rows_of_the_segments_inside_it(
        tmp_path, monkeypatch):
    # A query far behind weighs its backlog every batch (lag, maxBytesPerTrigger): whole
    # segments count their figures; only the two at the ends read rows.
    import numpy as np

    from tier_store import chunk_index
    from tier_store.index_pieces import IndexPieces
    monkeypatch.setattr(chunk_index, "PIECE_ROWS", 4)
    store = _store(tmp_path, **{"log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    _fill_segments(topic, 60)
    end = topic.latest_offsets()[0]
    fresh = Store.open(str(tmp_path / "store")).topic("t")
    IndexPieces._cache.clear()
    IndexPieces._cached_bytes = 0
    before = IndexPieces.loaded
    got = fresh.bytes_between(0, 150, end - 150)
    assert IndexPieces.loaded - before <= 4  # the end segments' pieces (and lists), no more
    rows = fresh.state().part(0).chunks.rows()
    lo = np.maximum(rows["base"], 150)
    hi = np.minimum(rows["base"] + rows["records"], end - 150)
    want = (np.clip(hi - lo, 0, None) / rows["records"] * rows["length"]).sum()
    assert abs(got - want) <= 2  # the same figure as weighing every chunk


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.integers(0, 50), min_size=1, max_size=80), hst.integers(0, 79),
       hst.integers(-1, 52))
def test_rows_committed_since_a_time_are_found_whatever_the_clock_did(stamps, cut, since):
    # A commit asks which rows of a segment were committed since its chunk was written. The
    # answer is bisected from a running maximum; a clock that steps back must not hide one.
    import numpy as np

    from tier_store.chunk_rows import CHUNK_DTYPE, SegmentRows
    rows = np.zeros(len(stamps), CHUNK_DTYPE)
    rows["base"] = np.arange(len(stamps))
    rows["records"] = 1
    rows["ts"] = stamps
    seg = SegmentRows(0, 1)
    cut = min(cut, len(stamps))
    seg.prepend(rows[:cut // 2])
    seg.add(rows[cut // 2:cut])
    # Asked before more rows come (the running maximum is made when first asked, then kept).
    head = rows[:cut]
    assert seg.loose_since(since).tolist() == head[head["ts"] >= since].tolist()
    for r in rows[cut:]:
        seg.add_row(tuple(r.tolist()), int(r["base"]), int(r["base"]) + 1, int(r["ts"]))
    want = rows[rows["ts"] >= since]
    assert seg.loose_since(since).tolist() == want.tolist()
    seg.keep_loose(rows[cut:])
    assert seg.loose_since(since).tolist() == rows[cut:][rows[cut:]["ts"] >= since].tolist()


def test_finding_an_offset_by_time_reads_one_segments_rows(tmp_path, monkeypatch):
    # startingTimestamp and pushed _timestamp filters ask per partition: the segment holding
    # the time is found by its last commit time; no other segment's rows are read.
    import time

    import numpy as np

    from tier_store import chunk_index
    from tier_store.index_pieces import IndexPieces
    monkeypatch.setattr(chunk_index, "PIECE_ROWS", 4)
    store = _store(tmp_path, **{"log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for _ in range(4):
        _fill_segments(topic, 10)
        time.sleep(0.005)
    fresh = Store.open(str(tmp_path / "store")).topic("t")
    rows = fresh.state().part(0).chunks.rows().copy()
    for ts in (int(rows["ts"][0]) - 1, int(rows["ts"][len(rows) // 2]),
               int(rows["ts"][-1]), int(rows["ts"][-1]) + 1):
        want = int(rows["base"][np.searchsorted(rows["ts"], ts)]) \
            if ts <= rows["ts"][-1] else topic.latest_offsets()[0]
        again = Store.open(str(tmp_path / "store")).topic("t")
        IndexPieces._cache.clear()
        IndexPieces._cached_bytes = 0
        before = IndexPieces.loaded
        assert again.offset_for_time(0, ts) == want
        assert IndexPieces.loaded - before <= 3  # one segment's list and pieces, not 40
