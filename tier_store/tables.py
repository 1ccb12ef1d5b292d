"""Arrow tables going into a topic: accepted shapes, validated, conformed to the topic's
schema, and the event-time range of a chunk."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from .chunk import EncodedChunk
from .errors import InvalidArgument, SchemaMismatch
from .hashing import partition_of
from .schemas import loose_type


def as_table(data: Any) -> pa.Table:
    """Accept a RecordBatch, a Table, or a list of batches; anything else is an error."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, list | tuple) and data and all(isinstance(b, pa.RecordBatch)
                                                        for b in data):
        try:
            return pa.Table.from_batches(list(data))
        except pa.ArrowInvalid as e:
            raise InvalidArgument("the record batches of one write must share one schema: "
                                  f"{_first_line(e)}") from None
    raise InvalidArgument(
        f"expected a pyarrow RecordBatch, Table or list of RecordBatches, got "
        f"{type(data).__name__}"
    )


# Where Arrow's validation says the fault is: an offset's slot, a value's index or position.
_AT = re.compile(r"\b(slot|string index|index|position) (\d+)")


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def check_valid(table: pa.Table, what: str, first_row: int = 0,
                outcome: str = "; nothing was stored") -> None:
    """Refuse ``table`` unless it passes Arrow's full validation: every column's lengths and
    buffers, offsets in order and inside their data, UTF-8 strings, dictionary indices in
    range, nested children. ``what`` names the data in the error (``data written to topic
    'x'``, a file). A checksum proves bytes are what was written, not that what was written
    is valid: this check is what keeps a malformed batch from every reader.

    :class:`InvalidArgument` names the column and, where Arrow says it, the row (counted
    from ``first_row``), and ends with ``outcome``."""
    try:
        table.validate()  # structure first: lengths and buffer sizes, O(columns)
    except pa.ArrowException as e:
        raise InvalidArgument(f"{what} is not valid Arrow data ({_first_line(e)}){outcome}"
                              ) from None
    for field, column in zip(table.schema, table.columns, strict=True):
        row = first_row
        for piece in column.chunks:
            try:
                piece.validate(full=True)
            except pa.ArrowException as e:
                why = _first_line(e).replace("Invalid: ", "")
                m = _AT.search(why)
                at = ""
                if m is not None:
                    # Slot s of an offsets buffer ends row s - 1.
                    n = int(m.group(2)) - (1 if m.group(1) == "slot" else 0)
                    at = f", row {row + max(n, 0)}"
                raise InvalidArgument(f"{what}: column {field.name!r}{at} is not valid Arrow "
                                      f"data ({why}){outcome}") from None
            row += len(piece)


def conform(table: pa.Table, schema: pa.Schema, topic: str) -> pa.Table:
    """Make ``table`` carry exactly ``schema``: reorder columns by name, and cast nullable
    columns into non-null fields when they hold no null. Anything else is SchemaMismatch."""
    if table.schema.equals(schema, check_metadata=False):
        # A field marked non-null does not stop its array from holding nulls: count them.
        nulls = [(f.name, n) for i, f in enumerate(schema)
                 if not f.nullable and (n := table.column(i).null_count)]
        if nulls:
            raise SchemaMismatch(f"data written to topic {topic!r} does not match its schema: "
                                 + "; ".join(f"column {c!r} is not nullable in the topic but "
                                             f"the data holds {n} nulls" for c, n in nulls))
        return table if table.schema.metadata == schema.metadata else table.cast(schema)
    names, want = table.schema.names, schema.names
    missing = [n for n in want if n not in names]
    extra = [n for n in names if n not in want]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if extra:
            parts.append(f"unexpected columns {extra}")
        raise SchemaMismatch(f"data written to topic {topic!r} does not match its schema: "
                             f"{'; '.join(parts)} (topic columns: {want})")
    if names != want:
        table = table.select(want)
    problems = []
    for f in schema:
        got = table.schema.field(f.name)
        if not loose_type(got.type).equals(loose_type(f.type)):
            problems.append(f"column {f.name!r}: topic has {f.type}, data has {got.type}")
        elif not f.nullable and table.column(f.name).null_count:
            problems.append(f"column {f.name!r} is not nullable in the topic but the data holds "
                            f"{table.column(f.name).null_count} nulls")
    if problems:
        raise SchemaMismatch(f"data written to topic {topic!r} does not match its schema: "
                             + "; ".join(problems))
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise SchemaMismatch(f"data written to topic {topic!r} does not fit its schema: {e}"
                             ) from None


def time_range(chunk: EncodedChunk, column: str) -> tuple[int | None, int | None]:
    """Min and max of an event-time column, in milliseconds since the epoch."""
    arrays = [b.column(column) for b in chunk.batches]
    col = pa.chunked_array(arrays)
    t = col.type
    if pa.types.is_timestamp(t):
        col = col.cast(pa.timestamp("ms", tz=t.tz)).cast(pa.int64())
    elif pa.types.is_date(t):
        col = col.cast(pa.timestamp("ms")).cast(pa.int64())
    elif not pa.types.is_integer(t):
        raise InvalidArgument(f"timestamp column {column!r} must be a timestamp, date or integer "
                         f"(milliseconds) column, not {t}")
    import pyarrow.compute as pc  # here: importing it costs every process ~60 ms

    mm = pc.min_max(col)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return (None if lo is None else int(lo)), (None if hi is None else int(hi))


def route(table: pa.Table, key: str, partitions: int) -> list[tuple[int, pa.Table]]:
    """``table``'s rows by partition, by the stable hash of column ``key`` (nulls to 0)."""
    parts = partition_of(table.column(key), partitions)
    ordered = table.take(pa.array(np.argsort(parts, kind="stable")))
    out, at = [], 0
    for p, n in enumerate(np.bincount(parts, minlength=partitions)):
        if n:
            out.append((p, ordered.slice(at, int(n))))
            at += int(n)
    return out


def split_chunks(table: pa.Table, compression: str, limit: int) -> Iterator[EncodedChunk]:
    """``table`` as chunks of at most ``limit`` bytes, halving until they fit; a single row
    too big gets a chunk (and a segment) of its own."""
    chunk = EncodedChunk.of(table.to_batches(), table.schema, compression)
    if chunk.size <= limit or table.num_rows <= 1:
        yield chunk
        return
    half = table.num_rows // 2
    yield from split_chunks(table.slice(0, half), compression, limit)
    yield from split_chunks(table.slice(half), compression, limit)


__all__ = ["as_table", "check_valid", "conform", "loose_type", "route", "split_chunks",
           "time_range"]
