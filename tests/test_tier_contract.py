"""One suite every kind of tier joins: what a SEALED segment moved onto the tier looks like
through the tier's contract (``tier_store/tiers/base.py``) and through the topic.

Each store has a file tier 1 that takes the appends and the kind under test as tier 2; every
segment is sealed and moved down, then checked: ``exists``, ``read_header``, ``file_size``,
``partition_files``, reads through ``Topic.read``, and ``release_segment``. Appends, syncs and
crashes on the local kinds are in test_tiers.py; what only the remote tier does is in
test_remote.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tier_store import MAPS, SEGMENT_HEADER_SIZE, Store, Topic, seal_idle

from .conftest import SCHEMA, make_batch, read_all

# tier 2 of each store: the kind under test
KINDS = {
    "FILE": lambda tmp_path, shm_dir: {"storage.tiers.types": "NVME,FILE",
                                       "storage.tiers.second.paths": str(tmp_path / "file")},
    # A pmem tier on /dev/shm, as test_tiers.py runs it: libpmem's msync fallback (whether
    # the mapping counts as pmem does not change what a sealed segment looks like).
    "PMEM": lambda tmp_path, shm_dir: {"storage.tiers.types": "NVME,PMEM",
                                       "storage.tiers.second.paths": shm_dir,
                                       "storage.tiers.second.sizes": "2m",
                                       "log.pmem.pool.ratio": 1.0},
    "REMOTE": lambda tmp_path, shm_dir: {"storage.tiers.types": "NVME,REMOTE",
                                         "storage.tiers.second.paths":
                                             f"file://{tmp_path}/remote"},
}
PARTITIONS = 2


@dataclass
class Moved:
    """A store whose sealed segments all moved to tier 2, with what was read before."""

    store: Store
    topic: Topic
    rows: dict[int, list[int]]  # partition -> keys read before the moves
    chunks: dict[tuple[int, int], list[int]]  # (partition, base offset) -> the chunk's keys
    paths: dict[str, tuple[int, int, str]]  # tier-2 path -> (partition, seq, segment id)


@pytest.fixture(autouse=True)
def _no_cached_maps():
    # A mapping cached by one test must not keep a released pool file pinned in the next.
    MAPS.clear()
    yield
    MAPS.clear()


@pytest.fixture(params=sorted(KINDS))
def moved(request, tmp_path, shm_dir) -> Moved:
    # PMEM and REMOTE need the second tier's size or URL; the shm directory serves PMEM only,
    # but the fixture is cheap, so every kind takes it.
    store = Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.first.sizes": "2m",
        "log.segment.bytes": "64k", "log.cleanup.grace.ms": 0,
        **KINDS[request.param](tmp_path, shm_dir)})
    assert store.tier(2).type == request.param
    topic = store.create_topic("t", SCHEMA, partitions=PARTITIONS)
    for i in range(24):  # 2 segments a partition, the last one active
        topic.append(make_batch(i * 200, 200), partition=i % PARTITIONS)
    seal_idle(topic, 0, now_ms=topic.state().last_ts + 1)
    rows = {p: read_all(topic, p) for p in range(PARTITIONS)}
    chunks = {}
    for p in range(PARTITIONS):
        for c in topic.plan_read(p, 0).chunks:
            chunks[(p, c.base)] = read_all(topic, p, c.base, c.base + c.records)
    segments = topic.segments()
    assert segments and all(x.sealed and x.tier == 1 for x in segments)
    for x in segments:
        store.move_segment(x.id, 2, topic="t")
    after = topic.segments()
    assert all(x.tier == 2 for x in after)
    paths = {x.path: (x.partition, int(x.id.split("-")[1]), x.id) for x in after}
    return Moved(store, topic, rows, chunks, paths)


def _chunk_ends(topic: Topic) -> dict[str, int]:
    """path -> the end of its last chunk, from the log."""
    ends: dict[str, int] = {}
    for p in range(topic.partitions):
        for c in topic.plan_read(p, 0).chunks:
            ends[c.path] = max(ends.get(c.path, 0), c.pos + c.length)
    return ends


def test_a_moved_segment_exists_with_its_header_and_size(moved):
    tier = moved.store.tier(2)
    ends = _chunk_ends(moved.topic)
    assert set(ends) == set(moved.paths)
    for path, (partition, seq, _) in moved.paths.items():
        assert tier.exists(path), path
        header = tier.read_header(path)
        assert header is not None, path
        assert (header.partition, header.seq, header.sealed) == (partition, seq, True)
        assert header.end == ends[path] > SEGMENT_HEADER_SIZE  # every chunk lies before the end
        assert tier.file_size(path) >= header.end


def test_partition_files_lists_every_moved_segment(moved):
    tier = moved.store.tier(2)
    listed = list(tier.partition_files("t"))
    assert {(p, name, path) for p, name, path, _ in listed} == {
        (p, path.rsplit("/", 1)[-1], path) for path, (p, _, _) in moved.paths.items()}
    assert all(isinstance(mtime, float) and mtime > 0 for *_, mtime in listed)
    assert list(tier.partition_files("no-such-topic")) == []


def test_every_chunk_reads_back_the_same_rows_through_the_topic(moved):
    fresh = Store.open(moved.store.root).topic("t")
    for topic in (moved.topic, fresh):
        for p in range(PARTITIONS):
            assert read_all(topic, p) == moved.rows[p]
        for (p, base), keys in moved.chunks.items():
            assert read_all(topic, p, base, base + len(keys)) == keys, (p, base)


def test_release_segment_makes_it_gone(moved):
    tier = moved.store.tier(2)
    free = tier.free_pool_files()
    MAPS.clear()  # the reads of the fixture mapped the files; nothing may pin them
    for path in moved.paths:
        tier.release_segment(path)
        assert not tier.exists(path), path
        assert tier.read_header(path) is None, path
        tier.release_segment(path)  # a second release of a gone file is no error
    assert list(tier.partition_files("t")) == []
    if tier.has_pool:  # pool files go back to the pool
        assert tier.free_pool_files() == free + len(moved.paths)
    else:
        assert free is None


def test_every_kind_is_joined():
    # A kind added to the store's tier types (other than the file-tier aliases) joins here.
    # LAKE holds no segment files (Parquet files of a table): tests/test_lake_tier.py.
    from tier_store import CONFIG_KEYS
    types = set(CONFIG_KEYS["storage.tiers.types"].choices) - {"NVME", "SSD", "HDD", "LAKE"}
    assert types == set(KINDS)
