"""Index pieces: checkpoints name each segment's chunk rows, written once to the log, so a
checkpoint's size follows the segments a topic retains, not its commits. Counted in bytes
and files, never timed."""

from __future__ import annotations

import json
import os

import pytest

from tier_store import CorruptLog, Store
from tier_store import chunk_index as chunk_index_module
from tier_store.commit_log import checkpoint_body
from tier_store.index_pieces import IndexPieces

from .conftest import make_batch, settle


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(chunk_index_module, "PIECE_ROWS", 32)


def _checkpoint(log_dir: str, version: int) -> tuple[int, dict]:
    import pyarrow as pa
    settle()  # checkpoints are written after the commit returns
    with open(os.path.join(log_dir, f"{version:020d}.checkpoint"), "rb") as f:
        data = f.read()
    table = pa.ipc.open_file(checkpoint_body(data)).read_all()
    return len(data), json.loads(table.schema.metadata[b"pafka.state"])


def _ids(topic, p: int, start: int = 0) -> list[int]:
    return [i for b in topic.read(p, start) for i in b.column("key").to_pylist()]


def test_checkpoints_stay_the_same_size_however_many_commits_came_before(tmp_path,
                                                                          small_pieces):
    # One segment per partition for the whole run: every chunk row lives as long as the log.
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "64m", "log.checkpoint.interval": 40})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=8)
    log_dir = os.path.join(root, "t", "_log")
    sizes = {}
    for i in range(2400):
        topic.append(make_batch(i, 1), partition=i % 8)
        v = topic.version
        if v % 40 == 0:
            settle()
            sizes[v], meta = _checkpoint(log_dir, v)
            assert sum(meta["chunk_counts"]) < 8 * 32  # at most a piece's rows per segment
    first, last = sizes[400], sizes[2400]
    assert last <= 1.3 * first, sizes  # v1 grew 6x over this run
    # Everything reads back, from a fresh handle, through the pieces.
    fresh = Store.open(root).topic("t")
    for p in range(8):
        assert _ids(fresh, p) == list(range(p, 2400, 8))
    # And a read of the newest offsets reads only the pieces spanning them.
    IndexPieces._cache.clear()
    IndexPieces._cached_bytes = 0
    before = IndexPieces.loaded
    other = Store.open(root).topic("t")
    assert _ids(other, 3, 290) == list(range(290 * 8 + 3, 2400, 8))
    assert IndexPieces.loaded - before <= 1


def test_a_retried_commit_is_found_among_rows_already_in_pieces(tmp_path, small_pieces):
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "64m", "log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(100):
        topic.commit(topic.write_chunks(make_batch(i, 1)), writer_id="w", batch_id=i)
    fresh = Store.open(root).topic("t")
    assert fresh.commit(fresh.write_chunks(make_batch(99, 1)), writer_id="w",
                        batch_id=99) == []
    assert fresh.latest_offsets() == {0: 100}


def _two_tier(tmp_path, **conf):
    hdd = tmp_path / "hdd"
    hdd.mkdir()
    return Store.open(str(tmp_path / "store"), {
        "storage.tiers.types": "FILE,HDD", "storage.tiers.second.paths": str(hdd),
        "storage.tiers.first.sizes": "1g", "log.segment.bytes": "16k",
        "log.checkpoint.interval": 10, **conf})


def test_a_move_replays_from_pieces_and_its_sources_pieces_go_after_a_checkpoint(
        tmp_path, small_pieces):
    store = _two_tier(tmp_path, **{"log.cleanup.grace.ms": 0})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(60):
        topic.append(make_batch(i * 100, 100))
    log_dir = os.path.join(str(tmp_path / "store"), "t", "_log")
    folders = set(os.listdir(os.path.join(log_dir, "_index")))
    sealed = [s for s in topic.segments() if s.sealed]
    assert f"0-{sealed[0].id.split('-')[1]}@1" in folders
    old = Store.open(str(tmp_path / "store")).topic("t")  # at the checkpoint before the move
    store.move_segment(sealed[0].id, 2, topic="t")
    # A handle older than the move replays it: the new rows' times come from the pieces.
    IndexPieces._cache.clear()
    IndexPieces._cached_bytes = 0
    assert _ids(old.refresh(), 0) == list(range(6000))
    assert store.collect_garbage(topic) >= 0
    src = f"0-{sealed[0].id.split('-')[1]}@1"
    assert src in os.listdir(os.path.join(log_dir, "_index"))  # no checkpoint past it yet
    for i in range(60, 80):
        topic.append(make_batch(i * 100, 100))
    store.collect_garbage(topic)
    assert src not in os.listdir(os.path.join(log_dir, "_index"))
    fresh = Store.open(str(tmp_path / "store")).topic("t")
    assert _ids(fresh, 0) == list(range(8000))
    assert all(r.ok for r in Store.open(str(tmp_path / "store")).check())


