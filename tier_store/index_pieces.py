"""Index pieces: a segment's chunk rows, written once to the commit log as immutable files.

A checkpoint names each segment's pieces instead of holding their rows, so its size grows
with the segments a topic retains, not with its commits (as Kafka keeps one offset index
per segment, and Delta's v2 checkpoints keep their actions in sidecar files).

Layout, in the log's store (a directory under ``_log/``, or keys under the log's prefix)::

    _index/<partition>-<seq>@<tier>/<xxh3 hex>-<rows>.idx

A piece is an Arrow IPC file of :data:`~tier_store.chunk_rows.CHUNK_DTYPE` rows (the
checkpoint's columns), then a trailer: magic, row count and the xxh3-64 of the bytes before,
which is also in its name. A name is thus its content: writers put pieces if absent, and two
checkpointers writing the same rows write the same file. A piece is checked before use (its
trailer, its name, its Arrow buffers, then its rows against what the checkpoint says of it),
and a piece that fails is :class:`~tier_store.errors.CorruptLog` naming its file.

Once a segment is sealed and all its rows are in pieces, one more immutable file lists them
(``<xxh3 hex>-<rows>.lst``: the pieces' references as JSON, then the same trailer). The
checkpoint then names that list alone, with the sums of its pieces' figures: a checkpoint
grows by one reference per retained segment, not by one per piece, and a new reader reads
a segment's list only when it reads that segment (Kafka's offset index per segment).

A segment's pieces die with it: once its file is reclaimed and a checkpoint newer than the
entry that dropped it is the log's newest (see :func:`collectable`), its directory goes.
"""

from __future__ import annotations

import json
import re
import struct
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import xxhash

from .errors import CorruptLog

if TYPE_CHECKING:
    from .logstore import LogStore

#: Rows per piece of a segment still being written; a sealed segment's last piece may be
#: shorter. A checkpoint holds at most this many rows per segment being written.
PIECE_ROWS = 4096
#: Bytes of decoded pieces a process keeps for reuse.
CACHE_BYTES = 64 << 20
INDEX_DIR = "_index"

_TRAILER = struct.Struct("<8sQQ")  # magic, rows, xxh3-64 of the bytes before
_MAGIC = b"PAFKAIX1"
_LIST_MAGIC = b"PAFKALS1"
_NAME = re.compile(r"[0-9a-f]{16}-[1-9][0-9]{0,9}\.(idx|lst)")


class PiecesGone(CorruptLog):
    """A piece the state names is not in the log (its segment was dropped and collected
    since this state was read): the caller reads a newer checkpoint."""


class PieceRef(NamedTuple):
    """A piece as a checkpoint names it: its file, its rows, the offsets and commit times
    they span, and the bytes their chunks take in the segment (each aligned) with the
    alignment padding of the last: a segment's size without reading its rows."""

    name: str
    rows: int
    base: int  # first offset
    end: int  # after the last record
    ts_min: int
    ts_max: int
    span: int  # bytes of its chunks, each aligned
    pad: int  # the alignment padding after its last chunk

    @property
    def listed(self) -> bool:
        """Whether this names a list of a sealed segment's pieces (its figures are their
        sums) rather than one piece."""
        return self.name.endswith(".lst")

    def to_json(self) -> list[Any]:
        return list(self)

    @classmethod
    def from_json(cls, v: Any, where: str) -> PieceRef:
        """A piece named in checkpoint ``where``; ``ValueError`` if ``v`` is not one."""
        if not (isinstance(v, list) and len(v) == 8 and isinstance(v[0], str)
                and _NAME.fullmatch(v[0])
                and all(isinstance(x, int) and not isinstance(x, bool) for x in v[1:])):
            raise ValueError(f"an index piece is {v!r}, not [name, rows, base, end, ts_min, "
                             "ts_max, span, pad]")
        ref = cls(*v)
        if int(ref.name.split("-")[1][:-4]) != ref.rows or not 0 <= ref.base < ref.end \
                or ref.ts_min > ref.ts_max or ref.end - ref.base < ref.rows \
                or ref.span < ref.rows or not 0 <= ref.pad < ref.span:
            raise ValueError(f"index piece {v!r} does not add up")
        return ref


