"""Pafka for Spark: the ``pafka`` data source (streaming and batch source and sink).

The Spark parts import PySpark lazily, so the command line and the tier store work without it.
"""

from __future__ import annotations

__version__ = "0.1.0"
