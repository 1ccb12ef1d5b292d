"""One partition's committed chunks: per segment, index pieces in the log and loose rows in
memory; the rows read plans and lookups search, and what a checkpoint holds.

Each segment's rows, in offset order, are its pieces (:mod:`tier_store.index_pieces`:
immutable files of the log, read when first needed) followed by its loose rows: those
committed since its last piece was cut. A checkpoint holds the loose rows and names the
pieces; :meth:`ChunkIndex.cut_pieces` moves full blocks of loose rows into new pieces (and
all of a sealed segment's), so that a checkpoint stays small however long the log. A
checkpoint plans the cut under the handle's lock, writes the pieces outside it and installs
them under it again: a commit never waits for a piece to be written.

An index read from a checkpoint keeps its loose rows in the checkpoint's Arrow table until
first used (``inline``), so opening a topic costs the same whatever its history: who only
asks for offsets never pays for the chunks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable
from itertools import accumulate

import numpy as np
import pyarrow as pa

from .chunk_rows import (
    CHUNK_DTYPE,
    COLUMN_TYPES,
    COLUMNS,
    NO_TIME,
    Cut,
    InlineRows,
    SegmentRows,
    between,
    chunk_row,
    new_rows,
    rows_table,
    table_rows,
    write_cut,
)
from .entries import ChunkRecord
from .errors import CorruptLog
from .index_pieces import PIECE_ROWS, IndexPieces, PieceRef, piece_dir

_EMPTY = np.empty(0, CHUNK_DTYPE)

def in_order(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` (each in offset order) as one table in offset order."""
    parts = [x for x in parts if len(x)]
    if not parts:
        return _EMPTY
    rows = np.concatenate(parts) if len(parts) > 1 else parts[0]
    if len(parts) > 1 and (np.diff(rows["base"]) < 0).any():
        rows = rows[np.argsort(rows["base"], kind="stable")]
    return rows


