"""Chunk statistics: computed when a chunk is written, kept with its row in the log, and
used to skip the chunks a filter cannot keep before any of their bytes is read.

A chunk's statistics are a JSON object (``"st"`` in its ``append`` entry, a string column
of checkpoints and index pieces)::

    {"c": {"<column>": [min, max, nulls], ...}, "r": ["<key column>", <partitions>]}

``min`` and ``max`` bound a column's non-null values, in one domain per type family, so
that a widened column keeps its chunks' bounds: integers; floats; timestamps in
microseconds; dates in days; strings (``min`` cut to 64 characters, ``max`` left out when
longer). A bound that is null while some value is not is unknown: a float column holding a
NaN has no ``max`` (Spark orders NaN above every number). Columns of other types have no
entry. ``"r"`` says the chunk's rows were routed by the stable hash of that column over that
many partitions (:func:`tier_store.hashing.partition_of`).

Statistics never decide a row's value: a chunk is skipped only when its bounds show that no
row of it can pass a condition. A chunk without statistics (written before them, or with
``log.chunk.statistics=none``), or with any that do not parse, is always read; a column
without (a string column under ``log.chunk.statistics=numeric``, the default) prunes
nothing. Lake row groups record every orderable column.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .errors import InvalidArgument

log = logging.getLogger(__name__)

STRING_PREFIX = 64  # characters of a string bound kept
# A chunk of fewer records gets none: keeping them cost a one-record append 30 % more CPU
# (computing them, and carrying them through its entry and rows), and such a chunk costs
# less to read than to skip.
STATS_MIN_ROWS = 16
OPS = ("=", "==", "<", "<=", ">", ">=", "in", "is null", "is not null")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_EPOCH_DAY = datetime.date(1970, 1, 1)
_US = {"s": 1_000_000, "ms": 1000, "us": 1}
_DAY_MS = 86_400_000


def domain(t: pa.DataType) -> str | None:
    """The statistics domain of an Arrow type: ``int``, ``float``, ``us``, ``day``,
    ``str``, or None (no statistics)."""
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t):
        return "us"
    if pa.types.is_date(t):
        return "day"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "str"
    return None


def _bounds(col: pa.ChunkedArray, kind: str) -> tuple[Any, Any]:
    """Bounds of a column with a value at least (``compute`` leaves all-null ones out)."""
    import pyarrow.compute as pc  # here: importing it costs every process ~60 ms

    if kind == "float":
        return _float_bounds(col)
    if kind == "str":
        mm = pc.min_max(col)
        a, b = mm["min"].as_py(), mm["max"].as_py()
        return a[:STRING_PREFIX], (b if len(b) <= STRING_PREFIX else None)
    a, b = _int_bounds(col)
    if kind == "us":
        unit = col.type.unit
        if unit == "ns":  # Spark reads microseconds: bounds that hold either way
            return a // 1000, -(-b // 1000)
        return a * _US[unit], b * _US[unit]
    if kind == "day" and pa.types.is_date64(col.type):
        return a // _DAY_MS, -(-b // _DAY_MS)
    return a, b


def _int_bounds(col: pa.ChunkedArray) -> tuple[int, int]:
    """Min and max of the stored integers of an integer, timestamp or date column with a
    value: numpy's, as a compute call costs ~20 µs however few the rows (a one-record
    append paid 40 % more CPU through two of them)."""
    import numpy as np
    if col.null_count:
        import pyarrow.compute as pc
        col = pc.drop_null(col)
    t = col.type
    store = t if pa.types.is_integer(t) else pa.int64() if t.bit_width == 64 else pa.int32()
    lows, highs = [], []
    for c in col.chunks:
        if len(c):
            a = c.view(store).to_numpy(zero_copy_only=False)
            lows.append(int(np.min(a)))
            highs.append(int(np.max(a)))
    return min(lows), max(highs)


def _float_bounds(col: pa.ChunkedArray) -> tuple[float | None, float | None]:
    """A float column's bounds. NaN sorts above every number in Spark, so a column holding
    one has no max. numpy's max propagates NaN and fmin skips it: five times faster than
    Arrow's min_max, on columns without nulls (whose slots hold any value)."""
    import numpy as np
    if col.null_count:
        import pyarrow.compute as pc
        col = pc.drop_null(col)
    lows, highs = [], []
    for c in col.chunks:
        if len(c):
            a = c.to_numpy(zero_copy_only=False)
            lows.append(float(np.fmin.reduce(a)))
            highs.append(float(np.max(a)))
    if not lows:
        return None, None
    lo, hi = min(lows), max(highs)  # NaN only if every value of a chunk is NaN
    return (lo if math.isfinite(lo) else None,
            None if any(math.isnan(h) for h in highs) or not math.isfinite(hi) else hi)


