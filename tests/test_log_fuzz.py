"""Fuzzing the commit log's decoders (issue #20, point 4): whatever bytes an entry or a
checkpoint holds, with or without a valid checksum, decoding and replaying them gives a state
or :class:`CorruptLog`, never another exception.

Hypothesis generates JSON values in every field of real entries and checkpoint states (then
signs them, so that the checks behind the checksum are reached), and raw bytes. Atheris (when
installed) fuzzes the same decoders coverage-guided, in a child process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tier_store.commit_log import checkpoint_body, decode_checkpoint, encode_checkpoint
from tier_store.entries import (
    AppendEntry,
    ChunkRecord,
    CreateEntry,
    MoveEntry,
    PositionEntry,
    decode,
    entry_body,
    signed,
)
from tier_store.errors import CorruptLog
from tier_store.schemas import schema_to_text
from tier_store.state import TopicState

from .conftest import PYTHON, SCHEMA

EXAMPLES = int(os.environ.get("PAFKA_FUZZ_EXAMPLES", "300"))
ATHERIS_RUNS = int(os.environ.get("PAFKA_ATHERIS_RUNS", "20000"))
TOPIC_ID = "0f0e0d0c-id"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def base_state() -> TopicState:
    """Topic ``t``: created with 2 partitions, three chunks appended, a position."""
    st = TopicState("t")
    st.apply(0, CreateEntry(1, schema_to_text(SCHEMA), 2, {}, TOPIC_ID))
    for v, (p, base) in enumerate([(0, 0), (1, 0), (0, 10)], start=1):
        st.apply(v, AppendEntry(1 + v, (ChunkRecord(p, 0, 1, 4096 + base * 100, 100, base,
                                                    10, 7),), "w", v))
    st.apply(4, PositionEntry(5, "g", {"0": 5}))
    return st


# Realistic entries to mutate: one of each kind that names numbers and places.
TEMPLATES = [
    AppendEntry(9, (ChunkRecord(0, 0, 1, 8192, 100, 20, 10, 7, 1, 2),), "w", 9),
    MoveEntry(9, 1, (0,), 1, 1, (ChunkRecord(1, 1, 1, 4096, 100, 0, 10, 7),)),
    PositionEntry(9, "g", {"0": 3, "1": 0}),
]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12) | st.sampled_from(["../../x", "/etc", "0-0", "1-0", "0", "-1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    holder = copy
    for k in path[:-1]:
        holder = holder[k]
    holder[path[-1]] = new
    return copy


def replay(data: bytes) -> None:
    """Decode ``data`` as entry 5 and apply it to :func:`base_state`."""
    st = base_state()
    where = "fuzz/00000000000000000005.json"
    try:
        st.apply(5, decode(data, where, 5, TOPIC_ID), where)
    except CorruptLog:
        return
    # Accepted: the state still answers what readers ask of it.
    for q in st.parts:
        rows = q.chunks.rows()
        assert (rows["base"][1:] >= rows["base"][:-1]).all()
        assert q.start_offset <= q.next_offset


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_signed_entry_with_any_field_changed_gives_a_state_or_corrupt_log(data):
    template = data.draw(st.sampled_from(TEMPLATES))
    body = json.loads(entry_body(template.encode(5, TOPIC_ID)))
    path = data.draw(st.sampled_from(_paths(body)))
    new = data.draw(json_values | st.just("<removed>"))
    if new == "<removed>":
        changed = json.loads(json.dumps(body))
        holder = changed
        for k in path[:-1]:
            holder = holder[k]
        del holder[path[-1]]
    else:
        changed = _replace(body, path, new)
    replay(signed(json.dumps(changed).encode(), 5, TOPIC_ID))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=400), st.booleans())
def test_any_entry_bytes_give_a_state_or_corrupt_log(raw, sign):
    replay(signed(raw, 5, TOPIC_ID) if sign and raw.rstrip().endswith(b"}") else raw)


def _checkpoint_meta_and_table() -> tuple[dict[str, Any], pa.Table]:
    st = base_state()
    table = st.to_checkpoint()
    return json.loads(table.schema.metadata[b"pafka.state"]), table


def load_checkpoint(data: bytes) -> None:
    """Read ``data`` as checkpoint 4 of topic ``t`` as the commit log does, and use it."""
    where = "fuzz/00000000000000000004.checkpoint"
    try:
        st = decode_checkpoint(data, 4, "t", where)
        for q in st.parts:
            q.chunks.rows()
        st.apply(5, PositionEntry(9, "h", {}), where)
    except CorruptLog:
        return


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_signed_checkpoint_with_any_field_changed_gives_a_state_or_corrupt_log(data):
    meta, table = _checkpoint_meta_and_table()
    path = data.draw(st.sampled_from(_paths(meta)))
    changed = _replace(meta, path, data.draw(json_values))
    t = table.replace_schema_metadata({b"pafka.state": json.dumps(changed).encode()})
    load_checkpoint(encode_checkpoint(t, 4))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_checkpoint_bytes_changed_anywhere_give_a_state_or_corrupt_log(data):
    _, table = _checkpoint_meta_and_table()
    good = encode_checkpoint(table, 4)
    raw = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    resign = data.draw(st.booleans())  # reach the Arrow parser behind the checksum
    if resign:
        body = bytes(checkpoint_body(bytes(raw)))
        raw = bytearray(_resigned(body))
    load_checkpoint(bytes(raw))


def _resigned(ipc_file: bytes) -> bytes:
    """``ipc_file`` (Arrow IPC file bytes, perhaps damaged) with a valid trailer of 4."""
    from tier_store.commit_log import _TRAILER, _checkpoint_digest  # noqa: PLC0415
    return ipc_file + _TRAILER.pack(b"PAFKACP1", 4, _checkpoint_digest(ipc_file, 4))


# -- atheris ----------------------------------------------------------------------------------
ATHERIS_TARGET = """
import sys, atheris
with atheris.instrument_imports():
    from tests import test_log_fuzz as f
from tier_store.entries import signed

def one(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 4, data[1:]
    if mode == 0:
        f.replay(rest)
    elif mode == 1:
        f.replay(signed(rest, 5, f.TOPIC_ID) if rest.rstrip().endswith(b"}") else rest)
    elif mode == 2:
        f.load_checkpoint(rest)
    else:
        f.load_checkpoint(f._resigned(rest))

atheris.Setup([sys.argv[0], "-runs=%d" % int(sys.argv[1]), sys.argv[2]], one)
atheris.Fuzz()
"""


def test_atheris_finds_no_exception_but_corrupt_log(tmp_path):
    """Coverage-guided fuzzing of the same decoders: an exception other than CorruptLog (or a
    crash) fails the child."""
    pytest.importorskip("atheris")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, e in enumerate(TEMPLATES):
        (corpus / f"e{i}").write_bytes(b"\x01" + entry_body(e.encode(5, TOPIC_ID)))
    _, table = _checkpoint_meta_and_table()
    cp = encode_checkpoint(table, 4)
    (corpus / "c").write_bytes(b"\x03" + bytes(checkpoint_body(cp)))
    p = subprocess.run([PYTHON, "-c", ATHERIS_TARGET, str(ATHERIS_RUNS), str(corpus)],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    done = [line for line in p.stderr.splitlines() if line.startswith("Done ")]
    assert done, p.stderr[-2000:]
    sys.stderr.write(f"atheris: {done[-1]}\n")
