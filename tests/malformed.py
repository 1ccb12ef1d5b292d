"""Malformed Arrow record batches, as a hostile or buggy producer hands them over.

pyarrow checks only the structure of what it builds from raw buffers (``from_buffers``) or
takes over the C data interface, not the values: each batch here passes at least that far,
and each would poison a topic that stored it. ``variants()`` builds them fresh, in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyarrow.cffi import ffi

STRINGS = pa.schema([("id", pa.int64()), ("name", pa.string())])
LISTS = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.int64()))])
DICTIONARY = pa.schema([("id", pa.int64()), ("name", pa.dictionary(pa.int32(), pa.string()))])


@dataclass(frozen=True)
class Malformed:
    """One malformed batch: the schema of the topic it is written to, the batch, the column
    at fault and the row Arrow names (None when only the batch as a whole is wrong)."""

    name: str
    schema: pa.Schema = field(repr=False)
    batch: pa.RecordBatch = field(repr=False)  # printing it may crash: it is malformed
    column: str | None
    row: int | None

    @property
    def readable_by_spark(self) -> bool:
        """Whether Spark can read the topic's schema (it has no dictionary type)."""
        return self.schema is not DICTIONARY


def _offsets(values: list[int]) -> pa.Buffer:
    return pa.py_buffer(np.array(values, dtype=np.int32).tobytes())


def _ids(n: int = 4) -> pa.Array:
    return pa.array(np.arange(100, 100 + n, dtype=np.int64))


def _strings(offsets: list[int], data: bytes) -> pa.RecordBatch:
    names = pa.Array.from_buffers(pa.string(), len(offsets) - 1,
                                  [None, _offsets(offsets), pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([_ids(len(offsets) - 1), names], schema=STRINGS)


def _longer_than_its_columns() -> pa.RecordBatch:
    """A batch that says it has 1000 rows over columns of 4, through the C data interface
    (where another library's batches come from): nothing checks it on the way in."""
    good = pa.RecordBatch.from_arrays([_ids(), pa.array(["a", "b", "c", "d"])], schema=STRINGS)
    array, schema = ffi.new("struct ArrowArray*"), ffi.new("struct ArrowSchema*")
    a, s = int(ffi.cast("uintptr_t", array)), int(ffi.cast("uintptr_t", schema))
    good._export_to_c(a, s)
    array.length = 1000
    return pa.RecordBatch._import_from_c(a, s)


def variants() -> list[Malformed]:
    """The six malformed batches, each with the topic schema it is written under."""
    dictionary = pa.DictionaryArray.from_buffers(
        pa.dictionary(pa.int32(), pa.string()), 4,
        [None, pa.py_buffer(np.array([0, 1, 7, 0], dtype=np.int32).tobytes())],
        dictionary=pa.array(["x", "y"]))
    tags = pa.Array.from_buffers(pa.list_(pa.int64()), 4, [None, _offsets([0, 1 << 20, 2, 3, 4])],
                                 children=[pa.array([1, 2, 3, 4], pa.int64())])
    return [
        # The second offset far past the 4 bytes of data: a reader copying it crashes.
        Malformed("offsets past the data", STRINGS, _strings([0, 1 << 28, 2, 3, 4], b"abcd"),
                  "name", 0),
        Malformed("invalid UTF-8", STRINGS, _strings([0, 1, 2, 3, 4], b"a\xffcd"), "name", 1),
        Malformed("decreasing offsets", STRINGS, _strings([0, 3, 1, 2, 4], b"abcd"), "name", 1),
        Malformed("dictionary index past the dictionary", DICTIONARY,
                  pa.RecordBatch.from_arrays([_ids(), dictionary], schema=DICTIONARY), "name", 2),
        Malformed("batch longer than its columns", STRINGS, _longer_than_its_columns(), None,
                  None),
        Malformed("list offsets past the values", LISTS,
                  pa.RecordBatch.from_arrays([_ids(), tags], schema=LISTS), "tags", 0),
    ]


def good_batch(schema: pa.Schema, start: int, n: int = 4) -> pa.RecordBatch:
    """A valid batch of ``schema`` whose ids run from ``start``."""
    ids = pa.array(np.arange(start, start + n, dtype=np.int64))
    if schema is LISTS:
        other = pa.array([[i] for i in range(start, start + n)], pa.list_(pa.int64()))
    else:
        other = pa.array([f"n{i}" for i in range(start, start + n)])
        if schema is DICTIONARY:
            other = other.dictionary_encode()
    return pa.RecordBatch.from_arrays([ids, other], schema=schema)


__all__ = ["DICTIONARY", "LISTS", "STRINGS", "Malformed", "good_batch", "variants"]
