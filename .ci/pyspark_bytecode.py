"""Add bytecode to the zips Spark puts first on its Python workers' path (idempotent).

Spark starts each Python worker with ``$SPARK_HOME/python/lib/pyspark.zip`` and the py4j
zip in front of ``PYTHONPATH``, so a worker imports pyspark from the zip, not from the
installed package. The zips hold sources only, and Python cannot cache bytecode in a zip: every
worker compiles what it imports again (about 0.6 s of CPU for a data source planner). On a
loaded machine that pushes a new worker past the 10 s Spark waits for it to connect back.

This writes, beside each ``.py`` in those zips, the ``.pyc`` that ``zipimport`` looks for
(unchecked hash-based, so nothing is compared with the sources at import time; the zip is
rewritten whole, so they always match). A worker on another Python version sees another magic
number and compiles the source as before.

Usage: ``python .ci/pyspark_bytecode.py`` (with the venv's Python; prints what it did).
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import marshal
import os
import sys
import warnings
import zipfile

log = logging.getLogger("pyspark_bytecode")

STAMP = "pyspark-bytecode.txt"  # in the zip: the Python it was compiled for


def _pyc(source: bytes, filename: str) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the sources' own warnings (e.g. in pyspark's tests)
        code = compile(source, filename, "exec", dont_inherit=True)
    flags = 0b01  # hash-based, not checked against the source
    return (importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little")
            + importlib.util.source_hash(source) + marshal.dumps(code))


def add_bytecode(path: str) -> bool:
    """Rewrite the zip at ``path`` with a ``.pyc`` beside each ``.py``; False if it has them
    for this Python already."""
    tag = f"{sys.implementation.cache_tag} {importlib.util.MAGIC_NUMBER.hex()}"
    with zipfile.ZipFile(path) as z:
        if STAMP in z.namelist() and z.read(STAMP).decode() == tag:
            return False
        tmp = f"{path}.tmp-{os.getpid()}"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in z.infolist():
                if info.filename == STAMP or info.filename.endswith(".pyc"):
                    continue
                data = z.read(info)
                out.writestr(info, data)
                if info.filename.endswith(".py"):
                    try:
                        pyc = _pyc(data, os.path.join(path, info.filename))
                    except SyntaxError:
                        continue  # e.g. a template not meant to be imported
                    # Stored, not deflated: read by every worker at every start.
                    out.writestr(info.filename[:-3] + ".pyc", pyc, zipfile.ZIP_STORED)
            out.writestr(STAMP, tag)
    os.replace(tmp, path)
    return True


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        log.info("pyspark_bytecode: pyspark is not installed; nothing to do")
        return 0
    lib = os.path.join(os.path.dirname(spec.origin), "python", "lib")
    for path in sorted(glob.glob(os.path.join(lib, "*.zip"))):
        if add_bytecode(path):
            log.info("pyspark_bytecode: added bytecode to %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
