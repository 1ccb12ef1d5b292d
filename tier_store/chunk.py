"""Chunks: the records of one append to one partition, as one self-contained Arrow IPC stream.

A chunk holds the schema, its record batches and the end-of-stream marker, so it can be read
zero-copy from a memory map knowing only its byte range. The batches of one append are written
as one record batch (gathered from their buffers without a copy where it can be), so readers
get big batches whatever size the writer's were; readers take any number. Its checksum is
xxh3-64 over those bytes, computed when it is written.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from .errors import CorruptSegment


def checksum(buf: pa.Buffer | memoryview | bytes) -> int:
    """xxh3-64 of a chunk's bytes (zero-copy over Arrow buffers and mappings)."""
    return xxhash.xxh3_64_intdigest(memoryview(buf))


def _options(compression: str) -> pa.ipc.IpcWriteOptions:
    return pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)


@dataclass
class EncodedChunk:
    """A chunk ready to be placed: its batches, their IPC size, and how to write them."""

    batches: list[pa.RecordBatch]
    schema: pa.Schema
    size: int
    records: int
    compression: str
    _buffer: pa.Buffer | None = None
    _pieces: list[pa.Buffer | bytes | memoryview] | None = None

    @classmethod
    def of(cls, batches: list[pa.RecordBatch], schema: pa.Schema, compression: str
           ) -> EncodedChunk:
        """The chunk of ``batches``, encoded as one record batch so that readers get a few
        big batches whatever size the writer's were."""
        records = sum(b.num_rows for b in batches)
        if len(batches) > 1:
            try:
                if compression == "none":
                    gathered = _gather(batches, schema)
                    if gathered is not None:
                        return cls(batches, schema, sum(len(p) for p in gathered), records,
                                   compression, _pieces=gathered)
                else:  # the codec reads every byte anyway: join them for real
                    batches = pa.Table.from_batches(batches, schema).combine_chunks(
                        ).to_batches()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # e.g. a column past 2 GiB of 32-bit offsets: the batches as they are
        if compression != "none":
            # Compressing twice (size, then write) would double the cost: encode once.
            buf = _encode(batches, schema, compression)
            return cls(batches, schema, buf.size, records, compression, buf)
        sink = pa.MockOutputStream()
        _write(sink, batches, schema, compression)
        return cls(batches, schema, sink.size(), records, compression)

    def pieces(self) -> list[pa.Buffer | bytes]:
        """The chunk's bytes as a list of pieces whose concatenation is the IPC stream: the
        record batches' own buffers (no copy) between small metadata and padding pieces,
        for a gathering write (``pwritev``)."""
        if self._buffer is not None:
            return [self._buffer]
        if self._pieces is not None:
            return list(self._pieces)
        sink = _Pieces()
        _write(pa.PythonFile(sink, mode="w"), self.batches, self.schema, self.compression)
        return sink.parts

    def write_into(self, target: pa.Buffer) -> None:
        """Write the IPC stream straight into a mutable buffer of at least ``size`` bytes."""
        if self._buffer is not None:
            memoryview(target)[: self.size] = memoryview(self._buffer)
            return
        if self._pieces is not None:
            out, at = memoryview(target).cast("B"), 0
            for piece in self._pieces:
                n = len(piece)
                out[at:at + n] = memoryview(piece).cast("B")
                at += n
            return
        _write(pa.FixedSizeBufferWriter(target), self.batches, self.schema, self.compression)


class _Pieces:
    """A write-only file that keeps what it is given. Arrow's IPC writer hands a Python file
    the body buffers themselves (zero-copy), and only metadata and padding as bytes."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[pa.Buffer | bytes] = []

    def write(self, data: pa.Buffer | bytes) -> int:
        self.parts.append(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


_INT32_MAX = 2**31 - 1


class _StandIn:
    """Address space reserved and never touched, standing in for the data buffers of a batch
    that is only described (so that Arrow writes its metadata): no memory, no page faults."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf: pa.Buffer | None = None

    def take(self, size: int) -> pa.Buffer:
        with self._lock:
            if self._buf is None or self._buf.size < size:
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
                self._buf = pa.py_buffer(mmap.mmap(-1, max(size, 1 << 20), flags=flags))
            return self._buf.slice(0, size)


_stand_in = _StandIn()


def _layout(arrays: list[pa.Array], t: pa.DataType
            ) -> tuple[list[pa.Buffer | None], list[memoryview], int] | None:
    """For a column without nulls of a fixed-width or binary type: its buffers before the
    data buffer in the joined batch, the bytes of its data buffer as views of the arrays'
    own, and their size. None for any other column."""
    if isinstance(t, pa.ExtensionType | pa.DictionaryType) or any(a.null_count for a in arrays):
        return None
    arrays = [a for a in arrays if len(a)]
    n = sum(len(a) for a in arrays)
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) \
            or pa.types.is_large_string(t):
        dtype = np.int32 if pa.types.is_binary(t) or pa.types.is_string(t) else np.int64
        offsets = np.empty(n + 1, dtype)
        data, at, size = [], 0, 0
        for a in arrays:
            o = np.frombuffer(a.buffers()[1], dtype, len(a) + 1, a.offset * offsets.itemsize)
            offsets[at:at + len(a)] = o[:-1] - (int(o[0]) - size)
            start, end = int(o[0]), int(o[-1])
            data.append(memoryview(a.buffers()[2]).cast("B")[start:end])
            at += len(a)
            size += end - start
        if dtype is np.int32 and size > _INT32_MAX:
            return None
        offsets[n] = size
        return [None, pa.py_buffer(offsets)], data, size
    try:
        bits = t.bit_width
    except ValueError:  # not fixed-width
        return None
    if bits % 8 or pa.types.is_null(t):
        return None  # booleans are bit-packed
    w = bits // 8
    return [None], [memoryview(a.buffers()[1]).cast("B")[a.offset * w:(a.offset + len(a)) * w]
                    for a in arrays], n * w


