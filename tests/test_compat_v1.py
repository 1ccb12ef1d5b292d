"""A store written by the release before index pieces (checkpoint format 1) opens, reads,
takes commits and moves to the current format as it goes: ``fixtures/store_v1.tar.gz``, made by
``fixtures/make_store_v1.py`` with that release."""

from __future__ import annotations

import os
import tarfile

import pyarrow as pa
import pytest

from tier_store import Store

from .conftest import settle

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "store_v1.tar.gz")


def _batch(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "name": [f"row-{i:08d}-" * 2 for i in range(start, start + n)]})


def _expected() -> dict[int, list[int]]:
    ids: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for i in range(45):
        ids[i % 3].extend(range(300 * i, 300 * i + 300))
    ids[2].extend(range(13500, 13503))
    return ids


def _ids(topic, p: int) -> list[int]:
    return [i for b in topic.read(p, 0) for i in b.column("id").to_pylist()]


@pytest.fixture
def old_store(tmp_path) -> str:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / "store")


def test_a_format_1_store_opens_and_reads_as_it_was_written(old_store):
    store = Store.open(old_store)
    topic = store.topic("t")
    log_dir = os.path.join(old_store, "t", "_log")
    assert not os.path.exists(os.path.join(log_dir, "_index"))
    assert topic.latest_offsets() == {0: 4500, 1: 4500, 2: 4503}
    want = _expected()
    assert {p: _ids(topic, p) for p in range(3)} == want
    assert {s.tier for s in topic.segments()} == {1, 2}  # the move it holds, replayed
    assert topic.positions()["g"] == {0: 14, 1: 7}
    assert store.tiers[0].capacity == 1 << 30
    # Writer ids survive: a replayed batch is acknowledged, not appended.
    assert topic.commit(topic.write_chunks(_batch(0, 5), partition=0), writer_id="w1",
                        batch_id=43) == []


def test_a_format_1_store_takes_commits_and_writes_current_checkpoints(old_store,
                                                                       monkeypatch):
    import json

    from tier_store import chunk_index
    from tier_store.commit_log import checkpoint_body
    monkeypatch.setattr(chunk_index, "PIECE_ROWS", 4)  # pieces, for so few chunks
    store = Store.open(old_store)
    topic = store.topic("t")
    for i in range(25):  # past two checkpoints (every 10 versions)
        topic.commit(topic.write_chunks(_batch(20000 + 10 * i, 10), partition=i % 3),
                     writer_id="w3", batch_id=i)
    settle()  # the checkpoints are written after the commits return
    log_dir = os.path.join(old_store, "t", "_log")
    cp = topic.checkpointed_version
    with open(os.path.join(log_dir, f"{cp:020d}.checkpoint"), "rb") as f:
        table = pa.ipc.open_file(checkpoint_body(f.read())).read_all()
    meta = json.loads(table.schema.metadata[b"pafka.state"])
    assert meta["format"] == 3
    assert os.listdir(os.path.join(log_dir, "_index"))  # the sealed segments' rows
    # Fewer rows inline than chunks: the rest are in pieces.
    assert table.num_rows < sum(s["chunks"] for s in meta["segments"])
    fresh = Store.open(old_store).topic("t")
    want = _expected()
    for i in range(25):
        want[i % 3].extend(range(20000 + 10 * i, 20000 + 10 * i + 10))
    assert {p: _ids(fresh, p) for p in range(3)} == want
    assert fresh.commit(fresh.write_chunks(_batch(0, 5), partition=0), writer_id="w3",
                        batch_id=24) == []
    assert all(r.ok for r in Store.open(old_store).check())
