"""The lake: a topic's oldest segments as Parquet files of one Delta Lake table.

A topic incarnation has one table, ``<lake>/<topic>-<topic id>``: a topic deleted and
created again never shares its namesake's table. The table holds the topic's columns plus
``_offset`` (int64) and ``_timestamp`` (the commit time, ms, UTC) in each file, and
``_partition`` (int32) as its partition column: a file holds rows of one partition, so every
engine prunes by partition from the path alone. Statistics on ``_offset`` and
``_timestamp`` let engines seek by offset or time.

A demoted run of segments becomes one file, ``_partition=<p>/<first>-<last>.parquet``: the
sequence numbers of its first and last source segment, 20 digits each. Two different runs
never share a name, and a demotion retried after a crash builds the same bytes again. The
file is built in memory and written whole. Its row groups each hold a run of offsets; the
log records, per row group, its byte range, offsets and xxh3-64 (a :class:`LakeGroup`, stored like a
chunk), and for the file its footer's range and xxh3-64. A read fetches the footer and the
row groups it needs, checks both against the log before Parquet sees a byte, and checks the
``_offset`` column holds exactly the offsets the log names: a damaged or swapped file is
:class:`CorruptSegment`, never a wrong row.

Exactly once: a demotion is one Delta commit carrying an application transaction (Delta's
``txn``) with app id ``pafka-<topic id>-<partition>`` and version the last demoted segment's
sequence + 1 (:mod:`tier_store.lake_table`). A retry first reads it: rows the table holds
already are not added again.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .chunk import checksum
from .errors import CorruptSegment, PafkaError
from .stats import compute, domain, merged

OFFSET, TIMESTAMP, PARTITION = "_offset", "_timestamp", "_partition"
LAKE_COLUMNS = (PARTITION, OFFSET, TIMESTAMP)
GROUP_BYTES = 8 << 20
"""Uncompressed bytes a row group holds, about: small enough that a read of a few offsets
fetches little, large enough that engines scan at Parquet speed."""
_FOOTER_TAIL = 8  # the footer's length (4 bytes) and the magic "PAR1"


@dataclass(frozen=True)
class LakeGroup:
    """A row group of a lake file: bytes ``[pos, pos + length)``, offsets
    ``[base, base + records)``, the xxh3-64 of those bytes, and the commit time of its rows
    (the latest)."""

    pos: int
    length: int
    base: int
    records: int
    checksum: int
    ts: int
    st: dict[str, Any] | None = None  # column statistics of its rows (tier_store.stats)


@dataclass(frozen=True)
class LakeFile:
    """A lake file as the log records it: its path in the table, size, footer and groups."""

    rel: str
    size: int
    footer_pos: int
    footer_length: int
    footer_checksum: int
    groups: tuple[LakeGroup, ...]

    @property
    def base(self) -> int:
        return self.groups[0].base

    @property
    def end(self) -> int:
        return self.groups[-1].base + self.groups[-1].records


def table_name(topic: str, topic_id: str) -> str:
    """The directory of a topic incarnation's table under the lake's root (a path built from
    a checked name and a checked id only)."""
    if not topic_id:
        raise PafkaError(f"topic {topic!r} has no id (created by an old release): its "
                         "history cannot go to a lake table")
    if not re.fullmatch(r"[0-9a-f]{32}", topic_id):
        raise PafkaError(f"topic {topic!r}: its id {topic_id!r} is not 32 hex digits; its lake "
                         "table is not named from it")
    return f"{topic}-{topic_id}"


def file_rel(partition: int, first: int, last: int) -> str:
    """The path, in its table, of the file of ``partition``'s segments ``first`` to ``last``
    (sequence numbers)."""
    return f"{PARTITION}={partition}/{first:020d}-{last:020d}.parquet"


_REL = re.compile(r"\A_partition=(\d{1,9})/(\d{20})-(\d{20})\.parquet\Z")


def parse_rel(rel: str) -> tuple[int, int, int] | None:
    """(partition, first, last) of a file name :func:`file_rel` makes; None for another."""
    m = _REL.match(rel)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]))


def table_schema(schema: pa.Schema) -> pa.Schema:
    """The table's schema: the topic's columns, then the lake's three."""
    taken = [n for n in LAKE_COLUMNS if n in schema.names]
    if taken:
        raise PafkaError(f"the topic's schema has column(s) {', '.join(taken)}, which the lake "
                         "table adds: rename them to keep the topic's history in a lake")
    return pa.schema([*schema, pa.field(OFFSET, pa.int64(), nullable=False),
                      pa.field(TIMESTAMP, pa.timestamp("ms", tz="UTC"), nullable=False),
                      pa.field(PARTITION, pa.int32(), nullable=False)])


