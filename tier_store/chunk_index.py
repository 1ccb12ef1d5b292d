"""One partition's committed chunks as a growable numpy table: the rows read plans and
lookups search, and the columns a checkpoint holds."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from .entries import ChunkRecord
from .ids import bundle_halves
from .state_checks import check_chunk_rows

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


def _row(c: ChunkRecord, ts: int) -> tuple[int, ...]:
    """A chunk as a row of :data:`CHUNK_DTYPE`."""
    hi, lo = bundle_halves(c.obj) if c.obj is not None else (0, 0)
    return (c.seq, c.pos, c.length, c.base, c.records, c.checksum, ts,
            NO_TIME if c.tmin is None else c.tmin, NO_TIME if c.tmax is None else c.tmax,
            hi, lo, -1 if c.opos is None else c.opos)


class ChunkIndex:
    """One partition's committed chunks in offset order, as a growable numpy table.

    An index read from a checkpoint stays in the checkpoint's memory-mapped Arrow table until
    first used, so that opening a topic costs the same whatever its history: who only asks
    for offsets never pays for the chunks. Chunks committed after the checkpoint go to the
    growable table meanwhile (the tail), and both are joined on first use of every row: a
    handle that replays entries and commits never loads the checkpoint's rows.
    """

    loads = 0  # checkpoint parts materialized, in this process: tests count them

    def __init__(self, rows: np.ndarray | None = None,
                 lazy: tuple[pa.Table, int, int, str] | None = None):
        self._lazy = lazy
        self._a = rows.copy() if rows is not None else np.empty(16, CHUNK_DTYPE)
        self._lo = 0
        self._hi = len(rows) if rows is not None else 0

    def _materialize(self, lo: int, hi: int, extra: int = 0) -> np.ndarray:
        """Rows ``[lo, hi)`` of the checkpoint part, checked, in a table with room for
        ``extra`` more."""
        table, start, _, where = self._lazy  # type: ignore[misc]
        n = hi - lo
        rows = np.empty(max(16, n + extra), CHUNK_DTYPE)
        part = table.slice(start + lo, n)
        for name in CHUNK_DTYPE.names:
            col = COLUMNS.get(name, name)
            if name in _OPTIONAL_COLUMNS and col not in part.column_names:
                rows[name][:n] = _OPTIONAL_COLUMNS[name]
            else:
                rows[name][:n] = part.column(col).to_numpy()
        check_chunk_rows(rows[:n], where)  # before use: the rows index files
        return rows

    def _load(self) -> None:
        n = self._lazy[2]  # type: ignore[index]
        tail = self._tail()
        rows = self._materialize(0, n, len(tail))
        rows[n:n + len(tail)] = tail
        ChunkIndex.loads += 1
        self._lazy = None
        self._a, self._lo, self._hi = rows, 0, n + len(tail)

    def __len__(self) -> int:
        return (self._lazy[2] if self._lazy is not None else 0) + self._hi - self._lo

    def rows(self) -> np.ndarray:
        """The committed chunks, in offset order (a view: do not modify)."""
        if self._lazy is not None:
            self._load()
        return self._a[self._lo:self._hi]

    def _tail(self) -> np.ndarray:
        return self._a[self._lo:self._hi]


    def append(self, c: ChunkRecord, ts: int) -> None:
        """Add chunk ``c``, committed at ``ts`` (after every chunk already here)."""
        if self._hi == len(self._a):
            live = self._tail()
            grown = np.empty(max(16, 2 * len(live)), CHUNK_DTYPE)
            grown[: len(live)] = live
            self._a, self._lo, self._hi = grown, 0, len(live)
        self._a[self._hi] = _row(c, ts)
        self._hi += 1

    def drop_segments(self, seqs: set[int]) -> None:
        """Remove the chunks of segments ``seqs`` (deleted by retention)."""
        rows = self.rows()
        keep = ~np.isin(rows["seq"], list(seqs))
        if keep.all():
            return
        kept = rows[keep]
        self._a = kept.copy() if len(kept) else np.empty(16, CHUNK_DTYPE)
        self._lo, self._hi = 0, len(kept)

    def replace_segments(self, seqs: set[int], new: list[ChunkRecord], ts_of: np.ndarray) -> None:
        """Swap the chunks of ``seqs`` for ``new`` (same offsets, new positions)."""
        rows = self.rows()
        mask = np.isin(rows["seq"], list(seqs))
        old = rows[mask]
        repl = np.empty(len(new), CHUNK_DTYPE)
        for i, c in enumerate(new):
            repl[i] = _row(c, 0)
        # Timestamps travel with the offsets they belong to.
        order = np.searchsorted(old["base"], repl["base"])
        repl["ts"] = old["ts"][np.clip(order, 0, max(0, len(old) - 1))] if len(old) else ts_of
        merged = np.concatenate([rows[~mask], repl])
        merged.sort(order="base", kind="stable")
        self._a, self._lo, self._hi = merged, 0, len(merged)

    def committed_since(self, ts: int) -> np.ndarray:
        """Rows committed at or after ``ts`` (rows are in commit order, ``ts`` monotonic).
        Of a checkpoint part not loaded yet, only those rows are read (every commit asks)."""
        if self._lazy is None:
            rows = self.rows()
            return rows[int(np.searchsorted(rows["ts"], ts, side="left")):]
        table, start, n, _ = self._lazy
        times = table.column("ts").slice(start, n).to_numpy()
        first = int(np.searchsorted(times, ts, side="left"))
        tail = self._tail()
        tail = tail[int(np.searchsorted(tail["ts"], ts, side="left")):]
        if first == n:
            return tail
        return np.concatenate([self._materialize(first, n)[:n - first], tail])

    def locate(self, offset: int) -> int:
        """Index (into :meth:`rows`) of the chunk holding ``offset``."""
        return int(np.searchsorted(self.rows()["base"], offset, side="right")) - 1


__all__ = ["CHUNK_DTYPE", "COLUMNS", "COLUMN_TYPES", "NO_TIME", "ChunkIndex"]
