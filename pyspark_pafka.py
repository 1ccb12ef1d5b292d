"""Discovery shim: Spark imports top-level ``pyspark_*`` modules that define ``DefaultSource``
and registers each under its ``name()``, so ``format("pafka")`` works with no call."""

from pafka_source.source import PafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
