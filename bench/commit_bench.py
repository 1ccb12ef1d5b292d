"""Commit latency on a local root beside an ``s3://`` root, for ``store_bench.py``.

Each writer process opens the store, then appends one small chunk and commits it, again and
again, all to one topic. The commit (``Topic.commit``: put-if-absent of the next entry, plus
retries after lost races) is timed alone; commits/s counts all writers over the wall time.
Writers race for the same entry numbers, so more writers measure contention too.

The S3 server is the one the AWS variables name, or a private Ceph cluster that
``tests/s3server.py`` starts (``--s3 auto``, when Ceph is installed).
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import statistics
import sys
import time
import uuid
from typing import Any

import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from tier_store import Store  # noqa: E402

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.binary())])


def _writer(root: str, config: dict[str, Any], commits: int, start: Any, out: Any) -> None:
    store = Store.open(root, config)
    topic = store.topic("commits")
    batch = pa.record_batch([pa.array([1]), pa.array([b"x" * 100])], schema=SCHEMA)
    times = []
    start.wait()
    for _ in range(commits):
        refs = topic.write_chunks(batch, partition=0)
        t0 = time.perf_counter()
        topic.commit(refs)
        times.append(time.perf_counter() - t0)
    store.close()
    out.put(times)


def commit_latency(root: str, config: dict[str, Any], commits: int, writers: int) -> dict:
    """p50 and p99 of one commit (ms) and commits/s, ``writers`` processes racing on one
    topic for ``commits`` commits in all."""
    store = Store.open(root, config, create=True)
    store.create_topic("commits", SCHEMA, partitions=1)
    store.close()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(writers + 1), ctx.Queue()
    each = max(1, commits // writers)
    procs = [ctx.Process(target=_writer, args=(root, config, each, start, out))
             for _ in range(writers)]
    for p in procs:
        p.start()
    start.wait()
    t0 = time.perf_counter()
    times: list[float] = []
    for _ in procs:
        times.extend(out.get(timeout=600))
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"commit_bench: a writer exited with {p.exitcode}")
    with Store.open(root, config) as check:
        got = sum(check.topic("commits").latest_offsets().values())
    if got != each * writers:
        raise SystemExit(f"commit_bench: {got} records in the topic, {each * writers} committed")
    times.sort()
    return {"p50_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * times[min(len(times) - 1, int(0.99 * len(times)))],
            "per_s": len(times) / wall, "commits": len(times), "writers": writers}


def local_root(base: str) -> tuple[str, dict[str, Any]]:
    """A fresh local root under ``base`` and its configuration."""
    root = os.path.join(base, f"commits-{uuid.uuid4().hex[:8]}")
    return root, {"log.segment.bytes": "64m"}


def s3_root(base: str, url: str) -> tuple[str, dict[str, Any]]:
    """A fresh prefix under ``url`` with tier 1 in ``base``, and its configuration."""
    tier = os.path.join(base, f"tier-{uuid.uuid4().hex[:8]}")
    os.makedirs(tier)
    return f"{url.rstrip('/')}/commits-{uuid.uuid4().hex[:8]}", {
        "log.segment.bytes": "64m", "storage.tiers.types": "NVME",
        "storage.tiers.first.paths": tier}


class S3Endpoint:
    """An S3 endpoint for the run: the environment's (``url`` given), or a private Ceph
    cluster started from ``tests/s3server.py`` (``url`` is "auto")."""

    def __init__(self, url: str):
        self.server = None
        self.url = url
        if url == "auto":
            from tests.s3server import S3Server, missing_binaries
            if (missing := missing_binaries()):
                raise RuntimeError("no S3 server for the commit benchmark: Ceph's "
                                   f"{', '.join(missing)} missing (bash .ci/setup installs them)")
            self.server = S3Server.start()
            os.environ.update(self.server.env)
            self.url = f"s3://{self.server.new_bucket()}"

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def run(base: str, url: str, commits: int, writers: list[int]) -> dict:
    """Commit latency per number of writers on both roots: {"local": {w: row}, "s3": ...}."""
    out: dict[str, dict[int, dict]] = {"local": {}, "s3": {}}
    endpoint = S3Endpoint(url)
    try:
        for w in writers:
            root, conf = local_root(base)
            out["local"][w] = commit_latency(root, conf, commits, w)
            shutil.rmtree(root, ignore_errors=True)
            root, conf = s3_root(base, endpoint.url)
            out["s3"][w] = commit_latency(root, conf, commits, w)
            print(f"  commits, {w} writer(s): local {out['local'][w]}, s3 {out['s3'][w]}",
                  flush=True)
    finally:
        endpoint.close()
    return out
