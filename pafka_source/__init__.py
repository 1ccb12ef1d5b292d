"""Pafka for Spark: the ``pafka`` data source (streaming and batch source and sink).

``format("pafka")`` works with no call (Spark discovers the ``pyspark_pafka`` module);
:func:`register` registers it explicitly. The command line and the tier store work without
PySpark: Spark parts are imported when used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def register(spark: Any) -> None:
    """Register the ``pafka`` format with a SparkSession."""
    from .source import PafkaDataSource
    spark.dataSource.register(PafkaDataSource)


__all__ = ["__version__", "register"]
