"""What one simulated host does to a shared store, run in a child process (see
``tests/support.py:on_host``): ``python -m tests.host_job ACTION ROOT CONFIG_JSON ...``.

Actions (each prints one JSON object):

- ``write TOPIC START N``: rows ``id`` START..START+N-1 by key, shared and committed;
- ``share TOPIC START N``: the same rows written and shared, never committed;
- ``read TOPIC``: every partition read: row count, sum of ``id``, this process's read counts.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa

from tier_store import Store, host_id, read_counts


def main(argv: list[str]) -> dict:
    action, root, conf = argv[0], argv[1], json.loads(argv[2])
    store = Store.open(root, conf, create=False)
    topic = store.topic(argv[3])
    if action in ("write", "share"):
        start, n = int(argv[4]), int(argv[5])
        ids = pa.array(range(start, start + n), pa.int64())
        refs = topic.share(topic.write_chunks(pa.table({"id": ids, "v": ids}), key="id"))
        out = {"objects": sorted({r.obj for r in refs}), "seqs": sorted({r.seq for r in refs})}
        if action == "write":
            topic.commit(refs)
        return {"host": host_id(), **out}
    rows = total = 0
    for p in range(topic.partitions):
        for b in topic.read(p, 0):
            rows += b.num_rows
            total += pa.compute.sum(b.column(0)).as_py() or 0
    return {"host": host_id(), "rows": rows, "sum": total, **read_counts()}


if __name__ == "__main__":
    import pyarrow.compute  # noqa: F401  (pa.compute)
    print(json.dumps(main(sys.argv[1:])))