def _file_schema(schema: pa.Schema) -> pa.Schema:
    # A file leaves out the partition column: Delta keeps it in the path.
    return pa.schema([*schema, pa.field(OFFSET, pa.int64(), nullable=False),
                      pa.field(TIMESTAMP, pa.timestamp("ms", tz="UTC"), nullable=False)])


def build_file(schema: pa.Schema, partition: int, seqs: tuple[int, int],
               runs: Iterable[tuple[pa.RecordBatch, int, int, bool]],
               group_bytes: int = GROUP_BYTES, compression: str = "zstd"
               ) -> tuple[LakeFile, pa.Buffer]:
    """The lake file of segments ``seqs`` (first, last) of ``partition``, from ``runs``
    (``(batch, first offset, commit time ms, whether a chunk ends with it)``, in offset order):
    its record and its bytes. Row groups end at a chunk's end once they hold ``group_bytes``,
    and at a gap in the offsets (another writer's segment holds those): each holds a run of
    whole chunks, as the log names it."""
    fschema = _file_schema(schema)
    sink = pa.BufferOutputStream()
    # Per row group: base, records, latest commit time, statistics.
    spans: list[tuple[int, int, int, dict[str, Any]]] = []
    pending: list[pa.RecordBatch] = []
    rows: list[pa.RecordBatch] = []  # pending's, in the topic's schema
    pending_bytes, group_base, group_ts, nxt = 0, -1, 0, -1
    # Statistics on every column: engines skip files and row groups by them.
    with pq.ParquetWriter(sink, fschema, compression=compression,
                          write_page_checksum=True) as writer:
        def flush() -> None:
            nonlocal pending, pending_bytes, rows
            if pending:
                table = pa.Table.from_batches(pending, fschema)
                writer.write_table(table, row_group_size=max(1, table.num_rows))
                spans.append((group_base, table.num_rows, group_ts, compute(rows, schema)))
                pending, pending_bytes, rows = [], 0, []

        for batch, base, ts, chunk_end in runs:
            if nxt >= 0 and base < nxt:
                raise PafkaError(f"partition {partition}: a lake file's rows go in offset "
                                 f"order; offset {base} came after {nxt}")
            if not batch.num_rows:
                continue
            if base != nxt:
                flush()  # a gap: the chunk before it ended there
            if not pending:
                group_base, group_ts = base, ts
            n = batch.num_rows
            cols = [*batch.columns, pa.array(np.arange(base, base + n, dtype=np.int64)),
                    pa.array(np.full(n, ts, dtype=np.int64)).cast(pa.timestamp("ms", tz="UTC"))]
            pending.append(pa.record_batch(cols, schema=fschema))
            rows.append(batch)
            pending_bytes += batch.nbytes
            group_ts = max(group_ts, ts)
            nxt = base + n
            if chunk_end and pending_bytes >= group_bytes:
                flush()
        flush()
    if not spans:
        raise PafkaError(f"partition {partition}: a lake file needs one record at least")
    data = sink.getvalue()
    return _describe(data, spans, file_rel(partition, *seqs)), data


def _describe(data: pa.Buffer, spans: Sequence[tuple[int, int, int, dict[str, Any]]],
              rel: str) -> LakeFile:
    """The record of a lake file's bytes, whose row groups hold ``spans``."""
    meta = pq.read_metadata(pa.BufferReader(data))
    if meta.num_row_groups != len(spans):
        raise PafkaError(f"{rel}: {meta.num_row_groups} row groups written, {len(spans)} "
                         "planned")
    groups = []
    for i, (base, records, ts, st) in enumerate(spans):
        lo, hi = _group_range(meta.row_group(i))
        groups.append(LakeGroup(lo, hi - lo, base, records, checksum(data.slice(lo, hi - lo)),
                                ts, st))
    footer_len = meta.serialized_size + _FOOTER_TAIL
    footer_pos = data.size - footer_len
    return LakeFile(rel, data.size, footer_pos, footer_len,
                    checksum(data.slice(footer_pos, footer_len)), tuple(groups))


