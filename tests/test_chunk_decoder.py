"""ChunkDecoder: the single-batch fast path gives what Arrow's stream reader gives, and every
other chunk takes the general path."""

import numpy as np
import pyarrow as pa
import pytest

from tier_store import CorruptSegment
from tier_store.chunk import EncodedChunk, _encode, read_chunk
from tier_store.chunk_decoder import ChunkDecoder

from .conftest import SCHEMA, make_batch


def encode(batches, schema=SCHEMA, compression="none") -> pa.Buffer:
    c = EncodedChunk.of(batches, schema, compression)
    out = pa.allocate_buffer(c.size)
    c.write_into(out)
    return out


def general(buf):
    return list(read_chunk(buf, "test"))


def where():
    return "t/0 offsets 0..9 in seg"


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_single_batch_chunks_decode_by_the_fast_path_to_the_same_batches(compression):
    d = ChunkDecoder()
    bufs = [encode([make_batch(i * 100, 100)], compression=compression) for i in range(5)]
    assert d._single(bufs[1]) is None  # nothing read yet: no schema to compare with
    for buf in bufs:
        got = d.batches(buf, where)
        assert len(got) == 1 and got[0].equals(general(buf)[0])
        assert got[0].schema.equals(SCHEMA, check_metadata=True)
    assert d._single(bufs[3]) is not None  # after the first chunk: the fast path


def test_sliced_and_null_holding_batches_round_trip():
    b = pa.record_batch([pa.array([1, None, 3, 4] * 50, pa.int64()),
                         pa.array([None, 2, 3, 4] * 50, pa.int64()),
                         pa.array(["a", None, "ccc", ""] * 50)], schema=SCHEMA).slice(3, 150)
    d = ChunkDecoder()
    for _ in range(2):
        (got,) = d.batches(encode([b]), where)
        assert got.equals(b)


def test_chunks_of_several_batches_take_the_general_path_and_keep_their_order():
    # Written so by earlier releases, or when the batches cannot be joined into one.
    d = ChunkDecoder()
    d.batches(encode([make_batch(0, 10)]), where)
    buf = _encode([make_batch(10, 10), make_batch(20, 5), make_batch(25, 7)], SCHEMA, "none")
    assert d._single(buf) is None
    got = d.batches(buf, where)
    assert [b.num_rows for b in got] == [10, 5, 7]
    assert pa.Table.from_batches(got).column("key").to_pylist() == list(range(10, 32))


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_several_batches_are_written_as_one_that_takes_the_fast_path(compression):
    d = ChunkDecoder()
    d.batches(encode([make_batch(0, 10)]), where)
    parts = [make_batch(10, 10), make_batch(20, 5).slice(1, 3), make_batch(25, 7)]
    buf = encode(parts, compression=compression)
    (got,) = d.batches(buf, where)
    assert d._single(buf) is not None
    assert got.equals(pa.Table.from_batches(parts).combine_chunks().to_batches()[0])


def test_dictionary_batches_are_joined_or_kept_apart_but_never_mixed_up():
    dschema = pa.schema([("key", pa.int64()), ("tag", pa.dictionary(pa.int32(), pa.string()))])
    parts = [pa.record_batch([pa.array(np.arange(i, i + 3)),
                              pa.array(tags).dictionary_encode()], schema=dschema)
             for i, tags in ((0, ["x", "y", "x"]), (3, ["z", "z", "y"]))]
    got = pa.Table.from_batches(general(encode(parts, dschema)))
    assert got.column("key").to_pylist() == list(range(6))
    assert got.column("tag").to_pylist() == ["x", "y", "x", "z", "z", "y"]


def test_another_schema_or_dictionaries_take_the_general_path():
    d = ChunkDecoder()
    d.batches(encode([make_batch(0, 10)]), where)
    other = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.large_string())])
    b = make_batch(0, 10).cast(other)
    buf = encode([b], other)
    assert d._single(buf) is None
    assert d.batches(buf, where)[0].equals(b)

    dschema = pa.schema([("key", pa.int64()), ("tag", pa.dictionary(pa.int32(), pa.string()))])
    db = pa.record_batch([pa.array(np.arange(6)),
                          pa.array(["x", "y", "x", "z", "y", "x"]).dictionary_encode()],
                         schema=dschema)
    dd = ChunkDecoder()
    for _ in range(2):
        buf = encode([db], dschema)
        assert dd._single(buf) is None
        assert dd.batches(buf, where)[0].equals(db)


def test_damaged_chunks_are_reported_with_where_they_are():
    d = ChunkDecoder()
    good = encode([make_batch(0, 100)])
    d.batches(good, where)
    raw = bytearray(good.to_pybytes())
    truncated = pa.py_buffer(bytes(raw[: len(raw) - 200]))
    with pytest.raises(CorruptSegment, match="t/0 offsets 0..9 in seg"):
        d.batches(truncated, where)
    no_end = pa.py_buffer(bytes(raw[:-8]) + b"\x00" * 8)
    assert d._single(no_end) is None  # the end marker is checked, not assumed
    garbage = pa.py_buffer(b"\x01" * 64)
    with pytest.raises(CorruptSegment, match="not a readable Arrow IPC stream"):
        d.batches(garbage, where)