def test_a_damaged_piece_is_corrupt_log_naming_its_file(tmp_path, small_pieces):
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "64m", "log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(100):
        topic.append(make_batch(i, 1))
    settle()  # the checkpoint at 100 names every piece
    index = os.path.join(root, "t", "_log", "_index")
    [folder] = os.listdir(index)
    name = sorted(os.listdir(os.path.join(index, folder)))[0]
    path = os.path.join(index, folder, name)
    with open(path, "r+b") as f:
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    IndexPieces._cache.clear()
    IndexPieces._cached_bytes = 0
    fresh = Store.open(root).topic("t")
    assert fresh.latest_offsets() == {0: 100}  # opening reads no piece
    with pytest.raises(CorruptLog, match=name):
        _ids(fresh, 0)
    os.unlink(path)
    with pytest.raises(CorruptLog, match="missing"):
        _ids(Store.open(root).topic("t"), 0)


def test_a_checkpoint_whose_piece_fails_changes_nothing_and_the_next_one_is_written(
        tmp_path, small_pieces, monkeypatch):
    from tier_store.logstore.posix import PosixLogStore
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "64m", "log.checkpoint.interval": 80})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    real = PosixLogStore.put_piece
    calls = []

    def flaky(self, folder, name, data):
        calls.append(name)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        return real(self, folder, name, data)

    monkeypatch.setattr(PosixLogStore, "put_piece", flaky)
    for i in range(160):  # the checkpoint at 80 fails on its second piece; 160 is written
        topic.append(make_batch(i, 1))
    settle()
    assert len(calls) > 2 and topic.checkpointed_version == 160
    _, meta = _checkpoint(os.path.join(root, "t", "_log"), 160)
    [seg] = meta["segments"]
    assert sum(r[1] for r in seg["pieces"]) + meta["chunk_counts"][0] == 160
    assert _ids(Store.open(root).topic("t"), 0) == list(range(160))
    assert _ids(topic, 0) == list(range(160))



def test_segment_sizes_come_from_the_pieces_figures_and_match_the_rows(tmp_path,
                                                                      small_pieces):
    import numpy as np

    from tier_store.chunk_index import ChunkIndex
    store = _two_tier(tmp_path)
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=2)
    for i in range(90):
        topic.append(make_batch(i * 37, 37 + i % 5), partition=i % 2)
    sealed = [s for s in topic.segments() if s.sealed and s.partition == 0]
    store.move_segment(sealed[0].id, 2, merge_with=[sealed[1].id], topic="t")
    for i in range(90, 120):
        topic.append(make_batch(i * 37, 37), partition=i % 2)
    fresh = Store.open(str(tmp_path / "store")).topic("t")
    loads = ChunkIndex.loads
    infos = fresh.segments()
    assert ChunkIndex.loads - loads <= 2  # the inline rows once per partition; no rows()
    st = fresh.state()
    for p in range(2):
        rows = st.part(p).chunks.rows()
        padded = (rows["length"] + 63) // 64 * 64
        for info in (i for i in infos if i.partition == p):
            mine = rows["seq"] == int(info.id.split("-")[1])
            want = int(padded[mine].sum())
            last = np.flatnonzero(mine)[-1]
            assert info.aligned_bytes == want - int(padded[last] - rows["length"][last])


def test_a_partition_of_few_chunks_keeps_them_in_its_checkpoint(tmp_path):
    # Large chunks, many sealed segments, few rows: pieces would each hold a handful.
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "16k", "log.checkpoint.interval": 50})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(200):
        topic.append(make_batch(i * 100, 100))
    assert len(topic.segments()) > 20
    log_dir = os.path.join(root, "t", "_log")
    assert not os.path.exists(os.path.join(log_dir, "_index"))
    _, meta = _checkpoint(log_dir, 200)
    assert meta["chunk_counts"] == [200]