def _group_range(rg: Any) -> tuple[int, int]:
    """The byte range of a row group's column chunks (contiguous, as writers lay them)."""
    lo, hi = None, 0
    for c in range(rg.num_columns):
        col = rg.column(c)
        start = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset is not None:
            start = min(start, col.dictionary_page_offset)
        lo = start if lo is None else min(lo, start)
        hi = max(hi, start + col.total_compressed_size)
    assert lo is not None
    return lo, hi


class _Ranges(io.RawIOBase):
    """A file of ``size`` bytes of which only ``pieces`` (position, bytes) were fetched: a
    read outside them is an error, never a guess."""

    def __init__(self, size: int, pieces: list[tuple[int, pa.Buffer]], where: str):
        self.size, self.pieces, self.where, self.at = size, pieces, where, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = offset if whence == 0 else self.at + offset if whence == 1 else \
            self.size + offset
        return self.at

    def tell(self) -> int:
        return self.at

    def readinto(self, b: Any) -> int:
        n = min(len(b), max(0, self.size - self.at))
        for pos, piece in self.pieces:
            if pos <= self.at and self.at + n <= pos + piece.size:
                b[:n] = memoryview(piece)[self.at - pos:self.at - pos + n]
                self.at += n
                return n
        raise CorruptSegment(f"{self.where}: Parquet asked for bytes [{self.at}, "
                             f"{self.at + n}), outside the row groups the log names")


def decode_groups(where: str, f: LakeFile, footer: pa.Buffer,
                  groups: Sequence[tuple[LakeGroup, pa.Buffer]], schema: pa.Schema,
                  columns: Sequence[str] | None = None) -> list[pa.RecordBatch]:
    """The topic's batches (``schema``; only ``columns`` if given) of ``groups`` of file
    ``f`` at ``where``, from their fetched bytes: each checked against its checksum first,
    then its ``_offset`` column against its offsets. :class:`CorruptSegment` otherwise."""
    return [b for b, _ in decode_timed(where, f, footer, groups, schema, columns)]


def decode_timed(where: str, f: LakeFile, footer: pa.Buffer,
                 groups: Sequence[tuple[LakeGroup, pa.Buffer]], schema: pa.Schema,
                 columns: Sequence[str] | None = None, whole: pa.Buffer | None = None
                 ) -> list[tuple[pa.RecordBatch, int]]:
    """:func:`decode_groups`, each batch with its rows' commit time (ms): batches are cut
    where the ``_timestamp`` column changes, as the log's chunks were. ``whole``: the whole
    file (a mapping), of which ``footer`` and the groups' bytes are slices: Parquet then
    reads it natively, the checked footer alone saying where."""
    if footer.size != f.footer_length or checksum(footer) != f.footer_checksum:
        raise CorruptSegment(f"{where}: the file's footer does not match its checksum")
    for g, data in groups:
        if data.size != g.length or checksum(data) != g.checksum:
            raise CorruptSegment(f"{where}: the row group of offsets [{g.base}, "
                                 f"{g.base + g.records}) does not match its checksum")
    try:
        meta = pq.read_metadata(pa.BufferReader(pa.py_buffer(b"PAR1" + footer.to_pybytes())))
        if whole is not None and whole.size == f.size:
            source: Any = pa.BufferReader(whole)
        else:
            source = pa.PythonFile(_Ranges(f.size, [(f.footer_pos, footer),
                                                    *((g.pos, d) for g, d in groups)], where),
                                   mode="r")
        pf = pq.ParquetFile(source, metadata=meta, page_checksum_verification=True)
        index = {(meta.row_group(i).num_rows, _group_range(meta.row_group(i))[0]): i
                 for i in range(meta.num_row_groups)}
        # The file's top-level columns (Parquet's own names are its leaves'): one written
        # before the topic gained columns lacks them.
        held = set(meta.schema.to_arrow_schema().names)
        want = [*(c for c in (schema.names if columns is None else columns) if c in held),
                OFFSET, TIMESTAMP]
        out = []
        for g, _ in groups:
            i = index.get((g.records, g.pos))
            if i is None:
                raise CorruptSegment(f"{where}: no row group of {g.records} rows at byte "
                                     f"{g.pos}, as the log names")
            table = pf.read_row_group(i, columns=want)
            offsets = table.column(OFFSET).to_numpy()
            if len(offsets) != g.records or (len(offsets) and (
                    offsets[0] != g.base or (np.diff(offsets) != 1).any())):
                raise CorruptSegment(f"{where}: the row group at byte {g.pos} does not hold "
                                     f"offsets [{g.base}, {g.base + g.records})")
            keep = schema if columns is None else pa.schema([schema.field(c) for c in columns])
            times = table.column(TIMESTAMP).cast(pa.int64()).to_numpy()
            n = table.num_rows
            table = pa.Table.from_arrays(
                [table.column(f.name).cast(f.type) if f.name in held else pa.nulls(n, f.type)
                 for f in keep], schema=keep)
            cuts = [0, *(np.flatnonzero(np.diff(times)) + 1).tolist(), len(times)]
            for a, b in zip(cuts, cuts[1:], strict=False):
                out.extend((x, int(times[a])) for x in table.slice(a, b - a).to_batches())
        return out
    except CorruptSegment:
        raise
    except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptSegment(f"{where}: the lake file cannot be decoded "
                             f"({type(e).__name__}: {e})") from None