def _gather(batches: list[pa.RecordBatch], schema: pa.Schema
            ) -> list[pa.Buffer | bytes | memoryview] | None:
    """The IPC stream of ``batches`` joined into one record batch, as pieces for a gathering
    write, without copying the data: Arrow writes the metadata of a joined batch whose data
    buffers are stand-ins, and each stand-in is replaced by the views of the buffers it
    joins. Columns with nulls, booleans and nested types are joined for real (a copy).
    None when the result would not be exact (then the caller joins the batches itself)."""
    n = sum(b.num_rows for b in batches)
    columns: list[pa.Array | None] = []
    layouts = []
    for i, f in enumerate(schema):
        arrays = [b.column(i) for b in batches]
        lay = _layout(arrays, f.type)
        if lay is None:
            columns.append(pa.concat_arrays(arrays))
        else:
            columns.append(None)
            layouts.append((i, *lay))
    stand = _stand_in.take(sum(size for *_, size in layouts))
    real: dict[int, tuple[int, list[memoryview]]] = {}
    at = 0
    for i, head, views, size in layouts:
        data = stand.slice(at, size)
        if size:
            real[data.address] = (size, views)
        columns[i] = pa.Array.from_buffers(schema.field(i).type, n, [*head, data],
                                           null_count=0)
        at += size
    sink = _Pieces()
    _write(pa.PythonFile(sink, mode="w"),
           [pa.RecordBatch.from_arrays(columns, schema=schema)], schema, "none")
    out: list[pa.Buffer | bytes | memoryview] = []
    replaced = 0
    for part in sink.parts:
        hit = real.get(part.address) if isinstance(part, pa.Buffer) else None
        if hit is not None and hit[0] == part.size:
            out.extend(hit[1])
            replaced += 1
        else:
            out.append(part)
    # Every stand-in must have been swapped for its data: one written out would be garbage.
    return out if replaced == len(real) else None


def checksum_pieces(pieces: list[pa.Buffer | bytes]) -> int:
    """:func:`checksum` of the concatenation of ``pieces``, without concatenating them."""
    h = xxhash.xxh3_64()
    for piece in pieces:
        h.update(memoryview(piece))
    return h.intdigest()


_PARALLEL_CHECKSUM_BYTES = 4 << 20


def checksum_while(pieces: list[memoryview], size: int, write: Callable[[], None]) -> int:
    """Run ``write()``, and compute :func:`checksum_pieces` of ``pieces`` meanwhile on another
    thread when the chunk is large: xxhash and the kernel's copy both run without the GIL, so
    on a second core the checksum adds no time (a thread costs more than it saves on a small
    chunk)."""
    if size < _PARALLEL_CHECKSUM_BYTES:
        write()
        return checksum_pieces(pieces)
    out: list[int] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(checksum_pieces(pieces))
        except BaseException as e:  # re-raised on the caller's thread
            failed.append(e)

    helper = threading.Thread(target=run, name="pafka-checksum", daemon=True)
    helper.start()
    try:
        write()
    finally:
        helper.join()
    if failed:
        raise failed[0]
    return out[0]


def _write(sink: pa.NativeFile, batches: list[pa.RecordBatch], schema: pa.Schema,
           compression: str) -> None:
    with pa.ipc.new_stream(sink, schema, options=_options(compression)) as w:
        for b in batches:
            w.write_batch(b)


def _encode(batches: list[pa.RecordBatch], schema: pa.Schema, compression: str) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    _write(sink, batches, schema, compression)
    return sink.getvalue()


# What Arrow (and Python decoding the names Arrow found) raise on bytes that are not a valid
# IPC stream: every Arrow exception, an I/O or out-of-bounds read, a name that is not UTF-8.
_UNREADABLE = (pa.ArrowException, OSError, ValueError, EOFError)


def read_chunk(buf: pa.Buffer, where: str, check: bool = True) -> Iterator[pa.RecordBatch]:
    """Yield the record batches of a chunk held in ``buf`` (zero-copy unless compressed).

    Bytes that are not an Arrow IPC stream are :class:`CorruptSegment` naming ``where``,
    whatever Arrow raised. With ``check``, each batch also passes Arrow's full validation
    (see :class:`ChunkDecoder`)."""
    try:
        for batch in pa.ipc.open_stream(buf):
            if check:
                batch.validate(full=True)
            yield batch
    except _UNREADABLE as e:
        raise CorruptSegment(f"{where}: the chunk is not a readable Arrow IPC stream "
                             f"({type(e).__name__}: {e})") from None
