"""A reader of one partition, run as a child process so that a crash (a signal) fails the
test that runs it instead of the test session.

    python -m tests.poison_reader ROOT TOPIC read|consumer [--skip-corrupt]

Prints one JSON line: ``{"ids": [...], "names": [...]}`` (every record read, as Python
values) or ``{"error": class name, "message": ...}``; exit 0 either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tier_store import Consumer, Store


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("root")
    p.add_argument("topic")
    p.add_argument("how", choices=("read", "consumer"))
    p.add_argument("--skip-corrupt", action="store_true")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    topic = Store.open(args.root).topic(args.topic)
    rows: list[dict] = []
    try:
        if args.how == "read":
            for b in topic.read(0, 0, skip_corrupt=args.skip_corrupt):
                rows.extend(b.to_pylist())
        else:
            consumer = Consumer(None, topic, None, skip_corrupt=args.skip_corrupt)
            while True:
                got = consumer.poll()
                if not got:
                    break
                for fb in got:
                    rows.extend(fb.batch.to_pylist())
    except Exception as e:  # noqa: BLE001 - reported to the test, which judges it
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
        return 0
    names = [k for k in rows[0] if k != "id"] if rows else []
    print(json.dumps({"ids": [r["id"] for r in rows],
                      "other": [r[names[0]] for r in rows] if names else []}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