def _iso(ms: int) -> str:
    return np.datetime_as_string(np.datetime64(ms, "ms"), unit="ms") + "Z"


def add_stats(f: LakeFile, min_ts: int, max_ts: int, schema: pa.Schema | None = None) -> str:
    """Delta's statistics JSON for ``f``'s add action: its records, the range of its
    ``_offset`` and ``_timestamp``, and of the columns of topic ``schema`` its row groups'
    statistics bound, which readers use to skip it."""
    records = sum(g.records for g in f.groups)
    lows: dict[str, Any] = {OFFSET: f.base, TIMESTAMP: _iso(min_ts)}
    highs: dict[str, Any] = {OFFSET: f.end - 1, TIMESTAMP: _iso(max_ts)}
    nulls: dict[str, Any] = {OFFSET: 0, TIMESTAMP: 0}
    cols = merged([g.st for g in f.groups], [g.records for g in f.groups]) \
        if schema is not None else {}
    for name, (lo, hi, n) in cols.items():
        i = schema.get_field_index(name) if schema is not None else -1
        if i < 0:
            continue
        t = schema.field(i).type
        nulls[name] = n
        if lo is not None and (v := _delta_value(t, lo, up=False)) is not None:
            lows[name] = v
        if hi is not None and (v := _delta_value(t, hi, up=True)) is not None:
            highs[name] = v
    return json.dumps({"numRecords": records, "minValues": lows, "maxValues": highs,
                       "nullCount": nulls})


def _delta_value(t: pa.DataType, v: Any, up: bool) -> Any:
    """A statistics bound as Delta writes it for a column of type ``t`` (None: left out)."""
    kind = domain(t)
    if kind in ("int", "float") and not pa.types.is_unsigned_integer(t):
        return v
    if kind == "str":
        return v
    if kind == "day":
        return str(np.datetime64(v, "D"))
    if kind == "us" and t.tz is not None:  # Delta's bounds are whole ms: rounded outwards
        return _iso(-(-v // 1000) if up else v // 1000)
    return None


def write_local(path: str, data: pa.Buffer) -> None:
    """Write a lake file whole and durably at ``path`` (replacing a leftover of a crashed
    attempt): a temporary file, fsynced, renamed, its directory fsynced."""
    from .layout import makedirs_durable, write_atomic
    makedirs_durable(os.path.dirname(path))
    write_atomic(path, memoryview(data), durable=True)


__all__ = ["GROUP_BYTES", "LAKE_COLUMNS", "LakeFile", "LakeGroup", "add_stats", "build_file",
           "decode_groups", "decode_timed", "file_rel", "parse_rel", "table_name", "table_schema",
           "write_local"]
