"""The chunk row: how a committed chunk is held in an index (a numpy record), in a
checkpoint and in an index piece (an Arrow table of the same columns), and the checks every
row passes before it is used to read a file. :class:`SegmentRows` holds one segment's rows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable

import numpy as np
import pyarrow as pa

from .entries import ChunkRecord
from .errors import CorruptLog
from .ids import bundle_halves
from .index_pieces import IndexPieces, PieceRef
from .segment import CHUNK_ALIGN
from .state_checks import check_chunk_rows, row_problems
from .stats import text

NO_TIME = np.iinfo(np.int64).min
CHUNK_DTYPE = np.dtype([
    ("seq", "<i8"), ("pos", "<i8"), ("length", "<i8"), ("base", "<i8"), ("records", "<i8"),
    ("checksum", "<u8"), ("ts", "<i8"), ("tmin", "<i8"), ("tmax", "<i8"),
    # The shared object holding the chunk (ids.bundle_halves; 0, 0 and opos -1: none).
    ("obj_hi", "<u8"), ("obj_lo", "<u8"), ("opos", "<i8"),
    # Column statistics (tier_store.stats) as JSON text, None without: a string, as a dict
    # per chunk held in memory would take ten times the bytes.
    ("st", object),
])
# Columns a checkpoint may lack (written before stores were shared, or before chunks had
# statistics): their value for none.
_OPTIONAL_COLUMNS = {"obj_hi": 0, "obj_lo": 0, "opos": -1, "st": None}
# Checkpoint column names of the fields named otherwise in Python (the on-disk format).
COLUMNS = {"length": "len", "records": "n", "checksum": "crc"}
COLUMN_TYPES = {COLUMNS.get(n, n): pa.from_numpy_dtype(CHUNK_DTYPE[n])
                 for n in CHUNK_DTYPE.names if n not in _OPTIONAL_COLUMNS}


def new_rows(n: int) -> np.ndarray:
    """An array of ``n`` rows to fill. Zeroed, not empty: numpy sets an empty array's object
    field one row at a time, at ten times the cost (a spike in the commit that grows one)."""
    return np.zeros(n, CHUNK_DTYPE)


def chunk_row(c: ChunkRecord, ts: int) -> tuple[int, ...]:
    """A chunk as a row of :data:`CHUNK_DTYPE`."""
    hi, lo = bundle_halves(c.obj) if c.obj is not None else (0, 0)
    return (c.seq, c.pos, c.length, c.base, c.records, c.checksum, ts,
            NO_TIME if c.tmin is None else c.tmin, NO_TIME if c.tmax is None else c.tmax,
            hi, lo, -1 if c.opos is None else c.opos, None if c.st is None else text(c.st))


class InlineRows:
    """A checkpoint's inline rows, converted and checked once for every partition."""

    def __init__(self, table: pa.Table, where: str):
        self.table, self.where = table, where
        self._rows: np.ndarray | None = None
        self._bad: np.ndarray | None = None
        self._flagged: list[int] = []  # rows flagged below, in order: found by bisection

    def rows(self, start: int, n: int) -> tuple[np.ndarray, bool]:
        """Rows ``[start, start + n)`` (one partition's), checked (once for every row), and
        whether they are all of one segment."""
        if self._rows is None or self._bad is None:
            rows = self._rows = table_rows(self.table, self.where, check=False)
            self._bad = row_problems(rows)  # per row: out of place
            # ... or out of order with the next row, or of another segment than it.
            flag = self._bad.copy()
            flag[:-1] |= (rows["base"][1:] < rows["base"][:-1] + rows["records"][:-1]) \
                | (rows["seq"][1:] != rows["seq"][:-1])
            self._flagged = np.flatnonzero(flag).tolist()
        part = self._rows[start:start + n]
        flagged = self._flagged
        i = bisect_left(flagged, start)
        # A flagged row among the first n - 1 (out of place, or unlike the next), or a last
        # row out of place.
        if n and ((i < len(flagged) and flagged[i] < start + n - 1)
                  or self._bad[start + n - 1]):
            check_chunk_rows(part, self.where)  # raises, naming the row, if out of place
            return part, False  # rows of several segments (interleaved by two writers)
        return part, True


def table_rows(part: pa.Table, where: str, check: bool = True) -> np.ndarray:
    """The chunk rows of Arrow table ``part`` (a checkpoint's or a piece's), checked (one
    partition's or segment's rows; ``check=False``: the caller checks each)."""
    n = part.num_rows
    rows = new_rows(n)
    for name in CHUNK_DTYPE.names:
        col = COLUMNS.get(name, name)
        if name in _OPTIONAL_COLUMNS and col not in part.column_names:
            rows[name] = _OPTIONAL_COLUMNS[name]
        elif name == "st":
            column = part.column(col)
            if not (pa.types.is_string(column.type) or pa.types.is_null(column.type)):
                raise CorruptLog(f"checkpoint {where} is malformed: its chunk statistics are "
                                 f"of type {column.type}, not strings")
            rows[name] = column.to_numpy(zero_copy_only=False)
        else:
            rows[name] = part.column(col).to_numpy()
    if check:
        check_chunk_rows(rows, where)  # before use: the rows index files
    return rows


