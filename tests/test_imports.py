"""What importing the connector costs: every fresh Python process Spark starts for a query
(the planner, the streaming source's runner, each worker's first task) pays it."""

import subprocess

from .conftest import PYTHON, ROOT


def test_importing_the_connector_leaves_heavy_modules_for_when_they_are_used():
    code = ("import sys, pafka_source.source, pafka_source.reader, pafka_source.writer; "
            "print(sorted(m for m in ('pyarrow.compute', 'fsspec', 'cffi') if m in sys.modules))")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
