"""Windows that only a loaded machine opens, widened on purpose so they open every time.

Spark waits 10 s (hard-coded) for a new Python worker to connect back. It starts each one
with pyspark.zip and the py4j zip first on ``PYTHONPATH``, and Python caches no bytecode
for a zip: without the bytecode ``.ci/setup`` adds to them, every worker compiled pyspark
again (about 1 s of CPU; 12 s to connect back beside two busy processes per core).

A move's temporary copy must be locked from the moment it exists: garbage collection with no
grace period reclaims any unlocked temporary file it lists. A loaded machine can stall the
mover between creating its copy and locking it; here an audit hook in the mover's process
sleeps before every ``flock`` that follows the creation of a copy, while another process runs
garbage collection in a tight loop.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tier_store import Store, check_topic

from .conftest import PYTHON, ROOT, read_all
from .support import fill, pmem_hdd_config

# Run in a child process: moves every sealed segment of topic "t" between tiers 1 and 2, and
# prints how many moves succeeded and the errors of the others, as JSON.
MOVER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from tier_store import PafkaError, Store

    stalled = []

    def stall(event, args):
        # The copy's name appears (created, or a pool file renamed to it): the next flock
        # of this thread waits, as a descheduled process would.
        if event in ("open", "os.rename"):
            name = str(args[1] if event == "os.rename" else args[0])
            if "/.tmp-move-" in name:
                stalled.append(True)
        elif event == "fcntl.flock" and stalled:
            stalled.clear()
            time.sleep({pause})

    store = Store.open({store!r})
    topic = store.topic("t")
    sys.addaudithook(stall)
    done, errors = 0, []
    for rnd in range({rounds}):
        for seg in [s for s in topic.segments() if s.sealed][:{segments}]:
            try:
                store.move_segment(seg.id, 2 if seg.tier == 1 else 1, topic="t")
                done += 1
            except PafkaError as e:
                errors.append(f"{{type(e).__name__}}: {{e}}")
    print(json.dumps({{"done": done, "errors": errors}}))
""")

# Run in a child process: garbage collection of topic "t" with no grace period, until killed.
COLLECTOR = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from tier_store import Store
    store = Store.open({store!r})
    topic = store.topic("t")
    print("ready", flush=True)
    while True:
        store.collect_garbage(topic)
""")


def _moves_beside_garbage_collection(root: str, rounds: int, segments: int,
                                     pause: float = 0.05) -> dict:
    collector = subprocess.Popen(
        [PYTHON, "-c", COLLECTOR.format(root=ROOT, store=root)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert collector.stdout is not None and collector.stdout.readline() == "ready\n"
        mover = subprocess.run(
            [PYTHON, "-c", MOVER.format(root=ROOT, store=root, rounds=rounds,
                                         segments=segments, pause=pause)],
            capture_output=True, text=True, timeout=300)
    finally:
        collector.kill()
        collector.wait()
    assert collector.returncode == -9, "the collector died on its own"
    assert mover.returncode == 0, mover.stderr[-3000:]
    return json.loads(mover.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["file", "pool"])
def test_garbage_collection_never_reclaims_a_copy_before_its_move_locks_it(
        tmp_path, shm_dir, kind):
    conf = {"log.segment.bytes": "64k", "log.cleanup.grace.ms": 0}
    if kind == "file":
        conf.update({"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
                     "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m"})
    else:
        conf = pmem_hdd_config(shm_dir, **conf)
    s = Store.open(tmp_path / "store", conf)
    fill(s, 60)
    s.close()
    got = _moves_beside_garbage_collection(str(tmp_path / "store"), rounds=4, segments=3)
    reclaimed = [e for e in got["errors"] if "reclaimed by garbage collection" in e]
    assert not reclaimed, f"{len(reclaimed)} of {got['done'] + len(got['errors'])} moves " \
                          f"lost their copy: {reclaimed[:2]}"
    assert got["done"] == 12, got["errors"][:3]
    fresh = Store.open(tmp_path / "store").topic("t")
    assert read_all(fresh, 0) == list(range(12_000))
    assert check_topic(fresh).ok


# What a data source planner worker imports before it connects back to Spark.
WORKER = textwrap.dedent("""
    import json, sys
    import pyspark.sql.worker.plan_data_source_read
    print(json.dumps(sorted(m.__file__ for m in list(sys.modules.values())
                            if getattr(m, "__file__", None) and ".zip/" in m.__file__)))
""")


def test_spark_python_workers_import_pyspark_without_compiling_it():
    from pyspark.find_spark_home import _find_spark_home
    lib = os.path.join(_find_spark_home(), "python", "lib")
    zips = sorted(glob.glob(os.path.join(lib, "*.zip")))
    assert any(z.endswith("pyspark.zip") for z in zips), zips
    # As PythonWorkerFactory starts a worker: Spark's zips first on the path.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(zips)
    proc = subprocess.run([PYTHON, "-c", WORKER], env=env, capture_output=True, text=True,
                          timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = json.loads(proc.stdout)
    assert files, "the worker imported nothing from Spark's zips"
    compiled = [f for f in files if f.endswith(".py")]
    assert not compiled, (f"{len(compiled)} of {len(files)} modules a Spark Python worker "
                          f"imports are compiled from source at every start, e.g. "
                          f"{compiled[:3]}; run .ci/setup (.ci/pyspark_bytecode.py)")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