def piece_dir(partition: int, seq: int, tier: int) -> str:
    """The directory (key prefix) of segment ``partition-seq`` on ``tier``'s pieces."""
    return f"{INDEX_DIR}/{partition}-{seq}@{tier}"


def parse_piece_dir(name: str) -> tuple[int, int, int] | None:
    """``"3-17@2"`` -> (3, 17, 2); None for any other name."""
    m = re.fullmatch(r"(0|[1-9][0-9]{0,17})-(0|[1-9][0-9]{0,17})@([1-9][0-9]{0,2})", name)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _digest(body: memoryview | bytes, rows: int, magic: bytes = _MAGIC) -> int:
    h = xxhash.xxh3_64(body)
    h.update(magic + rows.to_bytes(8, "little"))
    return h.intdigest()


def _signed_body(view: memoryview, ref: PieceRef, where: str, magic: bytes,
                 what: str) -> memoryview:
    """The bytes before a piece's or list's trailer, once the trailer (``magic``, ``ref``'s
    rows, the xxh3 in its name) matches them; :class:`CorruptLog` naming ``where``."""
    if len(view) < _TRAILER.size:
        raise CorruptLog(f"{what} {where} is damaged: {len(view)} bytes, too short")
    found, rows, digest = _TRAILER.unpack(view[len(view) - _TRAILER.size:])
    body = view[:len(view) - _TRAILER.size]
    if found != magic or rows != ref.rows or f"{digest:016x}" != ref.name[:16] \
            or _digest(body, rows, magic) != digest:
        raise CorruptLog(f"{what} {where} is damaged: its bytes do not match its name")
    return body


def encode_list(refs: list[PieceRef]) -> tuple[PieceRef, bytes]:
    """A sealed segment's pieces ``refs`` (in offset order) as a stored list: the reference
    a checkpoint names in their place (their figures summed), and its bytes."""
    body = json.dumps([r.to_json() for r in refs], separators=(",", ":")).encode()
    rows = sum(r.rows for r in refs)
    digest = _digest(body, rows, _LIST_MAGIC)
    ref = PieceRef(f"{digest:016x}-{rows}.lst", rows, refs[0].base, refs[-1].end,
                   min(r.ts_min for r in refs), max(r.ts_max for r in refs),
                   sum(r.span for r in refs), refs[-1].pad)
    return ref, body + _TRAILER.pack(_LIST_MAGIC, rows, digest)


def checked_list(data: bytes | pa.Buffer, ref: PieceRef, where: str) -> list[PieceRef]:
    """The pieces list ``ref`` names, once its bytes match its name and its pieces add up
    to what ``ref`` says of them (in order, within its offsets); :class:`CorruptLog`
    naming ``where`` otherwise."""
    body = _signed_body(memoryview(data), ref, where, _LIST_MAGIC, "index list")
    try:
        raw = json.loads(bytes(body))
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"it holds {type(raw).__name__}, not a list of pieces")
        refs = [PieceRef.from_json(r, where) for r in raw]
        if any(r.listed for r in refs):
            raise ValueError("it names a list, not a piece")
        if any(b.base < a.end for a, b in zip(refs, refs[1:], strict=False)):
            raise ValueError("its pieces are out of offset order")
        again, _ = encode_list(refs)
        if again != ref:
            raise ValueError(f"its pieces add up to {again}, not {ref}")
    except (ValueError, RecursionError) as e:
        raise CorruptLog(f"index list {where} is malformed: {e}") from None
    return refs


