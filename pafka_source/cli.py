"""The ``pafka`` command: the tier store's API from a shell."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tier_store import PafkaError, Store

from . import __version__


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run
    s = run(records=args.records)
    print(f"store {s['root']} (tier 1: {s['tier1']}; /dev/shm is RAM, gone at reboot)")
    print(f"wrote {s['records']:,} records in {s['write_s']:.2f} s "
          f"({s['records'] / s['write_s']:,.0f} records/s)")
    print(f"read  {s['read']:,} records in {s['read_s']:.2f} s "
          f"({s['read'] / max(s['read_s'], 1e-9):,.0f} records/s); keys complete: {s['keys_ok']}")
    print("latest offsets:", json.dumps({str(k): v for k, v in s["latest_offsets"].items()}))
    for t in s["tiers"]:
        cap = _human(t["capacity"]) if t["capacity"] else "unbounded"
        print(f"tier {t['tier']} {t['type']:5s} {t['path']}: {_human(t['used'])} used of {cap}, "
              f"{t['segments']} segments")
    return 0 if s["read"] == s["records"] and s["keys_ok"] else 1


def cmd_topics(args: argparse.Namespace) -> int:
    store = Store.open(args.root)
    for name in store.topics():
        t = store.topic(name)
        print(f"{name}\tpartitions={t.partitions}\tlatest={json.dumps(t.latest_offsets())}")
    return 0


def cmd_tiers(args: argparse.Namespace) -> int:
    store = Store.open(args.root)
    for t in store.tier_usage():
        cap = _human(t["capacity"]) if t["capacity"] else "unbounded"
        print(f"tier {t['tier']} {t['type']:5s} {t['path']}: {_human(t['used'])} of {cap}, "
              f"{t['segments']} segments")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pafka", description=__doc__)
    ap.add_argument("--version", action="version", version=f"pafka {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = ap.add_subparsers(dest="command")
    d = sub.add_parser("demo", help="write and read back records in a tiered store")
    d.add_argument("--records", type=int, default=1_000_000)
    d.set_defaults(func=cmd_demo)
    t = sub.add_parser("topics", help="list the topics of a store")
    t.add_argument("root")
    t.set_defaults(func=cmd_topics)
    u = sub.add_parser("tiers", help="show each tier's usage")
    u.add_argument("root")
    u.set_defaults(func=cmd_tiers)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    try:
        return args.func(args)
    except PafkaError as e:
        print(f"pafka: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
