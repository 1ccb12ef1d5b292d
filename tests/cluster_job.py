"""A Spark driver on the simulated hosts' cluster, run in its own process by ``run``.

    python -m tests.cluster_job TARGET ARGS...

``TARGET`` is ``package.module:function`` or ``path/to/file.py:function``; the function is
called as ``function(spark, *ARGS)`` and returns a JSON value, printed on a line of its own
after ``RESULT_TAG``. The session comes from the environment ``SimulatedHosts.run_driver``
sets (``PAFKA_CLUSTER_CONF``: the Spark configuration as JSON; ``PAFKA_CLUSTER_EXECUTORS``:
how many executors to wait for before the job starts, so that tasks spread over every host).

``probe`` is a target of its own: what each task sees of its host.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

RESULT_TAG = "PAFKA_CLUSTER_RESULT "
APP_TAG = "PAFKA_CLUSTER_APP "


class ClusterJobError(RuntimeError):
    """A driver failed or timed out (its output and its executors' logs included)."""

    def __init__(self, message: str, work_dir: str = "") -> None:
        super().__init__(message)
        self.work_dir = work_dir  # the workers' directory of the app (removed by then)


def _target(spec: str) -> Callable[..., Any]:
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ClusterJobError(f"{spec!r}: expected module:function or file.py:function")
    if where.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("pafka_cluster_target", where)
        if module_spec is None or module_spec.loader is None:
            raise ClusterJobError(f"{where}: not a Python file")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ClusterJobError(f"{spec}: {where} has no function {name!r}")
    return fn


def session(wait: float = 90.0):
    """The SparkSession of ``PAFKA_CLUSTER_CONF``, once all its executors registered."""
    spark = _build()
    wait_executors(spark, wait)
    return spark


def _build():
    from pyspark.sql import SparkSession
    builder = SparkSession.builder.appName("pafka-cluster-job")
    for key, value in json.loads(os.environ["PAFKA_CLUSTER_CONF"]).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wait_executors(spark, wait: float = 90.0) -> None:
    """Until ``PAFKA_CLUSTER_EXECUTORS`` executors registered, or ClusterJobError."""
    want = int(os.environ.get("PAFKA_CLUSTER_EXECUTORS", "0"))
    deadline = time.monotonic() + wait
    while len(executors(spark)) < want:
        if time.monotonic() > deadline:
            raise ClusterJobError(f"only {executors(spark)} of {want} executors registered in "
                                  f"{wait:.0f} s")
        time.sleep(0.1)
    return spark


def executors(spark) -> list[str]:
    """``host:port`` of each executor (the driver left out), from Spark's status tracker."""
    sc = spark.sparkContext
    driver = sc.getConf().get("spark.driver.host")
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    # The driver's own block manager is listed too.
    return [f"{e.host()}:{e.port()}" for e in infos if e.host() != driver]


def probe(spark, tier1: str, partitions: str = "4") -> dict[str, Any]:
    """Per task: its host id, hostname, the file ``whoami`` in its tier 1, its /dev/shm."""
    def look(_rows):
        import socket
        seen = None
        with contextlib.suppress(FileNotFoundError), open(os.path.join(tier1, "whoami")) as f:
            seen = f.read().strip()
        yield {"host_id": os.environ.get("PAFKA_HOST_ID"), "hostname": socket.gethostname(),
               "tier1": seen, "shm": sorted(os.listdir("/dev/shm")), "pid": os.getpid()}
    sc = spark.sparkContext
    n = int(partitions)
    tasks = sc.parallelize(range(n), n).mapPartitions(look).collect()
    status = sc._jsc.sc().getExecutorMemoryStatus().keys().mkString(",").split(",")
    return {"tasks": tasks, "executors": executors(spark), "memory_status": sorted(status)}


def hang(spark, seconds: str = "600") -> None:
    """Tasks that sleep on every executor (a driver to kill mid-job)."""
    def nap(_rows):
        time.sleep(float(seconds))
        yield 0
    print("PAFKA_CLUSTER_HANGING", flush=True)
    spark.sparkContext.parallelize(range(2), 2).mapPartitions(nap).collect()


def run(target: str, args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run the driver; {"value", "app_id", "startup_s", "job_s", "wall_s"}. Its process group
    is killed when it ends in any way (executors included: the worker starts them in it)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "tests.cluster_job", target, *args],
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(p.pid)
        out, err = p.communicate()
        err += f"\n[killed after {timeout:.0f} s]"
    finally:
        _kill_group(p.pid)
    app = next((json.loads(line[len(APP_TAG):]) for line in out.splitlines()
                if line.startswith(APP_TAG)), {})
    result = next((json.loads(line[len(RESULT_TAG):]) for line in out.splitlines()
                   if line.startswith(RESULT_TAG)), None)
    work = app.get("work_dir", "")
    logs = _executor_logs(work) if result is None else ""
    if work.endswith(f"/work/{app.get('app_id')}"):  # the worker's directory of this app
        shutil.rmtree(work, ignore_errors=True)
    if result is None:
        raise ClusterJobError(f"driver {target} {args} failed (exit {p.returncode}):\n"
                              f"{err[-3000:]}\n{logs}", work)
    return {**result, **app, "wall_s": time.monotonic() - t0}


def _kill_group(pgid: int, wait: float = 30.0) -> None:
    """SIGKILL the group until none of it is left (a dying worker may still launch one)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise ClusterJobError(f"process group {pgid} still alive {wait:.0f} s after SIGKILL")


def _executor_logs(work: str, lines: int = 20) -> str:
    out = []
    for root, _dirs, files in os.walk(work) if work else ():
        for name in files:
            with contextlib.suppress(OSError), open(os.path.join(root, name),
                                                    errors="replace") as f:
                out.append(f"--- {root}/{name}\n" + "".join(f.readlines()[-lines:]))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m tests.cluster_job module:function ARGS...\n")
        return 2
    fn = _target(argv[0])
    t0 = time.monotonic()
    spark = _build()
    sc = spark.sparkContext
    spark_home = os.environ.get("SPARK_HOME") or os.path.dirname(
        __import__("pyspark").__file__)
    print(APP_TAG + json.dumps({"app_id": sc.applicationId, "work_dir": os.path.join(
        spark_home, "work", sc.applicationId)}), flush=True)
    wait_executors(spark)
    t1 = time.monotonic()
    value = fn(spark, *argv[1:])
    t2 = time.monotonic()
    print(RESULT_TAG + json.dumps({"value": value, "startup_s": round(t1 - t0, 3),
                                   "job_s": round(t2 - t1, 3)}), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
