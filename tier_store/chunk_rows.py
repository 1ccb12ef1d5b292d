"""The chunk row: how a committed chunk is held in an index (a numpy record), in a
checkpoint and in an index piece (an Arrow table of the same columns), and the checks every
row passes before it is used to read a file.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .entries import ChunkRecord
from .ids import bundle_halves
from .state_checks import check_chunk_rows, row_problems

NO_TIME = np.iinfo(np.int64).min
CHUNK_DTYPE = np.dtype([
    ("seq", "<i8"), ("pos", "<i8"), ("length", "<i8"), ("base", "<i8"), ("records", "<i8"),
    ("checksum", "<u8"), ("ts", "<i8"), ("tmin", "<i8"), ("tmax", "<i8"),
    # The shared object holding the chunk (ids.bundle_halves; 0, 0 and opos -1: none).
    ("obj_hi", "<u8"), ("obj_lo", "<u8"), ("opos", "<i8"),
])
# Columns a checkpoint may lack (written before stores were shared): their value for none.
_OPTIONAL_COLUMNS = {"obj_hi": 0, "obj_lo": 0, "opos": -1}
# Checkpoint column names of the fields named otherwise in Python (the on-disk format).
COLUMNS = {"length": "len", "records": "n", "checksum": "crc"}
COLUMN_TYPES = {COLUMNS.get(n, n): pa.from_numpy_dtype(CHUNK_DTYPE[n])
                 for n in CHUNK_DTYPE.names if n not in _OPTIONAL_COLUMNS}


def chunk_row(c: ChunkRecord, ts: int) -> tuple[int, ...]:
    """A chunk as a row of :data:`CHUNK_DTYPE`."""
    hi, lo = bundle_halves(c.obj) if c.obj is not None else (0, 0)
    return (c.seq, c.pos, c.length, c.base, c.records, c.checksum, ts,
            NO_TIME if c.tmin is None else c.tmin, NO_TIME if c.tmax is None else c.tmax,
            hi, lo, -1 if c.opos is None else c.opos)


class InlineRows:
    """A checkpoint's inline rows, converted and checked once for every partition."""

    def __init__(self, table: pa.Table, where: str):
        self.table, self.where = table, where
        self._rows: np.ndarray | None = None
        self._bad: np.ndarray | None = None
        self._flag = np.empty(0, bool)

    def rows(self, start: int, n: int) -> tuple[np.ndarray, bool]:
        """Rows ``[start, start + n)`` (one partition's), checked (once for every row), and
        whether they are all of one segment."""
        if self._rows is None or self._bad is None:
            rows = self._rows = table_rows(self.table, self.where, check=False)
            self._bad = row_problems(rows)  # per row: out of place
            # ... or out of order with the next row, or of another segment than it.
            self._flag = self._bad.copy()
            self._flag[:-1] |= (rows["base"][1:] < rows["base"][:-1] + rows["records"][:-1]) \
                | (rows["seq"][1:] != rows["seq"][:-1])
        part = self._rows[start:start + n]
        if n and (self._bad[start + n - 1] or self._flag[start:start + n - 1].any()):
            check_chunk_rows(part, self.where)  # raises, naming the row, if out of place
            return part, False  # rows of several segments (interleaved by two writers)
        return part, True


def table_rows(part: pa.Table, where: str, check: bool = True) -> np.ndarray:
    """The chunk rows of Arrow table ``part`` (a checkpoint's or a piece's), checked (one
    partition's or segment's rows; ``check=False``: the caller checks each)."""
    n = part.num_rows
    rows = np.empty(n, CHUNK_DTYPE)
    for name in CHUNK_DTYPE.names:
        col = COLUMNS.get(name, name)
        if name in _OPTIONAL_COLUMNS and col not in part.column_names:
            rows[name] = _OPTIONAL_COLUMNS[name]
        else:
            rows[name] = part.column(col).to_numpy()
    if check:
        check_chunk_rows(rows, where)  # before use: the rows index files
    return rows


def rows_table(rows: np.ndarray) -> pa.Table:
    """Chunk ``rows`` as the Arrow table checkpoints and pieces store."""
    return pa.table({COLUMNS.get(n, n): pa.array(rows[n]) for n in CHUNK_DTYPE.names})


__all__ = ["CHUNK_DTYPE", "COLUMNS", "COLUMN_TYPES", "NO_TIME", "InlineRows", "chunk_row",
           "rows_table", "table_rows"]
