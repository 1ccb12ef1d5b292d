"""Filters Spark pushes to a batch read (PySpark 4.1+, with
``spark.sql.python.filterPushdown.enabled``): the records a read can skip before it reads a
byte.

The metadata columns (``includeMetadata``) prune: ``_topic`` and ``_partition`` bound the
topics and partitions planned, ``_offset`` each partition's offset range, and
``_timestamp`` that range by commit time (commit times never go back within a topic).
Filters on the topic's own columns (``=``, ``<``, ``<=``, ``>``, ``>=``, ``IN``, ``IS
[NOT] NULL``) skip the chunks whose statistics exclude them, and ``=`` or ``IN`` on the key
a chunk was routed by, the chunks of the other partitions (:mod:`tier_store.stats`).
Every filter is also handed back to Spark, which applies it to the rows read: pruning only
skips records that no filter can keep, and a filter this module does not know prunes
nothing.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass
class Bounds:
    """What a read may skip: each bound is a half-open range ``[lo, hi)``."""

    topics: frozenset[str] | None = None  # None: every topic
    partitions: frozenset[int] | None = None
    partition_lo: int = 0
    partition_hi: float = math.inf
    offset_lo: int = 0
    offset_hi: float = math.inf
    ts_lo: int | None = None  # commit time, ms
    ts_hi: int | None = None
    # Conditions on data columns, as tier_store.chunk_filter takes them.
    where: tuple[tuple[Any, ...], ...] = ()

    def keeps_topic(self, name: str) -> bool:
        return self.topics is None or name in self.topics

    def keeps_partition(self, p: int) -> bool:
        return self.partition_lo <= p < self.partition_hi and \
            (self.partitions is None or p in self.partitions)


def clamp(b: Bounds, topic: Any, p: int, start: int, end: int) -> tuple[int, int]:
    """``[start, end)`` of partition ``p`` of ``topic`` narrowed to the bounds' offsets and
    commit times (an empty range when nothing is left)."""
    lo, hi = max(start, b.offset_lo), min(end, b.offset_hi)
    if b.ts_lo is not None and lo < hi:
        lo = max(lo, topic.offset_for_time(p, b.ts_lo))
    if b.ts_hi is not None and lo < hi:
        hi = min(hi, topic.offset_for_time(p, b.ts_hi))
    return lo, int(max(lo, hi))


def _ms(value: Any, up: bool) -> int | None:
    """A timestamp filter's value in ms since the epoch, rounded down (or ``up``); None for
    a value that is not a datetime. A naive one is UTC, as Spark hands them over."""
    if not isinstance(value, datetime.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    us = (value - _EPOCH) // datetime.timedelta(microseconds=1)
    return -(-us // 1000) if up else us // 1000


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def bounds(filters: Iterable[Any]) -> Bounds:
    """The :class:`Bounds` the filters Spark pushed imply (a conjunction); filters on other
    columns, or of other kinds, bound nothing."""
    b = Bounds()
    for f in filters:
        kind = type(f).__name__
        column = getattr(f, "attribute", ())
        if len(column) != 1:
            continue
        name = column[0]
        value = getattr(f, "value", None)
        if name == "_topic":
            names = frozenset({value}) if kind == "EqualTo" and isinstance(value, str) else \
                frozenset(value) if kind == "In" and all(isinstance(v, str) for v in value) \
                else None
            if names is not None:
                b.topics = names if b.topics is None else b.topics & names
        elif name == "_partition":
            b.partitions, b.partition_lo, b.partition_hi = _narrow(
                kind, value, b.partitions, b.partition_lo, b.partition_hi)
        elif name == "_offset":
            _, b.offset_lo, b.offset_hi = _narrow(kind, value, None, b.offset_lo, b.offset_hi)
        elif name == "_timestamp":
            _time(b, kind, value)
        if name not in METADATA:
            b.where += _condition(kind, name, value)
    return b


METADATA = frozenset({"_topic", "_partition", "_offset", "_timestamp"})
_OPS = {"EqualTo": "=", "GreaterThan": ">", "GreaterThanOrEqual": ">=", "LessThan": "<",
        "LessThanOrEqual": "<=", "In": "in"}


def _condition(kind: str, name: str, value: Any) -> tuple[tuple[Any, ...], ...]:
    """One of Spark's filters on a data column as conditions (none for other kinds)."""
    if kind == "IsNull" or (kind == "EqualNullSafe" and value is None):
        return ((name, "is null"),)
    if kind == "IsNotNull":
        return ((name, "is not null"),)
    if kind == "EqualNullSafe":
        return ((name, "=", value),)
    op = _OPS.get(kind)
    if op is None or value is None or (op == "in" and any(v is None for v in value)):
        return ()
    return ((name, op, tuple(value) if op == "in" else value),)


def named(columns: list[str], where: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Conditions with Spark's column names as the topic's ``columns`` name them (Spark's
    are case-insensitive; a name two columns share but for case is left as it is)."""
    lower = [n.lower() for n in columns]
    unique = {k: n for k, n in zip(lower, columns, strict=True) if lower.count(k) == 1}
    return [(c[0] if c[0] in columns else unique.get(c[0].lower(), c[0]), *c[1:])
            for c in where]


def _narrow(kind: str, value: Any, within: frozenset[int] | None, lo: int, hi: float
            ) -> tuple[frozenset[int] | None, int, float]:
    """An integer column's bounds narrowed by one filter."""
    if kind == "In":
        values = [_int(v) for v in value]
        if all(v is not None for v in values):
            got = frozenset(v for v in values if v is not None)
            within = got if within is None else within & got
        return within, lo, hi
    v = _int(value)
    if v is None:
        return within, lo, hi
    if kind == "EqualTo":
        return within, max(lo, v), min(hi, v + 1)
    if kind == "GreaterThan":
        return within, max(lo, v + 1), hi
    if kind == "GreaterThanOrEqual":
        return within, max(lo, v), hi
    if kind == "LessThan":
        return within, lo, min(hi, v)
    if kind == "LessThanOrEqual":
        return within, lo, min(hi, v + 1)
    return within, lo, hi


def _time(b: Bounds, kind: str, value: Any) -> None:
    """``_timestamp`` holds a record's commit time in ms (shown in µs). With t in µs:
    ``> t`` keeps ms >= floor(t/1000) + 1, ``>= t`` ms >= ceil(t/1000), ``< t`` ms <
    ceil(t/1000), ``<= t`` ms < floor(t/1000) + 1; ``= t`` both of ``>=`` and ``<=``."""
    if kind in ("GreaterThan", "GreaterThanOrEqual", "EqualTo"):
        ms = _ms(value, up=True)
        if ms is not None:
            if kind == "GreaterThan" and _ms(value, up=False) == ms:
                ms += 1  # t falls on a whole ms: that ms itself is not greater
            b.ts_lo = ms if b.ts_lo is None else max(b.ts_lo, ms)
    if kind in ("LessThan", "LessThanOrEqual", "EqualTo"):
        ms = _ms(value, up=True)
        if ms is not None:
            if kind != "LessThan" and _ms(value, up=False) == ms:
                ms += 1  # a whole ms is kept itself
            b.ts_hi = ms if b.ts_hi is None else min(b.ts_hi, ms)
