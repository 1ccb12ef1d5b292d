"""The ``pafka`` data source for Spark.

Read::

    spark.readStream.format("pafka").option("topic", "clicks").load(root)
    spark.read.format("pafka").option("topic", "clicks").load(root)

Source options: ``topic`` | ``subscribe`` | ``subscribePattern``; ``startingOffsets``
(earliest | latest | group | JSON, -2/-1), ``startingTimestamp``, ``startingOffsetsByTimestamp``,
``endingOffsets`` (batch); ``failOnDataLoss``; ``includeMetadata``; ``maxOffsetsPerTrigger``
(``maxRecordsPerTrigger``), ``maxBytesPerTrigger``, ``minOffsetsPerTrigger`` with
``maxTriggerDelay``; ``minPartitions``, ``maxRecordsPerPartition``; ``consumerGroup`` (a
streaming query records its position under it; ``startingOffsets=group`` starts a new query,
or a batch read, from the group's committed offsets); ``verifyChecksums``.

Start a new query where a consumer group stands (Kafka users reset the group with
kafka-consumer-groups; here ``pafka groups ROOT TOPIC --group G --reset-to ... --execute``)::

    spark.readStream.format("pafka").option("topic", "clicks")
      .option("consumerGroup", "billing").option("startingOffsets", "group").load(root)

Write::

    df.writeStream.format("pafka").option("topic", "clicks")
      .option("checkpointLocation", ckpt).start(root)
    df.write.format("pafka").option("topic", "clicks").mode("append").save(root)

Sink options: ``topic``, ``key``, ``partitions`` (for a new topic), ``compression``,
``timestampColumn``, ``writerId``. Both sides accept store configuration keys and
``pafka.config`` (a ``.properties`` file).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader
from pyspark.sql.types import StructType

from tier_store import (
    InvalidArgument,
    PafkaError,
    SchemaMismatch,
    TopicExists,
    check_topic_name,
    hash_keys,
    loose_type,
    merge_schemas,
)

from .handles import open_store, store_to_read
from .offsets import check_offset_options
from .options import SinkOptions, SourceOptions
from .planning import read_schema, resolve_topics
from .reader import (
    FailedStreamReader,
    PafkaBatchReader,
    PafkaFilteringBatchReader,
    PafkaStreamReader,
)
from .types import spark_schema, topic_schema_from_spark
from .writer import PafkaBatchWriter, PafkaStreamWriter

log = logging.getLogger(__name__)


class PafkaDataSource(DataSource):
    __doc__ = __doc__

    # Options are checked where Spark says which side it wants: schema() at load(), reader(),
    # streamReader(), writer() and streamWriter(). The constructor cannot tell a read from a
    # write, and runs no earlier than they do: at load() with schema() (not at all there when
    # the user sets .schema(...)), and with the writer at save() or a stream's first batch.

    @classmethod
    def name(cls) -> str:
        return "pafka"

    def _open_source(self) -> tuple[SourceOptions, StructType]:
        """Options, checked against the store, and the schema they read."""
        opts = SourceOptions.parse(self.options)
        store = store_to_read(opts.root, opts.config)
        topics = resolve_topics(store, opts)
        check_offset_options(topics, opts)
        return opts, spark_schema(read_schema(topics[0], opts), opts.include_metadata)

    def schema(self) -> StructType:
        return self._open_source()[1]

    def _source_options(self, schema: StructType) -> SourceOptions:
        opts, expected = self._open_source()
        if schema != expected:
            raise InvalidArgument(f"a pafka source has the topic's schema; do not set another with "
                                  f".schema() (or the topic's schema changed since load(): load "
                                  f"it again): expected {expected.simpleString()}, got "
                                  f"{schema.simpleString()}")
        return opts

    def reader(self, schema: StructType) -> PafkaBatchReader:
        opts = self._source_options(schema)
        if opts.push_filters:
            return PafkaFilteringBatchReader(opts, schema)
        return PafkaBatchReader(opts, schema)

    def __getstate__(self) -> dict[str, Any]:
        # Spark's planner tells its Python workers to hide tracebacks (SPARK_HIDE_TRACEBACK,
        # from spark.sql.execution.pyspark.udf.hideTraceback.enabled); its streaming runner
        # is not told. The planner pickles this source for the runner: the setting goes along.
        state = dict(self.__dict__)
        state.setdefault("_hide_traceback", bool(os.environ.get("SPARK_HIDE_TRACEBACK")))
        return state

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.__dict__.get("_hide_traceback"):
            # This process serves this reader alone: its errors become one line, as in batch.
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
        try:
            return PafkaStreamReader(self._source_options(schema), schema)
        except Exception as e:  # noqa: BLE001 - raised again from the reader's first call
            return FailedStreamReader(e)

    def _prepare_sink(self, schema: StructType) -> tuple[SinkOptions, pa.Schema, int]:
        opts = SinkOptions.parse(self.options)
        check_topic_name(opts.topic)
        wanted = topic_schema_from_spark(schema)
        check_sink_columns(opts, wanted)
        store = open_store(opts.root, opts.config)
        if opts.topic not in store.topics():
            try:
                store.create_topic(opts.topic, wanted, partitions=opts.partitions)
            except TopicExists:
                pass
        topic = store.topic(opts.topic)
        have = topic.schema
        if opts.merge_schema:
            # The DataFrame's columns the topic lacks are added, wider types widen it; those
            # it lacks are written as nulls. Anything else is refused, naming the column.
            merged = merge_schemas(have, wanted, opts.topic)
            if merged is not have:
                have = topic.evolve(merged)
            check_partitions_option(opts, topic.partitions)
            return opts, have, topic.partitions
        h = {f.name: loose_type(f.type) for f in have}
        w = {f.name: loose_type(f.type) for f in wanted}
        if h != w:
            diff = [f"missing column {n!r}" for n in h if n not in w]
            diff += [f"unexpected column {n!r}" for n in w if n not in h]
            diff += [f"column {n!r}: topic has {have.field(n).type}, DataFrame has "
                     f"{wanted.field(n).type}" for n in h if n in w and h[n] != w[n]]
            raise SchemaMismatch(f"cannot write to topic {opts.topic!r}: " + "; ".join(diff))
        check_partitions_option(opts, topic.partitions)
        return opts, have, topic.partitions

    def writer(self, schema: StructType, overwrite: bool) -> PafkaBatchWriter:
        if overwrite:
            raise InvalidArgument("a pafka topic is an append-only log: use mode('append'), not "
                                  "overwrite")
        prepared = self._prepare_sink(schema)
        if prepared[0].writer_id is not None:
            # A batch write is one atomic append with no batch id to replay: nothing for a
            # writer id to make idempotent.
            log.warning("option writerId only applies to streaming writes: ignored in a batch "
                        "write")
        return PafkaBatchWriter(*prepared)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PafkaStreamWriter:
        if overwrite:
            raise InvalidArgument("a pafka topic is an append-only log: use outputMode('append')")
        return PafkaStreamWriter(*self._prepare_sink(schema))


def check_sink_columns(opts: SinkOptions, wanted: pa.Schema) -> None:
    """What executors would find out only after the topic was created: the key and
    timestampColumn columns exist and have types the store takes, and a reader can read every
    column back."""
    for col, what in ((opts.key, "key"), (opts.timestamp_column, "timestampColumn")):
        if col is not None and col not in wanted.names:
            raise InvalidArgument(f"option {what!r}: column {col!r} is not in the DataFrame "
                                  f"(columns: {wanted.names})")
    if opts.key is not None:
        # The store's own hash decides (and words the error), on an empty probe of the type.
        hash_keys(pa.nulls(1, wanted.field(opts.key).type))
    if opts.timestamp_column is not None:
        t = wanted.field(opts.timestamp_column).type
        if not (pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_integer(t)):
            # The store's own words: it checks the same on executors when a chunk is written.
            raise InvalidArgument(f"timestamp column {opts.timestamp_column!r} must be a "
                                  "timestamp, "
                                  f"date or integer (milliseconds) column, not {t}")
    try:
        spark_schema(wanted, include_metadata=False)
    except PafkaError as e:
        raise InvalidArgument(f"cannot write to topic {opts.topic!r}: a read could not give the "
                              f"column back to Spark: {e}") from None


def check_partitions_option(opts: SinkOptions, partitions: int) -> None:
    """``partitions`` sizes a topic this write creates; it cannot resize one (a Kafka producer
    cannot either): a different count is an error rather than silently ignored."""
    if opts.partitions is not None and opts.partitions != partitions:
        raise InvalidArgument(f"option 'partitions' is {opts.partitions}, but topic {opts.topic!r} "
                              f"already exists with {partitions} partitions: the option only "
                              "sizes a "
                              "topic the write creates; remove it, or add partitions with "
                              "Topic.add_partitions()")
