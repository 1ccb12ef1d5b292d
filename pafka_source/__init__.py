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


def start_migration(spark: Any, root: str, config: dict[str, Any] | None = None) -> Any:
    """Run the migration service of the store at ``root`` as a thread of this driver
    program; it stops when the SparkSession stops (or with ``.stop()``)."""
    import threading

    from migration import MigrationService
    from tier_store import Store

    service = MigrationService(Store.open(root, config)).start()

    def watch() -> None:
        # Poll the session: a data source has no hook for the driver's shutdown.
        while service.running:
            try:
                jsc = spark.sparkContext._jsc
                stopped = jsc is None or jsc.sc().isStopped()
            except Exception:
                stopped = True
            if stopped:
                service.stop()
                return
            threading.Event().wait(1.0)

    threading.Thread(target=watch, name="pafka-migration-watch", daemon=True).start()
    return service


__all__ = ["__version__", "register", "start_migration"]
