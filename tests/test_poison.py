"""No input can poison a topic: malformed batches are refused on every writing path, and a
malformed chunk already stored (by an older version, or with a forged checksum) is a clear
error for every reader, never a crash or a wrong row, and can be skipped.

Readers run in child processes (tests/poison_reader.py, the ``pafka`` command, Spark's
Python workers), so that a signal fails the test rather than the session."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from tier_store import InvalidArgument, Store
from tier_store.chunk import EncodedChunk

from .conftest import ROOT
from .malformed import STRINGS, Malformed, good_batch, variants
from .support import pafka

VARIANTS = variants()
IDS = [m.name.replace(" ", "-") for m in VARIANTS]


def _topic(tmp_path, m: Malformed):
    store = Store.open(str(tmp_path / "store"))
    return store, store.create_topic("t", m.schema, partitions=1)


def _nothing_stored(topic) -> None:
    topic.refresh()
    assert topic.latest_offsets() == {0: 0}
    assert topic.segments() == [] or all(s.records == 0 for s in topic.segments())


def _refusal(m: Malformed, text: str) -> None:
    assert "not valid Arrow data" in text, text
    if m.column is not None:
        assert f"column {m.column!r}" in text, text
    if m.row is not None:
        assert f"row {m.row}," in text or f"row {m.row} " in text, text


# -- writing: every path validates before it stores ------------------------------------------
@pytest.mark.parametrize("m", VARIANTS, ids=IDS)
def test_append_refuses_a_malformed_batch_and_stores_nothing(tmp_path, m):
    _, topic = _topic(tmp_path, m)
    with pytest.raises(InvalidArgument) as e:
        topic.append(m.batch)
    _refusal(m, str(e.value))
    assert "topic 't'" in str(e.value) and "nothing was stored" in str(e.value)
    _nothing_stored(topic)
    topic.append(good_batch(m.schema, 0))  # the topic is as usable as before
    assert topic.latest_offsets() == {0: 4}


@pytest.mark.parametrize("m", VARIANTS, ids=IDS)
def test_write_chunks_refuses_a_malformed_batch_before_writing_a_byte(tmp_path, m):
    _, topic = _topic(tmp_path, m)
    with pytest.raises(InvalidArgument) as e:
        topic.write_chunks([m.batch], partition=0)
    _refusal(m, str(e.value))
    assert topic.active_segment(0) is None  # no segment was even started
    assert topic.commit([]) == []
    _nothing_stored(topic)


@pytest.mark.parametrize("m", VARIANTS, ids=IDS)
def test_produce_refuses_a_malformed_arrow_file_in_one_line(tmp_path, m):
    _, topic = _topic(tmp_path, m)
    path = str(tmp_path / "bad.arrow")
    with pa.ipc.new_file(path, m.schema) as w:  # Arrow's writer does not validate either
        w.write_batch(m.batch)
    r = pafka("produce", str(tmp_path / "store"), "t", "--from", path)
    assert r.returncode == 1, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and path in lines[0], r.stderr
    if m.column is not None:  # else Arrow's own reader of the file finds the batch broken
        assert f"column {m.column!r}" in lines[0]
        assert f"row {m.row + 1}" in lines[0]  # a file's records count from 1
    _nothing_stored(topic)


def test_a_batch_of_valid_rows_after_good_ones_names_the_row_of_the_whole_write(tmp_path):
    _, topic = _topic(tmp_path, VARIANTS[1])
    bad = VARIANTS[1].batch  # invalid UTF-8 in its row 1
    with pytest.raises(InvalidArgument, match=r"column 'name', row 5 "):
        topic.append([good_batch(STRINGS, 0), bad])


def test_batches_of_two_schemas_in_one_write_are_refused_in_one_line(tmp_path):
    _, topic = _topic(tmp_path, VARIANTS[0])
    other = pa.record_batch([pa.array([1])], names=["x"])
    with pytest.raises(InvalidArgument, match="must share one schema"):
        topic.append([good_batch(STRINGS, 0), other])


# -- reading a malformed chunk that is already stored -----------------------------------------
@pytest.fixture
def planted(tmp_path, request):
    """A topic holding a good chunk (ids 0..3), a malformed one stored with a genuine
    checksum as an older version would have stored it (offsets 4..7), and a good one
    (ids 8..11)."""
    m: Malformed = request.param
    store, topic = _topic(tmp_path, m)
    topic.append(good_batch(m.schema, 0))
    # The chunk a writer that does not validate stores: the batch encoded as it is.
    chunk = EncodedChunk.of([m.batch], m.schema, "none")
    topic.commit([topic._append_chunk(0, chunk, None, True)])
    topic.append(good_batch(m.schema, 8))
    store.close()
    return m, str(tmp_path / "store")


def _bad(m: Malformed) -> str:
    """The offsets of the planted chunk, as errors and warnings write them."""
    return f"[4, {4 + m.batch.num_rows})"


def _child(root: str, how: str, *extra: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "tests.poison_reader", root, "t", how, *extra],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, f"the reader died (exit {r.returncode}): {r.stderr[-2000:]}"
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "stderr": r.stderr}


def _names_the_chunk(message: str, root: str, m: Malformed) -> None:
    assert "partition 0" in message and _bad(m) in message, message
    assert root in message, message  # the file


@pytest.mark.parametrize("planted", VARIANTS, ids=IDS, indirect=True)
@pytest.mark.parametrize("how", ["read", "consumer"])
def test_python_readers_get_corrupt_segment_naming_the_chunk_never_a_crash(planted, how):
    m, root = planted
    got = _child(root, how)
    assert got.get("error") == "CorruptSegment", got
    _names_the_chunk(got["message"], root, m)


@pytest.mark.parametrize("planted", VARIANTS, ids=IDS, indirect=True)
@pytest.mark.parametrize("how", ["read", "consumer"])
def test_python_readers_told_to_skip_go_past_the_chunk_with_a_warning(planted, how):
    m, root = planted
    got = _child(root, how, "--skip-corrupt")
    assert got.get("ids") == [0, 1, 2, 3, 8, 9, 10, 11], got
    assert f"skips offsets {_bad(m)}" in got["stderr"], got["stderr"]


@pytest.mark.parametrize("planted", VARIANTS, ids=IDS, indirect=True)
def test_pafka_consume_fails_in_one_line_or_skips_and_check_lists_the_chunk(planted):
    m, root = planted
    r = pafka("consume", root, "t", "--format", "json")
    assert r.returncode == 1, r
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "--skip-corrupt" in err[0], r.stderr
    _names_the_chunk(err[0], root, m)

    r = pafka("consume", root, "t", "--format", "json", "--skip-corrupt")
    assert r.returncode == 0, r
    assert [json.loads(line)["id"] for line in r.stdout.splitlines()] == \
        [0, 1, 2, 3, 8, 9, 10, 11]
    assert f"skips offsets {_bad(m)}" in r.stderr

    r = pafka("check", root, "--json")
    assert r.returncode != 0, r
    problems = json.dumps(json.loads(r.stdout))
    assert _bad(m) in problems and "matches its checksum" in problems, problems


SPARK_VARIANTS = [m for m in VARIANTS if m.readable_by_spark]


@pytest.mark.parametrize("planted", SPARK_VARIANTS,
                         ids=[m.name.replace(" ", "-") for m in SPARK_VARIANTS], indirect=True)
def test_spark_read_fails_naming_the_chunk_or_skips_it_without_failondataloss(spark, planted):
    m, root = planted
    with pytest.raises(Exception) as e:  # noqa: PT011 - Spark wraps the store's error
        spark.read.format("pafka").option("topic", "t").load(root).collect()
    assert "CorruptSegment" in str(e.value) and _bad(m) in str(e.value), str(e.value)[-3000:]
    rows = spark.read.format("pafka").option("topic", "t").option("failOnDataLoss", "false") \
        .load(root).collect()
    assert sorted(r["id"] for r in rows) == [0, 1, 2, 3, 8, 9, 10, 11]
