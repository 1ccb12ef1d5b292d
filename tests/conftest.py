"""Shared fixtures: real stores on real directories (tmp on disk, /dev/shm for pmem)."""

from __future__ import annotations

import os
import shutil
import sys
import uuid

import numpy as np
import pyarrow as pa
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.string())])


def make_batch(start: int, n: int, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    keys = np.arange(start, start + n, dtype=np.int64)
    return pa.record_batch([pa.array(keys), pa.array(keys * 10),
                            pa.array([f"v{k}" for k in keys])], schema=schema)


@pytest.fixture
def shm_dir():
    """A fresh directory on /dev/shm (RAM), removed afterwards."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    if base is None:
        pytest.skip("no /dev/shm")
    d = os.path.join(base, f"pafka-test-{uuid.uuid4().hex[:10]}")
    os.makedirs(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def file_store(tmp_path):
    from tier_store import Store
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    yield s
    s.close()


@pytest.fixture
def tiered_store(tmp_path, shm_dir):
    from tier_store import Store
    s = Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
        "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
        "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0,
    })
    yield s
    s.close()


def read_all(topic, partition: int, start: int = 0, end: int | None = None) -> list[int]:
    out: list[int] = []
    for b in topic.read(partition, start, end):
        out.extend(b.column("key").to_pylist())
    return out


@pytest.fixture(scope="session")
def spark():
    """One real SparkSession (local[2]) for the whole test session."""
    os.environ.setdefault("PYSPARK_PYTHON", PYTHON)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master("local[2]").appName("pafka-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