class ChunkIndex:
    """One partition's committed chunks in offset order (see the module)."""

    loads = 0  # checkpoint rows or whole indexes materialized in this process: tests count
    visits = 0  # segments looked at to find a range's: tests count

    def __init__(self, partition: int = 0, pieces: IndexPieces | None = None,
                 inline: tuple[InlineRows, int, int] | None = None,
                 segments: Iterable[SegmentRows] = ()):
        self.partition = partition
        self.source = pieces if pieces is not None else IndexPieces()
        self._inline = inline if inline is not None and inline[2] else None
        self._segs: dict[int, SegmentRows] = {s.seq: s for s in segments}
        self._all: np.ndarray | None = None  # every row, once asked for (kept up to date)
        self._all_n = 0
        # The segments holding rows, by base offset, with the running max of their ends: a
        # range's segments are found without visiting the older ones (None: to be sorted).
        self._order: list[SegmentRows] | None = None
        self._bases: list[int] = []
        self._reach: list[int] = []

    # -- reading pieces and checkpoint rows -----------------------------------------------
    def _piece(self, seg: SegmentRows, ref: PieceRef) -> np.ndarray:
        def decode(table: pa.Table, where: str) -> np.ndarray:
            rows = table_rows(table, where)
            if len(rows) != ref.rows or (rows["seq"] != seg.seq).any() or \
                    int(rows["base"][0]) != ref.base or \
                    int(rows["base"][-1] + rows["records"][-1]) != ref.end or \
                    int(rows["ts"].min()) != ref.ts_min or int(rows["ts"].max()) != ref.ts_max:
                raise CorruptLog(f"index piece {where} does not hold the rows its checkpoint "
                                 f"names (segment {self.partition}-{seg.seq}, {ref})")
            return rows
        return self.source.load(piece_dir(self.partition, seg.seq, seg.tier), ref, decode)

    def refs(self, seg: SegmentRows) -> list[PieceRef]:
        """``seg``'s pieces, in offset order: its list is read first if the checkpoint
        named only that."""
        pieces = seg.pieces
        if seg.listed is None or not pieces or pieces[0] is not seg.listed:
            return pieces
        # Kept apart, never put in ``pieces``: a reader without the handle's lock must not
        # undo what a checkpoint changes there meanwhile.
        got = seg.loaded
        if got is None:
            got = seg.loaded = self.source.load_list(
                piece_dir(self.partition, seg.seq, seg.tier), seg.listed)
        return got

    def _split(self) -> None:
        """Give the checkpoint's loose rows to their segments."""
        if self._inline is None:
            return
        held, start, n = self._inline
        rows, one = held.rows(start, n)
        where = held.where
        ChunkIndex.loads += 1
        seqs = rows["seq"]
        for seq in [int(seqs[0])] if one else np.unique(seqs).tolist():
            seg = self._segs.get(seq)
            if seg is None:  # the checkpoint's check ties rows to its segments
                raise CorruptLog(f"checkpoint {where} is malformed: partition "
                                 f"{self.partition} has chunks of segment {seq}, which it "
                                 "does not list")
            seg.prepend(rows if one else rows[seqs == seq])
        self._inline = None
        self._order = None

    def segment_rows(self, seq: int) -> np.ndarray:
        """Segment ``seq``'s rows, in offset order (empty if it has none)."""
        self._split()
        seg = self._segs.get(seq)
        if seg is None:
            return _EMPTY
        return in_order([*(self._piece(seg, r) for r in self.refs(seg)), seg.loose()])

    def __len__(self) -> int:
        n = self._inline[2] if self._inline is not None else 0
        return n + sum(len(s) for s in self._segs.values())

    def rows(self) -> np.ndarray:
        """Every committed chunk, in offset order (a view: do not modify). Reads every
        piece: for tools and checks; read plans use :meth:`overlapping`."""
        if self._all is None:
            self._split()
            segs = sorted(self._segs.values(), key=lambda s: s.base)
            rows = in_order([self.segment_rows(s.seq) for s in segs])
            ChunkIndex.loads += 1
            self._all, self._all_n = rows.copy(), len(rows)
        return self._all[:self._all_n]

    def overlapping(self, start: int, stop: int) -> np.ndarray:
        """The chunks holding any offset of ``[start, stop)``, in offset order: only the
        pieces that span those offsets are read."""
        if self._all is not None:
            return between(self.rows(), start, stop)
        if self._inline is not None:
            self._split()
        parts = []
        # A few segments are looked at directly; more, found by the ordered search.
        for seg in (self._segs.values() if len(self._segs) <= 4 else
                    self._holding(start, stop)):
            if seg.base < 0 or seg.end <= start or seg.base >= stop:
                continue
            if seg.pieces:
                parts.extend(between(self._piece(seg, r), start, stop)
                             for r in self.refs(seg) if r.end > start and r.base < stop)
            if seg._n:
                parts.append(seg.loose_between(start, stop))
        if len(parts) == 1:  # the usual case: one segment's rows, in order already
            return parts[0]
        return in_order(parts) if parts else _EMPTY

    def segments_holding(self, start: int, stop: int) -> list[int]:
        """Sequence numbers of the segments with chunks in ``[start, stop)``, by base."""
        if self._inline is not None:
            self._split()
        return [s.seq for s in self._holding(start, stop)] if start < stop else []

    def _holding(self, start: int, stop: int) -> list[SegmentRows]:
        """The segments with rows in ``[start, stop)``, by base: O(log segments + found)."""
        if self._order is None:
            self._order = sorted((s for s in self._segs.values() if s.base >= 0),
                                 key=lambda s: s.base)
            self._bases = [s.base for s in self._order]
            self._reach = list(accumulate((s.end for s in self._order), max))
        j = bisect_left(self._bases, stop)
        out = []
        while j and self._reach[j - 1] > start:
            j -= 1
            ChunkIndex.visits += 1
            if self._order[j].end > start:
                out.append(self._order[j])
        return out[::-1]

    def _grew(self, seg: SegmentRows, new: bool) -> None:
        """Keep the order after ``seg`` took a row at its end (``new``: its first)."""
        if self._order is None:
            return
        if new:  # a new segment starts at the partition's next offset: last by base
            if self._bases and seg.base <= self._bases[-1]:
                self._order = None
            else:
                self._order.append(seg)
                self._bases.append(seg.base)
                self._reach.append(max(seg.end, *self._reach[-1:]))
            return
        j = bisect_left(self._bases, seg.base)
        while j < len(self._reach) and self._reach[j] < seg.end:  # the tail, usually
            self._reach[j] = seg.end
            j += 1

    def committed_since(self, seq: int, ts: int) -> np.ndarray:
        """Segment ``seq``'s rows committed at or after ``ts``, in offset order: one segment
        whatever the partition's history (a commit asks per chunk); of its pieces only those
        committed since then are read, and of a checkpoint's rows not split yet, only those."""
        parts = []
        if self._inline is not None:
            held, start, n = self._inline
            times = held.table.column("ts").slice(start, n).to_numpy()
            first = int(np.searchsorted(times, ts, side="left"))
            if first < n:
                tail = table_rows(held.table.slice(start + first, n - first), held.where)
                parts.append(tail[tail["seq"] == seq])
        seg = self._segs.get(seq)
        if seg is not None:
            ChunkIndex.visits += 1
            if seg.pieces and seg.pieces_ts_max() >= ts:
                parts.extend(self._piece(seg, r) for r in self.refs(seg) if r.ts_max >= ts)
            parts.append(seg.loose_since(ts))
        rows = in_order(parts)
        return rows[rows["ts"] >= ts]

    # -- changes (replay) -----------------------------------------------------------------
    def append(self, c: ChunkRecord, ts: int) -> None:
        """Add chunk ``c``, committed at ``ts`` (after every chunk already here)."""
        row = chunk_row(c, ts)
        seg = self._segs.get(c.seq)
        new = seg is None or seg.base < 0
        if seg is None:
            seg = self._segs[c.seq] = SegmentRows(c.seq, c.tier)
        seg.add_row(row, c.base, c.base + c.records, ts)
        self._grew(seg, new)
        if self._all is not None:
            if self._all_n == len(self._all):
                grown = new_rows(max(16, 2 * self._all_n))
                grown[:self._all_n] = self._all[:self._all_n]
                self._all = grown
            self._all[self._all_n] = row
            self._all_n += 1

    def drop_segments(self, seqs: set[int]) -> None:
        """Remove the chunks of segments ``seqs`` (deleted by retention)."""
        self._split()
        for s in seqs:
            self._segs.pop(s, None)
        self._all = None
        self._order = None

    def replace_segments(self, seqs: set[int], new: list[ChunkRecord], seq: int, tier: int
                         ) -> None:
        """Swap the chunks of ``seqs`` for ``new`` (same offsets, new positions), segment
        ``seq`` on ``tier``. Reads the sources' pieces: timestamps travel with offsets."""
        old = in_order([self.segment_rows(s) for s in seqs])
        repl = new_rows(len(new))
        for i, c in enumerate(new):
            repl[i] = chunk_row(c, 0)
        repl.sort(order="base", kind="stable")
        if len(old):
            at = np.searchsorted(old["base"], repl["base"])
            repl["ts"] = old["ts"][np.clip(at, 0, len(old) - 1)]
            # A lake row group holds a run of chunks: it was committed with the last of them.
            ends = np.searchsorted(old["base"], repl["base"] + repl["records"])
            for i in np.flatnonzero(ends - at > 1):
                repl["ts"][i] = old["ts"][at[i]:ends[i]].max()
        for s in seqs:
            self._segs.pop(s, None)
        seg = self._segs[seq] = SegmentRows(seq, tier)
        seg.add(repl)
        self._all = None
        self._order = None

    # -- checkpoints ----------------------------------------------------------------------
    def cut_pieces(self, sealed: Callable[[int], bool], put: Callable[[str, pa.Table], str]
                   ) -> None:
        """Move loose rows into new pieces (``put(folder, table)`` stores one and names it):
        :meth:`plan_cut`, :func:`write_cut` and :meth:`install_cut` in one step."""
        cuts = self.plan_cut(sealed)
        write_cut(self.source, cuts, put)
        self.install_cut(cuts)

    def plan_cut(self, sealed: Callable[[int], bool]) -> list[Cut]:
        """What to cut into pieces: every full block of :data:`PIECE_ROWS`, and, once the
        rows left would pass a block, the rest of each segment ``sealed`` says is written no
        more. A partition's checkpoint rows thus stay under a block per segment being
        written, plus one. Under the lock; the rows are views (rows never change in place)."""
        self._split()
        # A sealed segment's rest goes to a piece only once the partition's loose rows pass
        # a block: a partition of few (large) chunks keeps them inline, read with the
        # checkpoint, rather than in many small pieces a new reader would each read.
        rests = sum(len(s.loose()) % PIECE_ROWS for s in self._segs.values())
        cuts = []
        for seg in self._segs.values():
            loose = seg.loose()
            whole = sealed(seg.seq)
            stop = len(loose) if whole and rests > PIECE_ROWS else \
                len(loose) // PIECE_ROWS * PIECE_ROWS
            # Sealed and all in pieces after: named by one list.
            listing = whole and stop == len(loose) and (stop > 0 or seg.listed is None) and \
                len(seg.pieces) + -(-stop // PIECE_ROWS) > 1
            if stop or listing:
                cuts.append(Cut(seg, piece_dir(self.partition, seg.seq, seg.tier), loose,
                                stop, PIECE_ROWS, listing))
        return cuts

    def install_cut(self, cuts: list[Cut]) -> None:
        """Let the pieces written replace the rows they hold, under the lock. A segment
        changed since the plan (dropped, replaced, cut by another checkpoint) keeps its
        rows: the next checkpoint writes the same pieces again (a name is its content)."""
        for c in cuts:
            seg = c.seg
            if c.after is None or self._segs.get(seg.seq) is not seg or seg._n < c.stop or \
                    seg.pieces is not c.pieces or seg.listed is not c.listed:
                continue
            rest = seg.loose()[c.stop:]
            seg.loaded = seg.loaded if seg.listed is c.after[1] else None
            # Pieces first: a reader without the lock may see rows twice, never none.
            seg.pieces, seg.listed = c.after
            seg.keep_loose(rest)

    def loose_parts(self, cuts: list[Cut]) -> list[np.ndarray]:
        """The loose rows past what ``cuts`` take: views, each in offset order (see
        :func:`in_order`); a checkpoint copies them outside the lock."""
        if self._inline is not None:
            return [self.loose_rows()]
        taken = {c.seg.seq: c.stop for c in cuts}
        return [s.loose()[taken.get(s.seq, 0):] for s in self._segs.values()]

    def loose_rows(self) -> np.ndarray:
        """The rows no piece holds, in offset order (what a checkpoint keeps inline)."""
        if self._inline is not None:
            held, start, n = self._inline
            appended = [s.loose() for s in self._segs.values()]
            return in_order([held.rows(start, n)[0], *appended])
        return in_order([s.loose() for s in self._segs.values()])

    def spans(self) -> tuple[dict[int, int], dict[int, int]]:
        """Per segment (by sequence), the bytes of its chunks each aligned, and packed as a
        move lays them out (each aligned but the last); no piece is read."""
        self._split()
        aligned, packed = {}, {}
        for seq, seg in self._segs.items():
            aligned[seq], packed[seq] = seg.spans()
        return aligned, packed

    def pieces_of(self, seq: int) -> list[PieceRef]:
        """What a checkpoint names of segment ``seq``'s pieces: its list, or each piece."""
        seg = self._segs.get(seq)
        if seg is None:
            return []
        return [seg.listed] if seg.listed is not None else list(seg.pieces)


__all__ = ["CHUNK_DTYPE", "COLUMNS", "COLUMN_TYPES", "NO_TIME", "ChunkIndex", "InlineRows",
           "SegmentRows", "in_order", "rows_table", "table_rows"]
