"""Pafka for Spark: the ``pafka`` data source (streaming and batch source and sink).

``format("pafka")`` works with no call (Spark discovers the ``pyspark_pafka`` module);
:func:`register` registers it explicitly. The command line and the tier store work without
PySpark: Spark parts are imported when used.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from typing import Any

__version__ = "0.1.0"

log = logging.getLogger(__name__)
_warned = False


def _check_worker_python() -> None:
    """Warn when Spark's Python workers would run another interpreter than this one.

    Spark starts them as ``PYSPARK_PYTHON``, else ``python3`` from ``PATH``. If that one lacks
    pyspark and pafka, ``format("pafka")`` fails with ``DATA_SOURCE_NOT_FOUND``, which names
    neither cause; this says which Python runs and what to set."""
    global _warned
    if _warned or os.environ.get("PYSPARK_PYTHON"):
        return
    found = shutil.which("python3")
    if found is not None and os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    log.warning("PYSPARK_PYTHON is not set, so Spark's Python workers run %s, not this Python "
                "(%s). If it lacks pyspark and pafka, format('pafka') fails with "
                "DATA_SOURCE_NOT_FOUND. Set PYSPARK_PYTHON=%s before the SparkSession starts.",
                found or "python3 (not on PATH)", sys.executable, sys.executable)
    _warned = True


#: Spark settings for jobs that write with pafka, for ``SparkSession.builder.config(map=...)``
#: or ``spark-submit --conf``. With ``spark.sql.execution.arrow.maxBytesPerBatch`` at its
#: largest value Spark stops measuring the Arrow batch it sends to a Python writer after every
#: row (a walk over all the batch's vectors, about half of the JVM's work in a pafka write);
#: batches stay capped at ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by
#: default; keep it positive), so only a column of more than 200 KB per row on average could
#: reach Arrow's 2 GB limit on a column's values in one batch. The
#: setting applies to every Arrow-based Python function of the session (``mapInArrow``, pandas
#: UDFs), which it speeds up the same way.
#: ``spark.sql.python.filterPushdown.enabled`` lets a batch read with ``pushFilters=true`` take
#: the filters of its query (PySpark 4.1+; older versions ignore the key).
#: ``spark.sql.execution.pyspark.udf.hideTraceback.enabled`` shows a failing read or write as
#: its error alone (two lines: pafka's errors name what is wrong), not under 8 to 17 lines of
#: Python traceback. It applies to the session's Python UDFs too; unset it to debug one.
_SPARK_CONF: dict[str, str] = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
                               "spark.sql.python.filterPushdown.enabled": "true",
                               "spark.sql.execution.pyspark.udf.hideTraceback.enabled": "true"}


def __getattr__(name: str) -> Any:
    # SPARK_CONF is read where a session is about to start: the moment to check which Python
    # its workers will run (the command line, which imports this package, never reads it).
    if name == "SPARK_CONF":
        _check_worker_python()
        return dict(_SPARK_CONF)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(spark: Any) -> None:
    """Register the ``pafka`` format with a SparkSession."""
    from .source import PafkaDataSource
    spark.dataSource.register(PafkaDataSource)


def start_migration(spark: Any, root: str, config: dict[str, Any] | None = None) -> Any:
    """Run the migration service of the existing store at ``root`` as a thread of this
    driver program; it stops when the SparkSession stops (or with ``.stop()``). A root
    without a store is :class:`tier_store.StoreNotFound`, not a new empty store."""
    import threading

    from migration import MigrationService
    from tier_store import Store

    service = MigrationService(Store.open(root, config, create=False)).start()

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


def track_groups(spark: Any) -> Any:
    """Record each streaming query's consumer-group position as its micro-batches end (a
    listener on the driver); see :mod:`pafka_source.groups`."""
    from .groups import track_groups as track
    return track(spark)


def track_lag(spark: Any) -> Any:
    """Measure each streaming query's pafka sources after every micro-batch: records and
    bytes behind the latest offsets, and the share of the batch on tier 1 (a listener on the
    driver); returns the :class:`~pafka_source.progress.LagTracker`. See
    :mod:`pafka_source.progress`."""
    from .progress import track_lag as track
    return track(spark)


__all__ = ["SPARK_CONF", "__version__", "register", "start_migration", "track_groups",
           "track_lag"]
