"""Partitioning by key: a vectorised hash that is stable across processes and releases.

The hash of a key value is defined here, not borrowed from a library whose output may change:

* integers, booleans, dates, times, timestamps and durations: the value as a signed 64-bit
  integer (its physical Arrow value), mixed with MurmurHash3's 64-bit finaliser ``fmix64``;
* strings and binary: 64-bit FNV-1a over the bytes (UTF-8 for strings), then ``fmix64``;
* floats: the IEEE-754 bits of the value as float64 (with -0.0 folded to 0.0), then ``fmix64``.

The partition is ``hash % partitions`` (hash taken as unsigned). Null keys go to partition 0.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .errors import InvalidArgument

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_C1 = np.uint64(0xFF51AFD7ED558CCD)
_C2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, element-wise on uint64 (wrapping arithmetic)."""
    h = h.copy()
    h ^= h >> _S33
    h *= _C1
    h ^= h >> _S33
    h *= _C2
    h ^= h >> _S33
    return h


def _fnv1a(arr: pa.Array) -> np.ndarray:
    arr = arr.cast(pa.large_binary()) if not pa.types.is_large_binary(arr.type) else arr
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    data_buf = arr.buffers()[2]
    data = np.zeros(0, np.uint8) if data_buf is None else np.frombuffer(data_buf, np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    # One pass per byte position across all keys: keys are short, rows are many.
    for j in range(int(lengths.max()) if n else 0):
        live = lengths > j
        idx = np.nonzero(live)[0]
        b = data[starts[idx] + j].astype(np.uint64)
        h[idx] = (h[idx] ^ b) * _FNV_PRIME
    return h


def hash_keys(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The stable 64-bit hash of each value of ``column`` (uint64; nulls hash to 0)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    with np.errstate(over="ignore"):
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
                or pa.types.is_large_binary(t):
            h = fmix64(_fnv1a(column.cast(pa.large_binary())))
        elif pa.types.is_floating(t):
            f = column.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
            f = np.where(f == 0.0, 0.0, f)
            h = fmix64(f.view(np.uint64))
        elif pa.types.is_boolean(t):
            h = fmix64(column.cast(pa.int64()).fill_null(0).to_numpy().view(np.uint64))
        elif (pa.types.is_integer(t) or pa.types.is_temporal(t)):
            storage = column.view(_int_of_width(t.bit_width)) if not pa.types.is_integer(t) \
                else column
            ints = storage.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            h = fmix64(ints.astype(np.int64).view(np.uint64))
        else:
            raise InvalidArgument(
                f"cannot partition by a key column of type {t}: use an integer, string, binary, "
                "float, boolean, date or timestamp column"
            )
    if column.null_count:
        h[column.is_null().to_numpy(zero_copy_only=False)] = 0
    return h


def _int_of_width(bits: int) -> pa.DataType:
    return {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}[bits]


def partition_of(column: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """The partition of each row: ``hash % partitions``, nulls to 0 (int64 array)."""
    h = hash_keys(column)
    parts = (h % np.uint64(partitions)).astype(np.int64)
    if column.null_count:
        parts[column.is_null().to_numpy(zero_copy_only=False)] = 0
    return parts
