"""A topic's schema: its text in the log, the changes it may take, and reading data written
in an older schema as the current one.

A topic's schema changes only in ways that leave every chunk already written readable,
exactly, in the new schema. These are the changes Delta Lake and Iceberg allow:

* **add a nullable column**, anywhere: older chunks read it as nulls;
* **widen a type**: ``int8 → int16 → int32 → int64``, ``float16 → float32 → float64``, and
  a decimal's precision up at the same scale;
* **make a non-null column nullable**.

Columns keep their names and their order among themselves; nested types, time units and
everything else stay as they are. Time zones are not compared: they only say how an instant
is shown (as :func:`loose_type` says).

Reading is per batch and in Arrow, never per row: an :class:`Adapter` keeps unchanged
columns as they are (zero-copy), casts widened ones and adds a null array for each column
the batch lacks.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa

from .errors import CorruptLog, InvalidArgument, SchemaMismatch

if TYPE_CHECKING:
    from .topic import Topic


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text, validate=True)))


def checked_schema(text: object, where: str) -> pa.Schema:
    """The Arrow schema ``text`` holds; :class:`CorruptLog` naming ``where`` if it holds none."""
    try:
        if not isinstance(text, str):
            raise TypeError(f"not a string: {text!r}")
        return schema_from_text(text)
    except (pa.ArrowException, binascii.Error, ValueError, TypeError, OSError) as e:
        raise CorruptLog(f"{where}: the topic's schema is malformed: {e}") from None

_CHAINS: tuple[tuple[pa.DataType, ...], ...] = (
    (pa.int8(), pa.int16(), pa.int32(), pa.int64()),
    (pa.float16(), pa.float32(), pa.float64()),
)
WIDENINGS = ("int8 → int16 → int32 → int64, float16 → float32 → float64, or a decimal's "
             "precision up at the same scale")
ALLOWED = f"add a nullable column; widen {WIDENINGS}; make a column nullable"


def loose_type(t: pa.DataType) -> pa.DataType:
    """``t`` with nested nullability and time zones erased: types equal under this are the
    same data (a time zone only says how instants are shown) and convert by a cast."""
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit, tz="UTC" if t.tz else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = loose_type(t.value_type)
        return pa.list_(inner) if pa.types.is_list(t) else pa.large_list(inner)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, loose_type(t.field(i).type))
                          for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(loose_type(t.key_type), loose_type(t.item_type))
    return t


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of type ``old`` is a value of ``new``, by an allowed widening
    (not when they are the same type)."""
    for chain in _CHAINS:
        if old in chain and new in chain:
            return chain.index(new) > chain.index(old)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        return old.scale == new.scale and new.precision > old.precision
    return False


def _same(old: pa.DataType, new: pa.DataType) -> bool:
    return loose_type(old).equals(loose_type(new))


_LARGE = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary()}


