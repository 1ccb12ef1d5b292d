"""The key hash is a documented function: checked here against a plain-Python rendering of
the documentation, and against fixed values so that a change of releases cannot move keys."""

import datetime
import struct
import subprocess

import pyarrow as pa
import pytest

from tier_store import PafkaError
from tier_store.hashing import hash_keys, partition_of

from .conftest import PYTHON, ROOT

M = (1 << 64) - 1


def fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & M
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & M
    h ^= h >> 33
    return h


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & M
    return h


def test_integer_keys_follow_the_documented_hash():
    vals = [0, 1, -1, 42, 2**62, -(2**63)]
    got = hash_keys(pa.array(vals, pa.int64())).tolist()
    assert got == [fmix64(v & M) for v in vals]
    assert hash_keys(pa.array(vals[:4], pa.int32())).tolist() == got[:4]


def test_string_and_binary_keys_follow_the_documented_hash():
    vals = ["", "a", "user-1", "ünïcödé", "x" * 40]
    want = [fmix64(fnv1a(v.encode())) for v in vals]
    assert hash_keys(pa.array(vals)).tolist() == want
    assert hash_keys(pa.array([v.encode() for v in vals], pa.binary())).tolist() == want
    assert hash_keys(pa.array(vals, pa.large_string())).tolist() == want


def test_float_and_temporal_keys():
    f = [1.5, -0.0, 0.0]
    bits = [struct.unpack("<Q", struct.pack("<d", x if x != 0 else 0.0))[0] for x in f]
    assert hash_keys(pa.array(f)).tolist() == [fmix64(b) for b in bits]
    d = pa.array([datetime.date(2024, 1, 2)], pa.date32())
    assert hash_keys(d).tolist() == [fmix64(19724)]


def test_fixed_values_do_not_move():
    assert partition_of(pa.array(["user-1", "user-2", "user-3"]), 8).tolist() == \
        [fmix64(fnv1a(b"user-1")) % 8, fmix64(fnv1a(b"user-2")) % 8, fmix64(fnv1a(b"user-3")) % 8]
    assert hash_keys(pa.array([12345], pa.int64())).tolist() == [fmix64(12345)]


def test_nulls_go_to_partition_zero_and_sliced_arrays_hash_like_whole_ones():
    arr = pa.array(["a", None, "b", "c"])
    assert partition_of(arr, 5).tolist()[1] == 0
    assert hash_keys(arr.slice(2)).tolist() == hash_keys(pa.array(["b", "c"])).tolist()


def test_hash_is_the_same_in_another_process():
    code = ("from tier_store.hashing import hash_keys; import pyarrow as pa; "
            "print(hash_keys(pa.array(['k1','k2', 'k3'])).tolist())")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin"}, check=True).stdout
    assert out.strip() == str(hash_keys(pa.array(["k1", "k2", "k3"])).tolist())


def test_unsupported_key_type_is_a_clear_error():
    with pytest.raises(PafkaError, match="cannot partition by a key column of type list"):
        hash_keys(pa.array([[1]]))
