"""A partition's records read as a caller asks: a range, some columns, and conditions that
skip chunks by their statistics (:mod:`tier_store.stats`) and filter the rows left."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from .reading import execute, skip_warning
from .schemas import selected
from .stats import chunk_filter, expression

if TYPE_CHECKING:
    from .topic import Topic


def read(topic: Topic, partition: int, start: int, end: int | None = None,
         verify: bool = True, skip_corrupt: bool = False,
         columns: Sequence[str] | None = None,
         where: Sequence[Sequence[Any]] | None = None) -> Iterator[pa.RecordBatch]:
    """Yield the records ``[start, end)`` of ``partition`` (``end=None``: to the latest)
    as Arrow batches, zero-copy, in the topic's schema (``columns``: only those). Below
    the earliest: :class:`DataLoss`. Chunks are checked first (:class:`CorruptSegment`,
    or with ``skip_corrupt`` a warning naming the offsets skipped); ``verify=False``
    trusts the bytes: a damaged chunk may give wrong rows or crash the process.

    ``where``: conditions ``(column, op, value)`` that every row returned passes (ops
    ``=``, ``<``, ``<=``, ``>``, ``>=``, ``in``; and ``(column, "is null")``, ``(column,
    "is not null")``). Chunks whose statistics show that no row of theirs can pass are
    not read at all; the rows of the others are filtered in Arrow."""
    keep = None if not where else chunk_filter(topic.schema, where)
    plan = topic.plan_reads([(partition, start, end)], keep)[0]
    names = plan.schema.names if plan.schema is not None else []
    wanted = None if columns is None else \
        selected(plan.schema, columns, f"topic {topic.name!r}: read columns")
    if wanted is not None and where:  # the filter reads its columns too
        used = {c[0] for c in where}
        plan.columns = tuple(n for n in names if n in used or n in wanted)
    else:
        plan.columns = wanted
    skip = skip_warning("read") if skip_corrupt else None
    expr = expression(where) if where else None
    for pb in execute(plan, verify, skip_corrupt=skip):
        batch = pb.batch
        if expr is not None:
            batch = batch.filter(expr)
            if wanted is not None and batch.schema.names != list(wanted):
                batch = batch.select(list(wanted))
            if not batch.num_rows:
                continue
        yield batch


__all__ = ["read"]
