"""The end-to-end demo: a producer writes records into a tiered store, a consumer reads them.

Tier 1 is a pmem tier in a per-checkout directory under ``/dev/shm`` (RAM: gone at reboot)
when it exists, tier 2 a disk tier under ``./pafka-data``. The store is recreated each run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time

import numpy as np
import pyarrow as pa

from tier_store import Store

SCHEMA = pa.schema([("key", pa.int64()), ("ts", pa.int64()), ("value", pa.binary(100))])


def demo_paths(cwd: str | None = None) -> tuple[str, str]:
    """The demo's store root and tier-1 directory for this working directory."""
    cwd = os.path.abspath(cwd or os.getcwd())
    root = os.path.join(cwd, "pafka-data")
    tag = hashlib.sha1(cwd.encode()).hexdigest()[:10]
    fast = f"/dev/shm/pafka-demo-{tag}" if os.path.isdir("/dev/shm") else \
        os.path.join(root, "tier-1")
    return root, fast


def make_batch(start: int, n: int) -> pa.RecordBatch:
    keys = np.arange(start, start + n, dtype=np.int64)
    values = np.random.default_rng(start).integers(0, 255, size=n * 100, dtype=np.uint8)
    return pa.record_batch([
        pa.array(keys), pa.array(np.full(n, int(time.time() * 1000), dtype=np.int64)),
        pa.FixedSizeBinaryArray.from_buffers(pa.binary(100), n, [None, pa.py_buffer(values)]),
    ], schema=SCHEMA)


def run(records: int = 1_000_000, batch: int = 10_000, partitions: int = 4) -> dict:
    """Write ``records`` records, read them all back, and return a summary."""
    root, fast = demo_paths()
    for d in (root, fast):
        shutil.rmtree(d, ignore_errors=True)
    pmem = fast.startswith("/dev/shm")
    store = Store.open(root, {
        "log.channel.type": "tiered",
        "storage.tiers.types": "PMEM,HDD" if pmem else "NVME,HDD",
        "storage.tiers.first.paths": fast,
        "storage.tiers.first.sizes": "512m",
        "log.segment.bytes": "32m",
    })
    topic = store.create_topic("demo", SCHEMA, partitions=partitions)
    t0 = time.perf_counter()
    for start in range(0, records, batch):
        topic.append(make_batch(start, min(batch, records - start)))
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    read = 0
    keys_sum = 0
    for p in range(topic.partitions):
        for b in topic.read(p, 0):
            read += b.num_rows
            keys_sum += pa.compute.sum(b.column(0)).as_py() or 0
    t_read = time.perf_counter() - t0
    return {
        "root": root, "tier1": fast, "records": records, "read": read,
        "keys_ok": keys_sum == records * (records - 1) // 2,
        "write_s": t_write, "read_s": t_read,
        "latest_offsets": topic.latest_offsets(), "tiers": store.tier_usage(),
    }