def test_a_sealed_segment_is_named_by_one_list_read_only_when_it_is_read(tmp_path,
                                                                         small_pieces):
    # Many sealed segments of many pieces each: the checkpoint names one list per segment.
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "64k", "log.checkpoint.interval": 50})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(1500):
        topic.append(make_batch(i, 1))
    log_dir = os.path.join(root, "t", "_log")
    _, meta = _checkpoint(log_dir, topic.checkpointed_version)
    sealed = [s for s in meta["segments"] if s["end"] < 1500 - 200]
    assert len(sealed) >= 3
    for s in sealed:  # one reference, the sum of the segment's pieces
        [ref] = s["pieces"]
        assert ref[0].endswith(".lst") and ref[1] == s["chunks"] > 32
        names = os.listdir(os.path.join(log_dir, "_index", f"0-{s['seq']}@1"))
        assert len([n for n in names if n.endswith(".idx")]) == -(-s["chunks"] // 32)
    # A fresh handle reads the list and the one piece of the offsets it reads, no more.
    IndexPieces._cache.clear()
    IndexPieces._cached_bytes = 0
    fresh = Store.open(root).topic("t")
    before = IndexPieces.loaded
    mid = sealed[1]["base"] + 40
    got = [i for b in fresh.read(0, mid, mid + 3) for i in b.column("key").to_pylist()]
    assert got == [mid, mid + 1, mid + 2]
    assert IndexPieces.loaded - before == 2  # one list, one piece
    assert _ids(fresh, 0) == list(range(1500))
    assert all(r.ok for r in Store.open(root).check())


def test_checkpoint_bytes_grow_by_segments_not_by_pieces(tmp_path, small_pieces):
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "256k", "log.checkpoint.interval": 100})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    log_dir = os.path.join(root, "t", "_log")
    sizes = {}
    for i in range(6000):
        topic.append(make_batch(i, 1))
        if topic.version % 1000 == 0:
            settle()
            sizes[topic.version], meta = _checkpoint(log_dir, topic.version)
            refs = sum(len(s["pieces"]) for s in meta["segments"])
            assert refs <= len(meta["segments"]) + 6000 // 32 // len(meta["segments"]) + 2
    # About 100 pieces more per 1,000 commits would be named one by one; lists hold them.
    assert sizes[6000] - sizes[2000] < 4 * (sizes[2000] - sizes[1000]) + 2000, sizes


@pytest.mark.parametrize("damage", ["flip", "truncate", "drop"])
def test_a_damaged_or_missing_list_is_corrupt_log_naming_it(tmp_path, small_pieces, damage):
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "64k", "log.checkpoint.interval": 50})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(1500):
        topic.append(make_batch(i, 1))
    index = os.path.join(root, "t", "_log", "_index")
    lists = sorted(os.path.join(index, d, n) for d in os.listdir(index)
                   for n in os.listdir(os.path.join(index, d)) if n.endswith(".lst"))
    path = lists[0]
    if damage == "drop":
        os.unlink(path)
    else:
        with open(path, "r+b") as f:
            if damage == "truncate":
                f.truncate(10)
            else:
                f.seek(5)
                b = f.read(1)
                f.seek(5)
                f.write(bytes([b[0] ^ 0x01]))
    IndexPieces._cache.clear()
    IndexPieces._cached_bytes = 0
    fresh = Store.open(root).topic("t")
    assert fresh.latest_offsets() == {0: 1500}  # opening reads no list
    with pytest.raises(CorruptLog, match=os.path.basename(path)):
        _ids(fresh, 0)


def test_a_list_whose_pieces_do_not_add_up_is_refused():
    from tier_store.index_pieces import PieceRef, checked_list, encode_list
    a = PieceRef("0" * 16 + "-4.idx", 4, 0, 4, 1, 2, 256, 10)
    b = PieceRef("1" * 16 + "-4.idx", 4, 4, 8, 2, 3, 256, 20)
    ref, data = encode_list([a, b])
    assert checked_list(data, ref, "x") == [a, b]
    assert (ref.rows, ref.base, ref.end, ref.span, ref.pad) == (8, 0, 8, 512, 20)
    lie = ref._replace(end=9)
    with pytest.raises(CorruptLog, match="add up"):
        checked_list(data, lie, "x")
    back, data2 = encode_list([b, a])  # out of order: named truly, still refused
    with pytest.raises(CorruptLog, match="order"):
        checked_list(data2, back, "x")


