"""Shared fixtures: real stores on real directories (tmp on disk, /dev/shm for pmem), their
roots local or on a real S3 server (``store_root``: each test that takes it runs on both)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def settle() -> None:
    """Wait for the work commits left to the maintenance thread (checkpoints, garbage)."""
    from tier_store.maintenance import deferred
    assert deferred.wait(timeout=120), "maintenance still running after 120 s"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A test's checkpoints are written before its fixtures (S3 credentials, directories)
    are taken down: none runs into the next test."""
    yield
    settle()


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


class StoreRoot:
    """Where a test's store lives: a local directory, or an ``s3://`` prefix on the test
    server (``kind`` "local" or "s3"), with the tiers of an s3 root in ``tmp``.

    ``config(extra)`` is ``extra`` plus what the root needs: an object root holds no tier, so
    each tier the configuration names gets a local directory unless given, and the server's
    endpoint goes in ``storage.root.options``."""

    def __init__(self, kind: str, url: str, tmp: Path, options: dict[str, Any] | None = None):
        self.kind, self.url, self.tmp, self.options = kind, url, tmp, options

    def __repr__(self) -> str:
        return f"StoreRoot({self.kind}, {self.url})"

    @property
    def is_s3(self) -> bool:
        return self.kind == "s3"

    def config(self, extra: Mapping[str, Any] | None = None, **more: Any) -> dict[str, Any]:
        conf = {**(extra or {}), **more}
        if not self.is_s3:
            return conf
        from tier_store import StoreConfig, load_config
        from tier_store.config import canonical_key
        given = {canonical_key(k) for k in conf}
        for spec in StoreConfig(load_config(conf)).tiers(str(self.tmp / "tiers")):
            key = f"storage.tiers.{spec.number}.paths"
            if canonical_key(key) not in given:
                conf[key] = spec.path
        if self.options is not None and "storage.root.options" not in conf:
            conf["storage.root.options"] = json.dumps(self.options)
        return conf

    def open(self, extra: Mapping[str, Any] | None = None, **more: Any):
        """``Store.open`` of this root with :meth:`config`."""
        from tier_store import Store
        return Store.open(self.url, self.config(extra, **more))


@pytest.fixture(params=["local", "s3"])
def store_root(request, tmp_path) -> StoreRoot:
    """The store root of a test that runs on both kinds of root: ``tmp_path/store``, or a
    fresh prefix on the session's S3 server (its tiers under ``tmp_path``)."""
    if request.param == "local":
        return StoreRoot("local", str(tmp_path / "store"), tmp_path)
    url = request.getfixturevalue("s3_root")
    return StoreRoot("s3", url, tmp_path, {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})


@pytest.fixture
def file_store(store_root):
    """A store of 64 KiB segments on one file tier, on each kind of root."""
    s = store_root.open({"log.segment.bytes": "64k"})
    yield s
    s.close()


@pytest.fixture
def tiered_store(store_root, shm_dir):
    """A PMEM tier of 1 MiB on /dev/shm over a disk tier, on each kind of root."""
    s = store_root.open({
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


# -- a real S3 server: a one-node Ceph cluster with radosgw (tests/s3server.py) ------------------


@pytest.fixture(scope="session")
def s3_server():
    """The session's S3 server, stopped at the end (also when the run fails or is killed).

    PAFKA_S3_ENV=<file of ``export`` lines from ``python -m tests.s3server start DIR``> uses that
    running server instead (shared: its gateway cannot be stopped). Without the Ceph programs the
    tests that need it are skipped, unless PAFKA_REQUIRE_S3=1 (CI), which makes them fail.
    """
    from .s3server import S3Server, missing_binaries
    if os.environ.get("PAFKA_S3_ENV"):
        yield S3Server.from_env_file(os.environ["PAFKA_S3_ENV"])
        return
    missing = missing_binaries()
    if missing:
        reason = (f"no S3 test server: Ceph programs not found ({', '.join(missing)}); install "
                  "ceph-mon ceph-osd radosgw ceph-common (.ci/setup does)")
        if os.environ.get("PAFKA_REQUIRE_S3") == "1":
            pytest.fail(reason + " [PAFKA_REQUIRE_S3=1]", pytrace=False)
        pytest.skip(reason)
    yield from _private_server()


@pytest.fixture(scope="session")
def s3_own_server(s3_server):
    """An S3 server whose gateway this session may stop and start (outage tests): the session's
    server, or a private one when the session's is shared (PAFKA_S3_ENV)."""
    if s3_server.owned:
        yield s3_server
        return
    yield from _private_server()


def _private_server():
    """A cluster of this session's own, stopped at the end (atexit too, for a failed run)."""
    import atexit
    import tempfile

    from .s3server import S3Server
    # A short directory of its own: the daemons' Unix sockets must fit in 107 bytes.
    server = S3Server.start(tempfile.mkdtemp(prefix="pafka-ceph-"))
    atexit.register(server.close)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def s3_bucket(s3_server) -> str:
    """One bucket for the session's s3_root prefixes."""
    return s3_server.new_bucket()


def s3_env(server, monkeypatch) -> None:
    """Point boto3/s3fs at ``server`` through the standard AWS variables only."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def s3_root(s3_server, s3_bucket, monkeypatch) -> str:
    """A fresh, empty ``s3://<bucket>/<prefix>`` on the session's server, AWS variables set.

    A gateway left stopped by an earlier test is started again first."""
    if s3_server.owned:
        s3_server.start_gateway()
    s3_env(s3_server, monkeypatch)
    return f"s3://{s3_bucket}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_own_root(s3_own_server, monkeypatch) -> str:
    """Like s3_root, on s3_own_server (whose gateway the test may stop)."""
    s3_own_server.start_gateway()
    s3_env(s3_own_server, monkeypatch)
    bucket = s3_own_server.state.get("own_bucket") or s3_own_server.new_bucket()
    s3_own_server.state["own_bucket"] = bucket
    return f"s3://{bucket}/t-{uuid.uuid4().hex[:12]}"