def rows_table(rows: np.ndarray) -> pa.Table:
    """Chunk ``rows`` as the Arrow table checkpoints and pieces store."""
    cols = {COLUMNS.get(n, n): pa.array(rows[n]) for n in CHUNK_DTYPE.names if n != "st"}
    st = rows["st"]
    cols["st"] = pa.array([text(v) for v in st.tolist()] if len(st) else [], pa.string())
    return pa.table(cols)


__all__ = ["CHUNK_DTYPE", "COLUMNS", "COLUMN_TYPES", "NO_TIME", "Cut", "InlineRows", "chunk_row",
           "new_rows", "rows_table", "table_rows", "write_cut"]


def between(rows: np.ndarray, start: int, stop: int) -> np.ndarray:
    """The rows (in offset order) holding any offset of ``[start, stop)``: a slice, found
    by two binary searches (a driver asks once per partition per batch)."""
    base = rows["base"]
    i = int(base.searchsorted(start, side="right")) - 1
    i = 0 if i < 0 else i
    j = int(base.searchsorted(stop, side="left"))
    # Concurrent writers interleave segments: the row before ``start`` may end before it.
    if i < j and int(base[i]) + int(rows["records"][i]) <= start:
        i += 1
    return rows[i:j]


def padding(rows: np.ndarray) -> np.ndarray:
    """Per row, the bytes after its chunk up to the next aligned position."""
    lengths = rows["length"]
    return (lengths + CHUNK_ALIGN - 1) // CHUNK_ALIGN * CHUNK_ALIGN - lengths


_NO_ROWS = np.empty(0, CHUNK_DTYPE)
_NO_ROWS.flags.writeable = False


class SegmentRows:
    """One segment's rows: its pieces, then its loose rows (a growable table). A sealed
    segment's pieces may stand as one list reference (``listed``) until the index reads
    the list (:meth:`~tier_store.chunk_index.ChunkIndex.refs`)."""

    piece_scans = 0  # looks over every piece's commit time (tests count them)

    def __init__(self, seq: int, tier: int, pieces: Iterable[PieceRef] = ()):
        self.seq, self.tier = seq, tier
        self.pieces = list(pieces)
        self.listed = self.pieces[0] if len(self.pieces) == 1 and self.pieces[0].listed \
            else None
        self.loaded: list[PieceRef] | None = None  # the listed pieces, once read
        # Shared while empty (an empty structured array costs ~9k instructions to make, per
        # partition at every open): the first row added grows a new one.
        self._a, self._n = _NO_ROWS, 0
        # The loose rows' bases as Python ints: a stream's next batch is found among them by
        # bisection, without numpy's per-call cost (a driver asks once per partition).
        self._bases: list[int] = []
        # Per loose row, the latest commit time up to it (clocks may step back): the rows
        # committed since a time are found by bisection, not by a scan (a commit asks).
        # None until a commit first asks: a reader's handle never does.
        self._ts_top: list[int] | None = None
        self.base = min((r.base for r in self.pieces), default=-1)  # -1: no rows yet
        self.end = max((r.end for r in self.pieces), default=-1)
        self._pieces_ts: tuple[list[PieceRef] | None, int, int] = (None, -1, -1)

    def pieces_ts_max(self) -> int:
        """The latest commit time in the pieces (-1: none). Pieces are only added or the
        list replaced, so it is kept until they change: a commit asks once per chunk, and an
        active segment gains a piece per checkpoint."""
        held, n, ts = self._pieces_ts
        if held is not self.pieces or n != len(self.pieces):
            SegmentRows.piece_scans += 1
            ts = max((r.ts_max for r in self.pieces), default=-1)
            self._pieces_ts = (self.pieces, len(self.pieces), ts)
        return ts

    def loose(self) -> np.ndarray:
        return self._a[:self._n]

    def __len__(self) -> int:
        return sum(r.rows for r in self.pieces) + self._n

    def add(self, rows: np.ndarray) -> None:
        """Append ``rows`` (after every row here) to the loose rows."""
        if not len(rows):
            return
        if self._n + len(rows) > len(self._a):
            grown = new_rows(max(16, 2 * (self._n + len(rows))))
            grown[:self._n] = self.loose()
            self._a = grown
        self._a[self._n:self._n + len(rows)] = rows
        self._n += len(rows)
        self._bases += rows["base"].tolist()
        self._grow_top(rows["ts"])
        self._span(rows)

    def _grow_top(self, ts: np.ndarray) -> None:
        if len(ts) and self._ts_top is not None:
            top = np.maximum.accumulate(ts)
            if self._ts_top:
                np.maximum(top, self._ts_top[-1], out=top)
            self._ts_top += top.tolist()

    def _span(self, rows: np.ndarray) -> None:
        if len(rows):
            first = int(rows["base"][0])
            self.base = first if self.base < 0 else min(self.base, first)
            self.end = max(self.end, int(rows["base"][-1] + rows["records"][-1]))

    def add_row(self, row: tuple[int, ...], base: int, end: int, ts: int) -> None:
        """Append one row (``base``, ``end``: its offsets; ``ts``: its commit time) after
        every row here."""
        if self._n == len(self._a):
            grown = new_rows(max(16, 2 * self._n))
            grown[:self._n] = self.loose()
            self._a = grown
        self._a[self._n] = row
        self._n += 1
        self._bases.append(base)
        top = self._ts_top
        if top is not None:
            top.append(ts if not top or ts > top[-1] else top[-1])
        self.base = base if self.base < 0 else min(self.base, base)
        self.end = max(self.end, end)

    def prepend(self, rows: np.ndarray) -> None:
        """Put ``rows`` (the checkpoint's, older than any appended) before the loose rows."""
        if not self._n:  # held as they are (a view): the next row added grows a new array
            self._a, self._n = rows, len(rows)
            self._bases, self._ts_top = rows["base"].tolist(), None
            self._span(rows)
            return
        tail = self.loose().copy()
        self._a, self._n, self._bases, self._ts_top = _NO_ROWS, 0, [], None
        self.add(rows)
        self.add(tail)

    def keep_loose(self, rows: np.ndarray) -> None:
        self._a, self._n = rows.copy(), len(rows)
        self._bases, self._ts_top = rows["base"].tolist(), None

    def loose_since(self, ts: int) -> np.ndarray:
        """The loose rows committed at or after ``ts``, in offset order."""
        if self._ts_top is None:
            self._ts_top = []
            self._grow_top(self.loose()["ts"])
        tail = self._a[bisect_left(self._ts_top, ts):self._n]
        return tail[tail["ts"] >= ts]

    def loose_between(self, start: int, stop: int) -> np.ndarray:
        """The loose rows holding any offset of ``[start, stop)`` (see :func:`_between`)."""
        bases = self._bases
        i = max(0, bisect_right(bases, start) - 1)
        j = bisect_left(bases, stop, i)
        if i < j and bases[i] + int(self._a[i]["records"]) <= start:
            i += 1
        return self._a[i:j]

    def spans(self) -> tuple[int, int]:
        """(bytes of its chunks, each aligned; the same packed as a move lays them out:
        each aligned but the last), from the pieces' figures and the loose rows."""
        loose = self.loose()
        span = sum(r.span for r in self.pieces)
        if len(loose):
            pad = padding(loose)
            span += int(loose["length"].sum() + pad.sum())
            return span, span - int(pad[-1])
        return span, span - (self.pieces[-1].pad if self.pieces else 0)