def test_rows_after_a_list_are_named_piece_by_piece_then_listed_again(tmp_path,
                                                                      small_pieces):
    # A segment deemed sealed may still take rows: a writer that wrote to it before the
    # partition rolled commits after. Its list then gives way to its pieces.
    from tier_store.chunk_index import ChunkIndex
    from tier_store.chunk_rows import SegmentRows
    from tier_store.entries import ChunkRecord
    topic = Store.open(str(tmp_path / "store")).create_topic("t", make_batch(0, 1).schema)
    topic.append(make_batch(0, 1))
    topic.write_checkpoint()
    source = topic.state().index
    assert source.store is not None
    index = ChunkIndex(0, source)
    offset = 0

    def add(n: int) -> None:
        nonlocal offset
        for _ in range(n):
            index.append(ChunkRecord(0, 7, 1, 64 * offset, 60, offset, 1, offset), 1000 + offset)
            offset += 1

    def cut() -> None:
        index.cut_pieces(lambda seq: True, source.put)

    add(64)
    cut()
    [listed] = index.pieces_of(7)
    assert listed.listed and listed.rows == 64
    add(40)
    cut()  # a block of the new rows becomes a piece; the list gives way
    refs = index.pieces_of(7)
    assert [r.rows for r in refs] == [32, 32, 32] and not any(r.listed for r in refs)
    add(24)
    cut()
    [again] = index.pieces_of(7)
    assert again.listed and again.rows == 128 and again != listed
    assert index.segment_rows(7)["base"].tolist() == list(range(128))
    # A new reader of the segment, from what a checkpoint names, reads the same rows.
    fresh = ChunkIndex(0, source, None, [SegmentRows(7, 1, [again])])
    assert fresh.overlapping(100, 103)["base"].tolist() == [100, 101, 102]
    assert fresh.segment_rows(7)["ts"].tolist() == [1000 + i for i in range(128)]


def test_a_commit_looks_over_an_active_segments_pieces_once_per_new_piece(tmp_path,
                                                                         small_pieces):
    # A writer's commit asks, per chunk, which rows its segment got since a time. Over the
    # pieces of a long-lived active segment that must not be a scan per commit.
    from tier_store.chunk_rows import SegmentRows
    store = Store.open(str(tmp_path / "store"), {"log.segment.bytes": "64m",
                                                 "log.checkpoint.interval": 10})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=1)
    for i in range(200):  # 20 checkpoints: pieces of 32 rows in the active segment
        topic.commit(topic.write_chunks(make_batch(i, 1)), writer_id="w", batch_id=i)
    before = SegmentRows.piece_scans
    for i in range(200, 400):
        topic.commit(topic.write_chunks(make_batch(i, 1)), writer_id="w", batch_id=i)
    assert SegmentRows.piece_scans - before <= 20  # at most once per checkpoint, not commit
    assert topic.latest_offsets() == {0: 400}


def test_commits_go_on_while_a_checkpoint_writes_its_pieces(tmp_path, small_pieces,
                                                            monkeypatch):
    # Cutting a roll's sealed segments into pieces held the topic's lock: 8 partitions'
    # took 236 ms of one commit. The pieces are now written outside it.
    import threading

    from tier_store.logstore.posix import PosixLogStore
    real = PosixLogStore.put_piece
    writing, release = threading.Event(), threading.Event()
    writers = set()

    def slow(self, folder, name, data):
        writers.add(threading.current_thread().name)
        writing.set()
        assert release.wait(30), "the test never let the piece be written"
        return real(self, folder, name, data)

    monkeypatch.setattr(PosixLogStore, "put_piece", slow)
    root = str(tmp_path / "store")
    store = Store.open(root, {"log.segment.bytes": "16k", "log.checkpoint.interval": 100})
    topic = store.create_topic("t", make_batch(0, 1).schema, partitions=2)
    for i in range(100):  # 50 rows a partition: the checkpoint at 100 cuts a block each
        topic.append(make_batch(i, 1), partition=i % 2)
    assert writing.wait(30)
    for i in range(100, 140):  # while its first piece is being written
        topic.append(make_batch(i, 1), partition=i % 2)
    assert topic.version == 140 and topic.checkpointed_version < 100
    release.set()
    settle()
    assert topic.checkpointed_version == 100
    assert threading.current_thread().name not in writers
    # The pieces replaced the rows they hold: the next checkpoint names them, and a fresh
    # handle reads every record once, in order.
    topic.write_checkpoint()
    _, meta = _checkpoint(os.path.join(root, "t", "_log"), 140)
    assert sum(len(s["pieces"]) for s in meta["segments"]) >= 2
    assert sum(meta["chunk_counts"]) < 140
    fresh = Store.open(root).topic("t")
    for p in range(2):
        assert _ids(fresh, p) == list(range(p, 140, 2))
    assert all(r.ok for r in Store.open(root).check())
