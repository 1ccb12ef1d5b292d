"""Mapping a topic's Arrow schema to Spark's types, and batches to what Spark expects.

Spark checks each batch a Python source yields against ``to_arrow_schema(schema,
timezone="UTC")`` exactly (types, nullability, column order). A topic written by Spark already
has those types; a topic written from Python may hold types Spark lacks (unsigned integers,
large strings, fixed-size binary, other time units), which are widened here, and cast at read.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from tier_store import InvalidArgument, PafkaError

METADATA_FIELDS = [
    pa.field("_topic", pa.string(), nullable=False),
    pa.field("_partition", pa.int32(), nullable=False),
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
]


def _spark_arrow_type(t: pa.DataType, where: str) -> pa.DataType:
    """The Arrow type Spark uses for the Spark type that ``t`` maps to."""
    if pa.types.is_dictionary(t):
        return _spark_arrow_type(t.value_type, where)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or \
            pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}.get(t.bit_width,
                                                                     pa.decimal128(20, 0))
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC") if t.tz else pa.timestamp("us")
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_decimal(t) and t.precision > 38:
        raise InvalidArgument(f"column {where}: {t} has more than 38 digits, which Spark cannot "
                              "hold")
    if pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        return pa.list_(_field(t.value_field, f"{where}[]"))
    if pa.types.is_struct(t):
        return pa.struct([_field(t.field(i), f"{where}.{t.field(i).name}")
                          for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_field(t.key_field, f"{where}.key").with_nullable(False),
                       _field(t.item_field, f"{where}.value"))
    if pa.types.is_duration(t):  # Spark's day-time interval
        return pa.duration("us")
    if pa.types.is_time(t) or pa.types.is_union(t) or pa.types.is_null(t):
        raise InvalidArgument(f"column {where}: Arrow type {t} has no Spark counterpart; write it "
                              "as another type (e.g. int64 microseconds)")
    return t


def _field(f: pa.Field, where: str) -> pa.Field:
    return pa.field(f.name, _spark_arrow_type(f.type, where), nullable=f.nullable)


def spark_schema(topic_schema: pa.Schema, include_metadata: bool) -> StructType:
    """The Spark schema a read of a topic produces."""
    fields = [_field(f, repr(f.name)) for f in topic_schema]
    if include_metadata:
        clash = [f.name for f in fields if f.name in {m.name for m in METADATA_FIELDS}]
        if clash:
            raise InvalidArgument(f"includeMetadata would add columns {clash} that the topic "
                                  "already has")
        fields += METADATA_FIELDS
    try:
        return from_arrow_schema(pa.schema(fields))
    except (TypeError, NotImplementedError) as e:
        raise InvalidArgument(f"the topic's schema cannot be read by Spark: {e}") from None


def target_arrow_schema(schema: StructType) -> pa.Schema:
    """Exactly what Spark checks yielded batches against."""
    return to_arrow_schema(schema, timezone="UTC")


def conform_batch(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """Cast a batch to ``target`` when it differs (free when it already matches)."""
    if batch.schema.equals(target):
        return batch
    if batch.schema.names != target.names:
        raise PafkaError(f"a read gave columns {batch.schema.names}, not the query's "
                         f"{target.names}: restart the query")
    cols = [batch.column(i).cast(target.field(i).type)
            if not batch.column(i).type.equals(target.field(i).type) else batch.column(i)
            for i in range(batch.num_columns)]
    return pa.RecordBatch.from_arrays(cols, schema=target)


def topic_schema_from_spark(schema: StructType) -> pa.Schema:
    """The Arrow schema of a topic created by a Spark write."""
    try:
        return to_arrow_schema(schema, timezone="UTC")
    except (TypeError, NotImplementedError) as e:
        raise InvalidArgument(f"the DataFrame's schema cannot be stored: {e}") from None
