"""A writer process for crash tests: appends batches and records each acknowledged commit.

Usage: python -m tests.crash_writer ROOT ACK_FILE CONFIG_JSON N_APPENDS [PARTITIONS]

After each acknowledged append it writes one line ``partition base_offset records first_key``
per chunk to ACK_FILE and fsyncs it, so the parent knows exactly what was acknowledged. The
crash point comes from PAFKA_CRASH_POINT in the environment (tier_store/crash.py). With
CRASH_WRITER_DEFERRED=1 each append is ``write_chunks(durable=False)``, ``sync``, ``commit``.
"""

from __future__ import annotations

import json
import os
import sys

from tier_store import Store, TopicExists

from .conftest import SCHEMA, make_batch


def main() -> None:
    root, ack, conf, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
    partitions = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    store = Store.open(root, conf)
    try:
        topic = store.create_topic("t", SCHEMA, partitions=partitions)
    except TopicExists:
        topic = store.topic("t")
    start = int(os.environ.get("CRASH_WRITER_START", "0"))
    deferred = os.environ.get("CRASH_WRITER_DEFERRED") == "1"
    fd = os.open(ack, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for i in range(n):
        first = start + i * 300
        if deferred:  # the sink's way: chunks flushed once, after the last is written
            refs = topic.write_chunks(make_batch(first, 300), key="key", durable=False)
            topic.sync()
            results = topic.commit(refs)
        else:
            results = topic.append(make_batch(first, 300), key="key")
        lines = "".join(f"{r.partition} {r.base_offset} {r.records} {first}\n" for r in results)
        os.write(fd, lines.encode())
        os.fsync(fd)
    os.close(fd)


if __name__ == "__main__":
    main()
