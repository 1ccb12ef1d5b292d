"""The ``pafka`` command: the tier store's API from a shell."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

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
    s = run(seconds=args.seconds)
    print(f"store {s['root']} (tier 1: {s['tier1']}; /dev/shm is RAM, gone at reboot)")
    print(f"query 1 wrote {s['written']:,} clicks into topic 'clicks' "
          f"({s['segments']} segments); offsets "
          f"{json.dumps({str(k): v for k, v in s['latest_offsets'].items()})}")
    print(f"query 2 read and aggregated {s['counted']:,} clicks; top pages:")
    for r in s["top"]:
        print(f"  {r['url']:10s} {r['clicks']:>8,} clicks  {r['amount']:>12,.0f} amount  "
              f"~{r['users']} users")
    for g, offs in s["positions"].items():
        print(f"consumer group {g}: committed {json.dumps(offs)}")
    for t in s["tiers"]:
        cap = _human(t["capacity"]) if t["capacity"] else "unbounded"
        print(f"tier {t['tier']} {t['type']:5s} {t['path']}: {_human(t['used'])} used of {cap}, "
              f"{t['segments']} segments")
    return 0 if s["counted"] == s["written"] > 0 else 1


def cmd_topics(args: argparse.Namespace) -> int:
    store = Store.open(args.root)
    for name in store.topics():
        t = store.topic(name)
        print(f"{name}\tpartitions={t.partitions}\tlatest={json.dumps(t.latest_offsets())}")
    return 0


def cmd_tiers(args: argparse.Namespace) -> int:
    from migration import read_stats
    store = Store.open(args.root)
    for t in store.tier_usage():
        cap = _human(t["capacity"]) if t["capacity"] else "unbounded"
        pool = f", pool {t['pool_files'] - t['pool_free']}/{t['pool_files']} files in use" \
            if "pool_files" in t else ""
        print(f"tier {t['tier']} {t['type']:5s} {t['path']}: {_human(t['used'])} of {cap}, "
              f"{t['segments']} segments{pool}")
    stats = read_stats(store.root)
    if stats:
        print(f"migration: {stats.get('runs', 0)} runs, "
              f"{stats.get('segments_down', 0)} segments ({_human(stats.get('bytes_down', 0))}) "
              f"down, {stats.get('segments_up', 0)} segments "
              f"({_human(stats.get('bytes_up', 0))}) up")
    return 0


def _config_args(args: argparse.Namespace) -> dict[str, str]:
    conf = {}
    for item in args.set or []:
        if "=" not in item:
            raise PafkaError(f"--set takes key=value, got {item!r}")
        k, v = item.split("=", 1)
        conf[k.strip()] = v.strip()
    return conf


def cmd_migrate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from migration import MigrationService
    store = Store.open(args.root, _config_args(args) or None)
    if args.follow:
        svc = MigrationService(store)
        interval = store.config["storage.migrate.interval.ms"] / 1000
        print(f"migrating {store.root} every {interval:g} s (Ctrl-C to stop)")
        try:
            while True:
                for r in svc.run_once():
                    print(f"moved {r.topic}/{r.segment} ({len(r.sources)} segments, "
                          f"{_human(r.bytes)}) tier {'/'.join(map(str, r.from_tiers))} -> "
                          f"{r.to_tier} in {r.seconds:.2f} s", flush=True)
                time.sleep(interval)
        except KeyboardInterrupt:
            return 0
    moves = MigrationService(store).plan()
    if not moves:
        print("nothing to move: every tier is within its threshold")
        return 0
    total = sum(m.bytes for m in moves)
    with tqdm(total=total, unit="B", unit_scale=True, desc="migrating") as bar:
        svc = MigrationService(store, on_move=lambda r: bar.update(r.bytes))
        done = svc.run_once()
    s = svc.stats
    print(f"moved {s.segments_down} segments ({_human(s.bytes_down)}) down and "
          f"{s.segments_up} ({_human(s.bytes_up)}) up in {len(done)} moves; "
          f"{s.failed_moves} skipped")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    store = Store.open(args.root)
    t = store.topic(args.topic)
    earliest, latest = t.earliest_offsets(), t.latest_offsets()
    print(f"topic {t.name}: {t.partitions} partitions, log version {t.version}")
    print("schema:", ", ".join(f"{f.name} {f.type}" for f in t.schema))
    for p in range(t.partitions):
        print(f"  partition {p}: offsets {earliest[p]}..{latest[p]} "
              f"({latest[p] - earliest[p]:,} records)")
    for s in t.segments():
        print(f"  segment {s.id:>8} tier {s.tier} {s.tier_type:5s} offsets "
              f"{s.base_offset}..{s.end_offset} {_human(s.bytes):>10} "
              f"{'sealed' if s.sealed else 'active'}")
    for group, offs in t.positions().items():
        lag = sum(latest[p] - o for p, o in offs.items())
        print(f"  group {group}: {json.dumps(offs)} lag {lag:,}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    store = Store.open(args.root)
    names = [args.topic] if args.topic else store.topics()
    total = sum(s.bytes for n in names for s in store.topic(n).segments())
    with tqdm(total=total, unit="B", unit_scale=True, desc="verifying",
              disable=args.no_verify or None) as bar:
        reports = store.check(names, verify=not args.no_verify, progress=bar.update)
    bad = 0
    for r in reports:
        status = "ok" if r.ok else f"{len(r.problems)} problems"
        print(f"{r.topic}: version {r.version}, {r.segments} segments, {r.chunks} chunks, "
              f"{_human(r.bytes_verified)} verified: {status}")
        for p in r.problems:
            print(f"  {p}")
        bad += not r.ok
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pafka", description=__doc__)
    ap.add_argument("--version", action="version", version=f"pafka {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = ap.add_subparsers(dest="command")
    d = sub.add_parser("demo", help="stream clicks into a topic with Spark and aggregate them "
                                    "with a second query, on ./pafka-data")
    d.add_argument("--seconds", type=float, default=12.0, help="how long the producer runs")
    d.set_defaults(func=cmd_demo)
    t = sub.add_parser("topics", help="list the topics of a store")
    t.add_argument("root")
    t.set_defaults(func=cmd_topics)
    u = sub.add_parser("tiers", help="show each tier's usage")
    u.add_argument("root")
    u.set_defaults(func=cmd_tiers)
    m = sub.add_parser("migrate", help="apply the migration policy once, or keep applying it")
    m.add_argument("root")
    mode = m.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one run (the default)")
    mode.add_argument("--follow", action="store_true",
                      help="run every storage.migrate.interval.ms until interrupted")
    m.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a changeable store key for this run, e.g. storage.migrate.threshold=0.3")
    m.set_defaults(func=cmd_migrate)
    c = sub.add_parser("describe", help="partitions, offsets, segments and groups of a topic")
    c.add_argument("root")
    c.add_argument("topic")
    c.set_defaults(func=cmd_describe)
    k = sub.add_parser("check", help="verify topics against their commit logs and checksums")
    k.add_argument("root")
    k.add_argument("--topic")
    k.add_argument("--no-verify", action="store_true", help="skip checksums (files only)")
    k.set_defaults(func=cmd_check)
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