def encode_piece(table: pa.Table) -> tuple[str, bytes]:
    """Rows ``table`` as a stored piece: (its name, its bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        for b in table.to_batches():
            w.write_batch(b)
    body = sink.getvalue()
    digest = _digest(memoryview(body), table.num_rows)
    return (f"{digest:016x}-{table.num_rows}.idx",
            body.to_pybytes() + _TRAILER.pack(_MAGIC, table.num_rows, digest))


def checked_piece(data: bytes | pa.Buffer, ref: PieceRef, where: str) -> pa.Table:
    """The rows table of piece ``ref`` once its bytes match its name; :class:`CorruptLog`
    naming ``where`` otherwise."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    body = _signed_body(memoryview(buf), ref, where, _MAGIC, "index piece")
    try:
        table = pa.ipc.open_file(buf.slice(0, len(body))).read_all()
        table.validate(full=True)
    except (pa.ArrowException, OSError, ValueError, KeyError) as e:
        raise CorruptLog(f"index piece {where} is unreadable: {e!r}") from None
    return table


class IndexPieces:
    """Where one topic's pieces are read from and written to (its log's store, set once
    the log is read), with a process-wide cache of decoded pieces."""

    _cache: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
    _cached_bytes = 0
    _cache_lock = threading.Lock()
    loaded = 0  # pieces read from the store, in this process: tests count them

    def __init__(self) -> None:
        self.store: LogStore | None = None

    def where(self, folder: str, name: str) -> str:
        return f"{self.store.location if self.store else '?'}/{folder}/{name}"

    def put(self, folder: str, table: pa.Table) -> str:
        """Store rows ``table`` as a piece in ``folder``; returns its name."""
        assert self.store is not None, "no log to write index pieces to"
        name, data = encode_piece(table)
        self.store.put_piece(folder, name, data)
        return name

    def put_list(self, folder: str, refs: list[PieceRef]) -> PieceRef:
        """Store the list of a sealed segment's pieces ``refs`` in ``folder``; returns the
        reference a checkpoint names instead of them."""
        assert self.store is not None, "no log to write index pieces to"
        ref, data = encode_list(refs)
        self.store.put_piece(folder, ref.name, data)
        return ref

    def load_list(self, folder: str, ref: PieceRef) -> list[PieceRef]:
        """The pieces list ``ref`` names, checked (see :func:`checked_list`)."""
        where = self.where(folder, ref.name)
        data = self.store.read_piece(folder, ref.name) if self.store is not None else None
        if data is None:
            raise PiecesGone(f"index list {where} is missing")
        IndexPieces.loaded += 1
        return checked_list(data, ref, where)

    def load(self, folder: str, ref: PieceRef, decode: Any) -> np.ndarray:
        """Piece ``ref``'s rows, decoded by ``decode(table, where)`` (which checks them)."""
        where = self.where(folder, ref.name)
        key = (where, ref.name)
        with IndexPieces._cache_lock:
            rows = IndexPieces._cache.get(key)
            if rows is not None:
                IndexPieces._cache.move_to_end(key)
                return rows
        if self.store is None:
            raise PiecesGone(f"index piece {where} cannot be read: this state has no log")
        data = self.store.read_piece(folder, ref.name)
        if data is None:
            raise PiecesGone(f"index piece {where} is missing")
        IndexPieces.loaded += 1
        rows = decode(checked_piece(data, ref, where), where)
        self.keep(key, rows)
        return rows

    def keep(self, key: tuple[str, str], rows: np.ndarray) -> None:
        with IndexPieces._cache_lock:
            if key in IndexPieces._cache:
                return
            IndexPieces._cache[key] = rows
            IndexPieces._cached_bytes += rows.nbytes
            while IndexPieces._cached_bytes > CACHE_BYTES and len(IndexPieces._cache) > 1:
                _, old = IndexPieces._cache.popitem(last=False)
                IndexPieces._cached_bytes -= old.nbytes


__all__ = ["CACHE_BYTES", "INDEX_DIR", "PIECE_ROWS", "IndexPieces", "PieceRef", "PiecesGone",
           "checked_list", "checked_piece", "encode_list", "encode_piece", "parse_piece_dir",
           "piece_dir"]
