"""Helpers shared by several test files (fixtures every file gets live in conftest.py).

A file that needs other defaults keeps a short wrapper naming only what differs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from typing import Any

import pytest

from tier_store import MAPS, Store, Topic

from .conftest import PYTHON, ROOT, SCHEMA, make_batch


def record_fsyncs(monkeypatch) -> list[tuple[str, str]]:
    """(thread name, path) of every fsync and fdatasync from now on; each still runs."""
    calls: list[tuple[str, str]] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def recording(fd, real=real):
            calls.append((threading.current_thread().name, os.readlink(f"/proc/self/fd/{fd}")))
            return real(fd)
        monkeypatch.setattr(os, name, recording)
    return calls


def fds_on(path: str) -> int:
    """How many of this process's descriptors name ``path``; one closed by another thread
    while counting is not counted."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == path
        except FileNotFoundError:
            pass
    return n


def pmem_hdd_config(shm_dir: str, **extra: Any) -> dict[str, Any]:
    """A tiered store's configuration: a PMEM tier 1 of 1 MiB on ``shm_dir`` (16 pool files
    of 64 KiB segments), a disk tier 2; ``extra`` keys added or overriding."""
    return {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
            "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
            "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0, **extra}


def open_pmem_hdd(tmp_path, shm_dir: str, **extra: Any) -> Store:
    """A store at ``tmp_path/store`` configured by :func:`pmem_hdd_config`."""
    return Store.open(tmp_path / "store", pmem_hdd_config(shm_dir, **extra))


def fill(store: Store, n: int, per: int = 200, name: str = "t",
         partitions: int | None = None) -> Topic:
    """Create topic ``name`` (the store's default partition count unless ``partitions``) and
    append ``n`` batches of ``per`` rows with keys 0, 1, 2, ...; with ``partitions``, batch i
    goes to partition i % partitions."""
    t = store.create_topic(name, SCHEMA, partitions=partitions)
    for i in range(n):
        t.append(make_batch(i * per, per),
                 partition=None if partitions is None else i % partitions)
    return t


def fill_keyed(root, topic: str, n: int, partitions: int = 2, per_append: int = 1000,
               **conf: Any) -> tuple[Store, Topic]:
    """A store of 1 MiB segments at ``root`` (``conf`` added) with topic ``topic`` holding
    keys 0..n-1, appended ``per_append`` rows at a time, partitioned by the ``key`` column."""
    s = Store.open(root, {"log.segment.bytes": "1m", **conf})
    t = s.create_topic(topic, SCHEMA, partitions=partitions)
    for start in range(0, n, per_append):
        t.append(make_batch(start, min(per_append, n - start)), key="key")
    return s, t


def root_listing(root: str) -> list[str]:
    """What a store root holds: the names directly in a local root's directory, or every
    object key under an ``s3://`` root (endpoint and keys from the AWS variables)."""
    if root.startswith("s3://"):
        from tier_store.objects import ObjectStore
        return sorted(o.key for o in ObjectStore.open(root).list())
    return sorted(os.listdir(root))


def log_versions(topic: Topic) -> tuple[list[int], list[int]]:
    """The entry and checkpoint versions in ``topic``'s commit log, on any kind of root."""
    store = topic.log.commit_log.store
    return store.versions(), store.checkpoints()


def pafka(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the ``pafka`` command installed beside the tests' Python."""
    command = os.path.join(os.path.dirname(PYTHON), "pafka")
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=120)


def isolated_env(python: str) -> dict[str, str]:
    """The caller's environment without anything that could point Python at the repository,
    with Spark's Python workers on ``python``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYSPARK_DRIVER_PYTHON")}
    env["PYSPARK_PYTHON"] = python
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return env


@pytest.fixture(autouse=True)
def no_cached_maps():
    """Autouse where imported: no segment mapping cached by another test (a cached mapping
    pins its file) before or after each test."""
    MAPS.clear()
    yield
    MAPS.clear()


def can_unshare() -> bool:
    """Whether this process may give a child its own mount namespace (root, util-linux)."""
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def on_host(host: str, tier1: str, mount_at: str, argv: list[str],
            env: dict[str, str] | None = None, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as simulated host ``host``: in a mount namespace of its own where its tier-1
    directory ``tier1`` is mounted at ``mount_at`` (the path every host's tier 1 has), with
    ``PAFKA_HOST_ID=host``. From the repository root (``python -m tests....`` works)."""
    os.makedirs(tier1, exist_ok=True)
    os.makedirs(mount_at, exist_ok=True)
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", tier1, mount_at,
         *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
        env={**os.environ, **(env or {}), "PAFKA_HOST_ID": host})


def host_job(host: str, tier1: str, mount_at: str, *args: str) -> dict[str, Any]:
    """``tests/host_job.py`` run as host ``host`` (see :func:`on_host`); its JSON answer."""
    done = on_host(host, tier1, mount_at, [PYTHON, "-m", "tests.host_job", *args])
    assert done.returncode == 0, f"host {host}: {args[0]} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