def readable_as(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether a chunk's column of type ``old`` reads as the topic's ``new``: the same data,
    an allowed widening, or the large variant of a string or binary type (older writers)."""
    if _same(old, new) or widens(old, new):
        return True
    return any({old, new} == {small, large} for small, large in _LARGE.items())


def problems(old: pa.Schema, new: pa.Schema) -> list[str]:
    """What makes ``new`` not an allowed evolution of ``old``: one line per column, naming
    it and the rule broken (empty when allowed, or when the schemas are the same)."""
    out = []
    names = new.names
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        out.append(f"column(s) {', '.join(map(repr, dup))} appear more than once")
    kept = [n for n in names if n in old.names]
    for f in old:
        if f.name not in names:
            out.append(f"column {f.name!r} ({f.type}) is gone: a column is never dropped or "
                       "renamed")
    if not out and kept != [n for n in old.names if n in kept]:
        out.append(f"the columns {old.names} change their order to {kept}: a column never "
                   "moves (new ones may go anywhere)")
    for f in new:
        if f.name not in old.names:
            if not f.nullable:
                out.append(f"new column {f.name!r} ({f.type}) is not nullable: chunks written "
                           "before it have no values for it, so it must be nullable")
            continue
        was = old.field(f.name)
        if _same(was.type, f.type) and pa.types.is_nested(f.type) and \
                not was.type.equals(f.type):
            out.append(f"column {f.name!r} changes its nested type {was.type} → {f.type}: a "
                       "nested type never changes")
        elif not _same(was.type, f.type) and not widens(was.type, f.type):
            rule = ("a type never narrows" if widens(f.type, was.type) else
                    f"a type only widens, {WIDENINGS}")
            out.append(f"column {f.name!r} changes type {was.type} → {f.type}: {rule}")
        if was.nullable and not f.nullable:
            out.append(f"column {f.name!r} becomes non-null: chunks written before may hold "
                       "nulls, so a nullable column stays nullable")
    return out


def check(old: pa.Schema, new: pa.Schema, topic: str) -> None:
    """:class:`SchemaMismatch` naming every problem when ``new`` is not an allowed
    evolution of topic ``topic``'s schema ``old``."""
    found = problems(old, new)
    if found:
        raise SchemaMismatch(f"topic {topic!r} cannot change its schema that way: "
                             + "; ".join(found) + f" (allowed: {ALLOWED})")


def changes(old: pa.Schema, new: pa.Schema,
            type_name: Callable[[pa.DataType], str] = str) -> list[str]:
    """The changes from ``old`` to ``new`` (an allowed evolution), one phrase each, as
    ``pafka describe`` and a stopped query say them (types named by ``type_name``)."""
    out = []
    for f in new:
        if f.name not in old.names:
            out.append(f"added {f.name} {type_name(f.type)}")
            continue
        was = old.field(f.name)
        if not _same(was.type, f.type):
            out.append(f"widened {f.name} {type_name(was.type)} → {type_name(f.type)}")
        if not was.nullable and f.nullable:
            out.append(f"made {f.name} nullable")
    return out


def merge(have: pa.Schema, data: pa.Schema, topic: str) -> pa.Schema:
    """The topic's schema ``have`` grown to take data of schema ``data`` (Delta's
    ``mergeSchema``): the data's new columns, nullable, after the topic's; its wider types
    where a widening allows them. A column the data lacks stays (written as nulls, so it
    becomes nullable). Returns ``have`` itself when the data fits it already;
    :class:`SchemaMismatch` when no allowed evolution takes the data."""
    fields = []
    for f in have:
        if f.name not in data.names:
            fields.append(f.with_nullable(True))
            continue
        got = data.field(f.name)
        t = got.type if widens(f.type, got.type) else f.type
        if not _same(t, got.type) and not widens(got.type, t):
            raise SchemaMismatch(f"data written to topic {topic!r} has column {f.name!r} as "
                                 f"{got.type}, which the topic's {f.type} cannot take or "
                                 f"widen to (allowed: {ALLOWED})")
        # A nullable DataFrame column (Spark's usually are) leaves NOT NULL as it is: a write
        # holding nulls there is refused then, as without mergeSchema.
        fields.append(pa.field(f.name, t, f.nullable, f.metadata))
    fields += [pa.field(f.name, f.type, True, f.metadata) for f in data
               if f.name not in have.names]
    merged = pa.schema(fields, metadata=have.metadata)
    if merged.equals(have, check_metadata=True):
        return have
    check(have, merged, topic)
    return merged


def selected(schema: pa.Schema, columns: object, what: str) -> tuple[str, ...]:
    """``columns`` (names of ``schema``'s columns, each once), checked: :class:`InvalidArgument`
    naming ``what`` and the columns there are otherwise."""
    if not isinstance(columns, list | tuple) or not all(isinstance(c, str) for c in columns):
        raise InvalidArgument(f"{what}: give the columns as a list of names, got {columns!r}")
    names = tuple(columns)
    unknown = [c for c in names if c not in schema.names]
    if unknown or not names or len(set(names)) != len(names):
        why = f"no column(s) {', '.join(map(repr, unknown))}" if unknown else \
            "no column named" if not names else "a column named twice"
        raise InvalidArgument(f"{what}: {why}; the columns are {', '.join(schema.names)}")
    return names


def history(topic: Topic) -> list[tuple[int, int, pa.Schema]]:
    """``schema_history``: (version, commit time in ms, schema) of the schema the topic was
    created with and of each change since, oldest first."""
    where = f"topic {topic.name!r}"
    return [(v, ts, checked_schema(text, where)) for v, ts, text in topic.state().schemas]


class Adapter:
    """Reads batches of schema ``source`` (an older schema of the topic) as ``target``."""

    def __init__(self, source: pa.Schema, target: pa.Schema):
        self.source, self.target = source, target
        # Per target column: its index in the source (-1: added since) and whether to cast.
        self._plan = [(source.get_field_index(f.name), f.type) for f in target]
        self._casts = [i >= 0 and not source.field(i).type.equals(t) for i, t in self._plan]
        self.identity = source.equals(target, check_metadata=False)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.identity:
            return batch
        n = batch.num_rows
        cols = [pa.nulls(n, t) if i < 0 else
                batch.column(i).cast(t) if cast else batch.column(i)
                for (i, t), cast in zip(self._plan, self._casts, strict=True)]
        return pa.RecordBatch.from_arrays(cols, schema=self.target)
