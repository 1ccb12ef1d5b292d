"""The ``pafka`` data source for Spark.

Read::

    spark.readStream.format("pafka").option("topic", "clicks").load(root)
    spark.read.format("pafka").option("topic", "clicks").load(root)

Source options: ``topic`` | ``subscribe`` | ``subscribePattern``; ``startingOffsets``
(earliest | latest | JSON, -2/-1), ``startingTimestamp``, ``startingOffsetsByTimestamp``,
``endingOffsets`` (batch); ``failOnDataLoss``; ``includeMetadata``; ``maxOffsetsPerTrigger``
(``maxRecordsPerTrigger``), ``maxBytesPerTrigger``, ``minOffsetsPerTrigger`` with
``maxTriggerDelay``; ``minPartitions``, ``maxRecordsPerPartition``; ``consumerGroup``;
``verifyChecksums``.

Write::

    df.writeStream.format("pafka").option("topic", "clicks")
      .option("checkpointLocation", ckpt).start(root)
    df.write.format("pafka").option("topic", "clicks").mode("append").save(root)

Sink options: ``topic``, ``key``, ``partitions`` (for a new topic), ``compression``,
``timestampColumn``, ``writerId``. Both sides accept store configuration keys and
``pafka.config`` (a ``.properties`` file).
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from tier_store import PafkaError, SchemaMismatch, TopicExists
from tier_store.layout import check_topic_name
from tier_store.topic import loose_type

from .options import SinkOptions, SourceOptions, check_option_names
from .reader import PafkaBatchReader, PafkaStreamReader, resolve_topics
from .types import spark_schema, topic_schema_from_spark
from .writer import PafkaBatchWriter, PafkaStreamWriter, open_store


class PafkaDataSource(DataSource):
    __doc__ = __doc__

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        # Spark builds the source when a query is defined (load/start), but asks for its
        # stream writer only when the first micro-batch runs: check what can be checked now.
        check_option_names(options)

    @classmethod
    def name(cls) -> str:
        return "pafka"

    def schema(self) -> StructType:
        opts = SourceOptions.parse(self.options)
        store = open_store(opts.root, opts.config)
        topics = resolve_topics(store, opts)
        return spark_schema(topics[0].schema, opts.include_metadata)

    def _source_options(self, schema: StructType) -> SourceOptions:
        opts = SourceOptions.parse(self.options)
        expected = self.schema()
        if schema != expected:
            raise PafkaError(f"a pafka source has the topic's schema; do not set another with "
                             f".schema(): expected {expected.simpleString()}, got "
                             f"{schema.simpleString()}")
        return opts

    def reader(self, schema: StructType) -> PafkaBatchReader:
        return PafkaBatchReader(self._source_options(schema), schema)

    def streamReader(self, schema: StructType) -> PafkaStreamReader:
        return PafkaStreamReader(self._source_options(schema), schema)

    def _prepare_sink(self, schema: StructType) -> tuple[SinkOptions, pa.Schema, int]:
        opts = SinkOptions.parse(self.options)
        check_topic_name(opts.topic)
        wanted = topic_schema_from_spark(schema)
        for col, what in ((opts.key, "key"), (opts.timestamp_column, "timestampColumn")):
            if col is not None and col not in wanted.names:
                raise PafkaError(f"option {what!r}: column {col!r} is not in the DataFrame "
                                 f"(columns: {wanted.names})")
        store = open_store(opts.root, opts.config)
        if opts.topic not in store.topics():
            try:
                store.create_topic(opts.topic, wanted, partitions=opts.partitions)
            except TopicExists:
                pass
        topic = store.topic(opts.topic)
        have = topic.schema
        h = {f.name: loose_type(f.type) for f in have}
        w = {f.name: loose_type(f.type) for f in wanted}
        if h != w:
            diff = [f"missing column {n!r}" for n in h if n not in w]
            diff += [f"unexpected column {n!r}" for n in w if n not in h]
            diff += [f"column {n!r}: topic has {have.field(n).type}, DataFrame has "
                     f"{wanted.field(n).type}" for n in h if n in w and h[n] != w[n]]
            raise SchemaMismatch(f"cannot write to topic {opts.topic!r}: " + "; ".join(diff))
        return opts, have, topic.partitions

    def writer(self, schema: StructType, overwrite: bool) -> PafkaBatchWriter:
        if overwrite:
            raise PafkaError("a pafka topic is an append-only log: use mode('append'), not "
                             "overwrite")
        return PafkaBatchWriter(*self._prepare_sink(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> PafkaStreamWriter:
        if overwrite:
            raise PafkaError("a pafka topic is an append-only log: use outputMode('append')")
        return PafkaStreamWriter(*self._prepare_sink(schema))
