"""Installs the benchmark's simulated HDD in every Python process Spark starts.

Only ``bench/tiering_spark.py`` puts this directory on ``PYTHONPATH`` (Spark passes it on to
its Python workers) and sets ``PAFKA_BENCH_HDD`` to ``<bucket file>:<bytes per second>:<tier
numbers>``: those tiers are charged while the driver's selection file names them.
"""

import os
import sys

_spec = os.environ.get("PAFKA_BENCH_HDD")
if _spec:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tiering_bench import install_throttle

    _path, _rate, _tiers = _spec.rsplit(":", 2)
    install_throttle(_path, float(_rate), [int(n) for n in _tiers.split(",") if n],
                     follow_selection=True)