class Cut:
    """One segment's part in a checkpoint's cut (see :meth:`ChunkIndex.plan_cut`): its
    rows up to ``stop`` go to pieces of ``block`` rows; ``listing``: its pieces are then
    named by a list."""

    __slots__ = ("seg", "folder", "rows", "stop", "block", "listing", "pieces", "listed",
                 "after")

    def __init__(self, seg: SegmentRows, folder: str, rows: np.ndarray, stop: int,
                 block: int, listing: bool):
        self.seg, self.folder, self.rows, self.stop, self.block, self.listing = \
            seg, folder, rows, stop, block, listing
        self.pieces, self.listed = seg.pieces, seg.listed  # as planned: install checks
        self.after: tuple[list[PieceRef], PieceRef | None] | None = None

    def pieces_of(self) -> list[PieceRef]:
        """What a checkpoint names of the segment once cut."""
        pieces, listed = self.after if self.after is not None else (self.pieces, self.listed)
        return [listed] if listed is not None else list(pieces)


def write_cut(source: IndexPieces, cuts: list[Cut], put: Callable[[str, pa.Table], str]
              ) -> None:
    """Store the pieces (and lists) ``cuts`` plan (``put(folder, table)`` stores a piece and
    names it; ``source`` keeps its rows for reuse). It reads no state, so a checkpoint runs
    it outside the handle's lock."""
    for c in cuts:
        refs = []
        for at in range(0, c.stop, c.block):
            block = c.rows[at:min(c.stop, at + c.block)].copy()
            name = put(c.folder, rows_table(block))
            pad = padding(block)
            refs.append(PieceRef(name, len(block), int(block["base"][0]),
                                 int(block["base"][-1] + block["records"][-1]),
                                 int(block["ts"].min()), int(block["ts"].max()),
                                 int(block["length"].sum() + pad.sum()), int(pad[-1])))
            source.keep((source.where(c.folder, name), name), block)
        listed = c.listed
        if listed is not None and refs:  # rows came after its list: named one by one
            before = c.seg.loaded or source.load_list(c.folder, listed)
            pieces, listed = [*before, *refs], None
        else:
            pieces = [*c.pieces, *refs]
        if c.listing and listed is None and len(pieces) > 1:
            listed = source.put_list(c.folder, pieces)
        c.after = (pieces, listed)
