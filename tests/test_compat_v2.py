"""A store written by the release whose checkpoints name each index piece (checkpoint
format 2) opens, reads, takes commits and moves to format 3, whose checkpoints name a
sealed segment's pieces by one list: ``fixtures/store_v2.tar.gz``, made by
``fixtures/make_store_v2.py`` with that release."""

from __future__ import annotations

import json
import os
import tarfile

import pyarrow as pa
import pytest

from tier_store import Store, chunk_index
from tier_store.commit_log import checkpoint_body

from .conftest import settle

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "store_v2.tar.gz")


def _batch(start: int, n: int) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "name": [f"row-{i:08d}-" * 2 for i in range(start, start + n)]})


def _expected() -> dict[int, list[int]]:
    ids: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for i in range(90):
        ids[i % 3].extend(range(30 * i, 30 * i + 30))
    ids[2].extend(range(2700, 2703))
    return ids


def _ids(topic, p: int) -> list[int]:
    return [i for b in topic.read(p, 0) for i in b.column("id").to_pylist()]


def _meta(log_dir: str, version: int) -> dict:
    with open(os.path.join(log_dir, f"{version:020d}.checkpoint"), "rb") as f:
        table = pa.ipc.open_file(checkpoint_body(f.read())).read_all()
    return json.loads(table.schema.metadata[b"pafka.state"])


@pytest.fixture
def old_store(tmp_path) -> str:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return str(tmp_path / "store")


def test_a_format_2_store_opens_and_reads_as_it_was_written(old_store):
    log_dir = os.path.join(old_store, "t", "_log")
    meta = _meta(log_dir, 90)
    assert meta["format"] == 2 and max(len(s["pieces"]) for s in meta["segments"]) > 1
    topic = Store.open(old_store).topic("t")
    assert topic.latest_offsets() == {0: 900, 1: 900, 2: 903}
    assert {p: _ids(topic, p) for p in range(3)} == _expected()
    assert {s.tier for s in topic.segments()} == {1, 2}  # the move it holds, replayed
    assert topic.positions()["g"] == {0: 14, 1: 7}
    assert topic.commit(topic.write_chunks(_batch(0, 5), partition=0), writer_id="w1",
                        batch_id=89) == []


def test_a_format_2_store_takes_commits_and_names_sealed_segments_by_lists(
        old_store, monkeypatch):
    monkeypatch.setattr(chunk_index, "PIECE_ROWS", 2)
    topic = Store.open(old_store).topic("t")
    for i in range(25):  # past two checkpoints (every 10 versions)
        topic.commit(topic.write_chunks(_batch(5000 + 10 * i, 10), partition=i % 3),
                     writer_id="w3", batch_id=i)
    settle()  # the checkpoints are written after the commits return
    log_dir = os.path.join(old_store, "t", "_log")
    meta = _meta(log_dir, topic.checkpointed_version)
    assert meta["format"] == 3
    listed = [s for s in meta["segments"] if s["pieces"] and s["pieces"][0][0].endswith(".lst")]
    assert len(listed) >= 8  # the old sealed segments, each by one list
    assert all(len(s["pieces"]) == 1 for s in listed)
    want = _expected()
    for i in range(25):
        want[i % 3].extend(range(5000 + 10 * i, 5000 + 10 * i + 10))
    assert {p: _ids(Store.open(old_store).topic("t"), p) for p in range(3)} == want
    assert all(r.ok for r in Store.open(old_store).check())
