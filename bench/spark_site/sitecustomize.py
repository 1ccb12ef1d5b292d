"""Installs the benchmark's simulated HDD in every Python process Spark starts.

Only ``bench/tiering_spark.py`` puts this directory on ``PYTHONPATH`` (Spark passes it on to
its Python workers) and sets ``PAFKA_BENCH_HDD`` to ``<bucket file>:<bytes per second>``.
"""

import os
import sys

_spec = os.environ.get("PAFKA_BENCH_HDD")
if _spec:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tiering_bench import install_throttle

    _path, _rate = _spec.rsplit(":", 1)
    install_throttle(_path, float(_rate), None)
