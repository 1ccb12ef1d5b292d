"""A checkpoint in three steps, so that a commit never waits for one to be written.

1. Under the handle's lock, :class:`PendingCheckpoint` takes what the checkpoint needs of the
   state: each partition's cut planned (:meth:`~tier_store.chunk_index.ChunkIndex.plan_cut`,
   views of rows that never change in place), the segments as JSON, the metadata.
2. Outside it, :meth:`~PendingCheckpoint.write_pieces` writes the index pieces and lists,
   and :meth:`~PendingCheckpoint.parts` makes the checkpoint's rows and metadata.
3. Under the lock again, briefly, :meth:`~PendingCheckpoint.install` lets the pieces
   replace the rows they hold in the index. A segment changed meanwhile keeps its rows; the
   next checkpoint writes the same pieces again (a piece's name is its content).

At a segment roll, every partition's sealed segment goes to pieces at once: 8 partitions'
took over 200 ms on the committing thread when this was one step under the lock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from .chunk_index import CHUNK_DTYPE, ChunkIndex, in_order
from .chunk_rows import Cut, write_cut
from .index_pieces import PieceRef


class PendingCheckpoint:
    """A checkpoint of one version of a topic's state, begun under its handle's lock."""

    def __init__(self, version: int, indexes: list[ChunkIndex], live: list[set[int]],
                 segments: list[tuple[int, int, dict[str, Any]]], meta: str,
                 put: Callable[[str, pa.Table], str] | None):
        """``indexes``: the partitions' chunk indexes; ``live``: per partition, the segments
        still written; ``segments``: (partition, seq, JSON) in the state's order; ``meta``:
        the rest of the metadata, as JSON; ``put(folder, table)`` stores a piece and names
        it (None: cut nothing)."""
        self.version, self.indexes, self.meta, self.put = version, indexes, meta, put
        self.cuts: list[list[Cut]] = [[] for _ in indexes] if put is None else [
            ix.plan_cut(lambda seq, alive=alive: seq not in alive)
            for ix, alive in zip(indexes, live, strict=True)]
        by_seg = {(p, c.seg.seq): c for p, cuts in enumerate(self.cuts) for c in cuts}
        self.segments: list[tuple[dict[str, Any], Cut | None, list[PieceRef]]] = [
            (d, by_seg.get((p, seq)), [] if (p, seq) in by_seg else indexes[p].pieces_of(seq))
            for p, seq, d in segments]
        self.loose = [ix.loose_parts(cuts) for ix, cuts in zip(indexes, self.cuts, strict=True)]

    def write_pieces(self) -> None:
        """Store the planned pieces and lists."""
        if self.put is not None:
            for ix, cuts in zip(self.indexes, self.cuts, strict=True):
                write_cut(ix.source, cuts, self.put)

    def parts(self) -> tuple[np.ndarray, bytes]:
        """The checkpoint's loose rows (a copy) and its metadata's JSON (see
        :func:`tier_store.state.checkpoint_table`)."""
        segments = []
        for d, cut, pieces in self.segments:
            d = dict(d, pieces=[r.to_json() for r in (cut.pieces_of() if cut else pieces)])
            segments.append(d)
        loose = [in_order(parts) for parts in self.loose]
        meta = {**json.loads(self.meta), "segments": segments,
                "chunk_counts": [len(x) for x in loose]}
        rows = np.concatenate(loose) if loose else np.empty(0, CHUNK_DTYPE)  # a copy
        return rows, json.dumps(meta).encode()

    def install(self) -> None:
        """Under the lock: the index drops the rows its new pieces hold."""
        for ix, cuts in zip(self.indexes, self.cuts, strict=True):
            ix.install_cut(cuts)


__all__ = ["PendingCheckpoint"]