def compute(batches: Sequence[pa.RecordBatch], schema: pa.Schema,
            route: tuple[str, int] | None = None, strings: bool = True) -> dict[str, Any]:
    """The statistics of a chunk of ``batches`` (of ``schema``); ``route``: the key column
    and partition count its rows were routed by; ``strings=False`` leaves string columns
    out (Arrow's min_max takes about 14 ns a string, ten times an integer's cost)."""
    cols: dict[str, list[Any]] = {}
    rows = sum(b.num_rows for b in batches)
    for i, f in enumerate(schema):
        kind = domain(f.type)
        if kind is None or (kind == "str" and not strings):
            continue
        col = pa.chunked_array([b.column(i) for b in batches], f.type)
        nulls = col.null_count
        lo, hi = (None, None) if nulls == rows else _bounds(col, kind)
        cols[f.name] = [lo, hi, nulls]
    out: dict[str, Any] = {"c": cols}
    if route is not None:
        out["r"] = [route[0], route[1]]
    return out


def merged(stats: Sequence[Any], records: Sequence[int]) -> dict[str, list[Any]]:
    """The column statistics of rows gathered from chunks with ``stats`` (and ``records``
    rows each): a column every one of them bounds, with bounds known wherever it has values."""
    parts = [parsed(s) for s in stats]
    if not parts or any(p is None for p in parts):
        return {}
    out: dict[str, list[Any]] = {}
    for name in parts[0]["c"]:  # type: ignore[index]
        entries = [p["c"].get(name) for p in parts]  # type: ignore[index]
        if not all(isinstance(e, list) and len(e) == 3 and type(e[2]) is int for e in entries):
            continue
        live = [(e, n) for e, n in zip(entries, records, strict=True) if e[2] < n]
        lows = [e[0] for e, _ in live]
        highs = [e[1] for e, _ in live]
        typed = {type(v) for v in lows + highs if v is not None}
        if len(typed) > 1 and typed != {int, float}:
            continue  # not of one domain: not trusted
        nulls = sum(e[2] for e in entries)
        lo = None if not lows or None in lows else min(lows)
        hi = None if not highs or None in highs else max(highs)
        out[name] = [lo, hi, nulls]
    return out


def text(st: Any) -> str | None:
    """Statistics as a checkpoint's string column holds them."""
    if st is None or isinstance(st, str):
        return st
    return json.dumps(st, separators=(",", ":"), allow_nan=False)


def parsed(st: Any) -> dict[str, Any] | None:
    """A row's statistics as an object, or None if it has none (or they do not parse)."""
    if not st:  # None (or a zeroed row)
        return None
    if isinstance(st, str):
        try:
            st = json.loads(st)
        except ValueError:
            _bad(st)
            return None
    if not isinstance(st, dict) or not isinstance(st.get("c", {}), dict):
        _bad(st)
        return None
    return st


_warned = False


def _bad(st: Any) -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning("chunk statistics %.80r do not parse: such chunks are always read", st)


_PY = {"int": (int,), "float": (int, float), "us": (int,), "day": (int,), "str": (str,)}


def _bound(v: Any, kind: str) -> Any:
    """A bound from the log, or None when unknown (or of the wrong type: never trusted)."""
    return v if type(v) in _PY[kind] else None


@dataclass
class Condition:
    """One condition of a conjunction, its values in the column's statistics domain."""

    column: str
    op: str  # "=", "in", "<", "<=", ">", ">=", "is null", "is not null"
    kind: str
    values: tuple[Any, ...] = ()
    keys: pa.Array | None = None  # "=" and "in": the values in the column's type
    # Per partition count, the partition each value is routed to (found once).
    homes: dict[int, list[int]] = field(default_factory=dict, compare=False)

    def routed_to(self, partition: int, partitions: int) -> tuple[Any, ...]:
        """The values a chunk routed over ``partitions`` may hold in ``partition``."""
        homes = self.homes.get(partitions)
        if homes is None:
            from .hashing import partition_of
            assert self.keys is not None
            homes = self.homes[partitions] = partition_of(self.keys, partitions).tolist()
        return tuple(v for v, h in zip(self.values, homes, strict=True) if h == partition)


@dataclass
class ChunkFilter:
    """A conjunction of :class:`Condition`: :meth:`keeps` says whether a chunk may hold a
    row passing them all (picklable)."""

    conditions: tuple[Condition, ...]

    def keeps(self, st: Any, records: int, partition: int) -> bool:
        s = parsed(st)
        if s is None:
            return True
        cols = s.get("c", {})
        route = s.get("r")
        for c in self.conditions:
            if c.keys is not None and isinstance(route, list) and len(route) == 2 and \
                    route[0] == c.column and type(route[1]) is int and route[1] >= 1:
                values = c.routed_to(partition, route[1])
                if not values:
                    return False  # the chunk's rows of those values are elsewhere
                c = Condition(c.column, "in", c.kind, values)
            if not _may_pass(c, cols.get(c.column), records):
                return False
        return True


def _may_pass(c: Condition, entry: Any, records: int) -> bool:
    if not (isinstance(entry, list) and len(entry) == 3 and type(entry[2]) is int
            and 0 <= entry[2] <= records):
        return True
    nulls = entry[2]
    if c.op == "is null":
        return nulls > 0
    if nulls == records:
        return False  # a comparison never passes a null
    if c.op == "is not null":
        return True
    lo, hi = _bound(entry[0], c.kind), _bound(entry[1], c.kind)
    vals = c.values
    if c.op == "in":
        return any((lo is None or v >= lo) and (hi is None or v <= hi) for v in vals)
    v = vals[0]
    if c.op == "=":
        return (lo is None or v >= lo) and (hi is None or v <= hi)
    if c.op == "<":
        return lo is None or lo < v
    if c.op == "<=":
        return lo is None or lo <= v
    if c.op == ">":
        return hi is None or hi > v
    return hi is None or hi >= v  # ">="


def _value(v: Any, kind: str, t: pa.DataType) -> Any:
    """``v`` in domain ``kind``; ValueError when it does not belong to the column."""
    if kind == "int" and type(v) is int:
        return v
    if kind == "float" and type(v) in (int, float) and not math.isnan(v):
        return v
    if kind == "str" and isinstance(v, str):
        return v
    if kind == "us" and isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=datetime.UTC)  # naive: UTC, as Spark hands them over
        return (v - _EPOCH) // datetime.timedelta(microseconds=1)
    if kind == "day" and isinstance(v, datetime.date) and \
            not isinstance(v, datetime.datetime):
        return (v - _EPOCH_DAY).days
    raise ValueError(f"{v!r} is not a value of a {t} column")


def chunk_filter(schema: pa.Schema, where: Iterable[Sequence[Any]], strict: bool = True,
                 routable: bool = True) -> ChunkFilter | None:
    """The :class:`ChunkFilter` of conditions ``where``: ``(column, op, value)`` with op one
    of :data:`OPS` (``in`` takes a list; ``is null`` and ``is not null`` no value). With
    ``strict``, a condition naming no column of ``schema``, an unknown op or a value of
    another type is :class:`InvalidArgument`; else it is left out (it skips nothing). None
    when no condition is left."""
    out = []
    for cond in where:
        try:
            out.extend(_condition(schema, cond, routable))
        except (ValueError, TypeError, OverflowError) as e:
            if strict:
                raise InvalidArgument(f"filter {tuple(cond)!r}: {e}") from None
    return ChunkFilter(tuple(out)) if out else None


def _condition(schema: pa.Schema, cond: Sequence[Any], routable: bool) -> list[Condition]:
    if not isinstance(cond, (tuple, list)) or len(cond) not in (2, 3):
        raise ValueError("a filter is (column, op, value) or (column, 'is null')")
    name, op = cond[0], cond[1]
    if op not in OPS:
        raise ValueError(f"op {op!r} is not one of {', '.join(OPS)}")
    if not isinstance(name, str) or schema.get_field_index(name) < 0:
        raise ValueError(f"{name!r} is not a column (columns: {schema.names})")
    t = schema.field(name).type
    kind = domain(t)
    if op in ("is null", "is not null"):
        if len(cond) == 3 and cond[2] is not None:
            raise ValueError(f"{op!r} takes no value")
        return [Condition(name, op, kind or "")]
    if len(cond) != 3:
        raise ValueError(f"{op!r} needs a value")
    raw = list(cond[2]) if op == "in" else [cond[2]]
    if op == "in" and (isinstance(cond[2], (str, bytes)) or not raw):
        raise ValueError("'in' takes a non-empty list of values")
    if kind is None:
        raise ValueError(f"column {name!r} is of type {t}, which has no statistics")
    values = tuple(_value(v, kind, t) for v in raw)
    keys = None
    if routable and op in ("=", "==", "in") and kind in ("int", "str"):
        try:
            keys = pa.array(raw, t)
        except (ValueError, TypeError, OverflowError):
            keys = None  # a value the column cannot hold: its chunks are not routed by it
    return [Condition(name, "in" if op == "in" else "=" if op == "==" else op, kind, values,
                      keys)]


def expression(where: Iterable[Sequence[Any]]) -> Any:
    """The conditions ``where`` (checked by :func:`chunk_filter`) as one Arrow compute
    expression, to filter rows."""
    import pyarrow.compute as pc

    expr = None
    for cond in where:
        f = pc.field(cond[0])
        op = cond[1]
        e = f.is_null() if op == "is null" else f.is_valid() if op == "is not null" else \
            f.isin(list(cond[2])) if op == "in" else \
            {"=": f == cond[2], "==": f == cond[2], "<": f < cond[2], "<=": f <= cond[2],
             ">": f > cond[2], ">=": f >= cond[2]}[op]
        expr = e if expr is None else expr & e
    return expr


__all__ = ["OPS", "STATS_MIN_ROWS", "ChunkFilter", "Condition", "chunk_filter", "compute", "domain",
           "expression", "merged", "parsed", "text"]
