"""The ``pafka`` command: the tier store's API from a shell.

Every command but ``demo`` works on an existing store and never creates one: a mistyped root
is an error, not a new empty store (``Store.open`` creates what it does not find). Errors are
one line on stderr with exit status 1; ``-v`` (before or after the command) adds tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tier_store import ConfigError, PafkaError, Store
from tier_store.config import tier_key
from tier_store.layout import STORE_FILE
from tier_store.moves import MoveResult
from tier_store.tiers import PmemTier

from . import __version__

if TYPE_CHECKING:
    from migration import MigrationService

log = logging.getLogger(__name__)

DESCRIPTION = ("The pafka command: list, describe, check and migrate a Pafka tier store, list "
               "and reset its consumer groups, or run the end-to-end Spark demo.")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _os_error_text(e: OSError) -> str:
    """``/path: Permission denied``: the file first, as ls and cp write it."""
    names = [os.fsdecode(n) if isinstance(n, str | bytes) else str(n)
             for n in (e.filename, e.filename2) if n is not None]
    what = e.strerror or str(e) or type(e).__name__
    return f"{' -> '.join(names)}: {what}" if names else what


def _error_text(e: BaseException) -> str:
    if isinstance(e, PafkaError):
        return str(e)
    if isinstance(e, OSError):
        return _os_error_text(e)
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not {e.encoding} text: {e.reason} at byte {e.start}"
    return f"{type(e).__name__}: {e}"


# -- output ------------------------------------------------------------------------------------
def _emit(data: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], list[str]]
          ) -> None:
    """Print a command's data: as JSON (``--json``), or rendered for people."""
    if as_json:
        print(json.dumps(data, indent=2))
        return
    for line in render(data):
        print(line)


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    """Aligned columns: numbers right, text left, None as '-'."""
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int | float | type(None)) for row in rows) and
               bool(rows) for i in range(len(headers))]
    return ["  ".join(c.rjust(w) if num else c.ljust(w)
                      for c, w, num in zip(r, widths, numeric, strict=True)).rstrip()
            for r in cells]


# -- opening a store ---------------------------------------------------------------------------
def _open_store(root: str, config: dict[str, str] | None = None,
                cls: type[Store] = Store) -> Store:
    """Open the existing store at ``root``; never create one, as ``Store.open`` would."""
    if not root.strip():
        raise PafkaError("the store root is empty: name the store's directory (an empty path "
                         "would be the current directory)")
    path = os.path.abspath(root)
    store_file = os.path.join(path, STORE_FILE)
    if not os.path.isfile(store_file):
        if not os.path.exists(path):
            why = "; no such directory"
        elif not os.path.isdir(path):
            why = "; not a directory"
        else:
            why = ""
        raise PafkaError(f"no store at {path} (no {STORE_FILE}{why}); check the path. pafka "
                         "opens existing stores only: Store.open() in Python, or the first "
                         "write of the Spark sink, creates one")
    return cls.open(path, config)


# -- commands ----------------------------------------------------------------------------------
def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run
    s = run(seconds=args.seconds, rows_per_second=args.rate,
            say=None if args.json else (lambda line: print(line, flush=True)))
    if args.json:
        print(json.dumps(s, indent=1, default=str))
    else:
        render_demo(s)
    ok = s["counted"] == s["written"] > 0 and s["lag"] == 0 and not s["order_violations"]
    return 0 if ok else 1


def render_demo(s: dict[str, Any]) -> None:
    """The demo's end summary: the counts that must match, then what the tiers did."""
    def check(ok: bool) -> str:
        return "ok" if ok else "MISMATCH"

    print("3. What happened")
    print(f"  query 1 wrote {s['written']:,} clicks; query 2 counted {s['counted']:,}: "
          f"{check(s['written'] == s['counted'] > 0)}")
    print(f"  consumer group {s['group']!r}: committed "
          f"{json.dumps({str(k): v for k, v in s['positions'].get(s['group'], {}).items()})}, "
          f"lag {s['lag']:,}: {check(s['lag'] == 0)}")
    print(f"  the migration service moved {s['moved_down']} segments down "
          f"({_human(s['bytes_down'])}) and {s['moved_up']} up in {s['migration_runs']} runs")
    for b, a in zip(s["tiers_before"], s["tiers_after"], strict=True):
        cap = _human(a["capacity"]) if a["capacity"] else "unbounded"
        print(f"  tier {a['tier']} {a['type']:5s} {_human(b['used']):>9s} before -> "
              f"{_human(a['used']):>9s} after (of {cap}), {a['segments']} segments")
    order = s["order_violations"]
    print("  freshness: in every partition, tier 2 holds only data older than tier 1's: "
          + (check(True) if not order else f"{check(False)} ({'; '.join(order[:3])})"))
    print("  top pages:")
    for r in s["top"]:
        print(f"    {r['url']:10s} {r['clicks']:>8,} clicks  {r['amount']:>12,.0f} amount  "
              f"~{r['users']} users")
    print(f"  explore it: pafka tiers {s['root']}  |  pafka groups {s['root']} clicks")


def cmd_topics(args: argparse.Namespace) -> int:
    store = _open_store(args.root)
    for name in store.topics():
        t = store.topic(name)
        print(f"{name}\tpartitions={t.partitions}\tlatest={json.dumps(t.latest_offsets())}")
    return 0


def _band_text(low: float, high: float) -> str:
    if low < 0:
        return "migration disabled (storage.migrate.threshold=-1)"
    if low == high:
        return f"threshold {low:.0%}"
    return f"band {low:.0%}..{high:.0%}"


def tiers_report(store: Store) -> dict[str, Any]:
    """Each tier's usage, its usable capacity, the fill the migration policy sees, and the
    migration totals: the data of ``pafka tiers``, rendered by :func:`render_tiers`."""
    from migration import MigrationService, read_stats
    from migration.service import store_views
    try:
        policy = _band_text(*MigrationService(store).band())
    except PafkaError as e:  # e.g. threshold.low above threshold.high: show usage anyway
        policy = f"policy misconfigured: {e}"
    # The policy's own view: on a pmem tier a segment takes a whole pool file, so its fill is
    # segments / pool files, not bytes / capacity. It balances every tier above another.
    _, views = store_views(store)
    fill = {v.number: v.used / v.capacity for v in views[:-1] if v.capacity > 0}
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for t in store.tier_usage():
        row = dict(t)
        # What segments can take: all of a file tier (0: unbounded), only the pool of a pmem
        # tier, in whole segment files.
        row["usable_capacity"] = t["capacity"]
        tier = store.tier(t["tier"])
        if isinstance(tier, PmemTier):
            files, free = t["pool_files"], t["pool_free"]
            # More free files than configured: the size changed after the pool was made, and
            # in use cannot be told from the free count.
            row["pool_in_use"] = files - free if free <= files else None
            row["pool_ratio"] = tier.pool_ratio
            row["usable_capacity"] = files * tier.segment_bytes
            notes.append(
                f"tier {t['tier']} is PMEM: it holds segments only in its pool of "
                f"pre-allocated files, so it can use log.pmem.pool.ratio ({tier.pool_ratio:g}) "
                f"of its size in whole segments of log.segment.bytes "
                f"({_human(tier.segment_bytes)}): {_plural(files, 'file')}, "
                f"{_human(row['usable_capacity'])} of {_human(t['capacity'])}")
        row["migration_fill"] = fill.get(t["tier"])
        row["fill_basis"] = (None if row["migration_fill"] is None else
                             "segments per pool file" if "pool_files" in t else
                             "bytes of capacity")
        rows.append(row)
    return {"root": store.root, "policy": policy, "tiers": rows,
            "migration": read_stats(store.root) or None, "notes": notes}


def render_tiers(report: dict[str, Any]) -> list[str]:
    """``pafka tiers`` for people: a line per tier, the migration totals, then notes."""
    lines = []
    for t in report["tiers"]:
        cap = _human(t["capacity"]) if t["capacity"] else "unbounded"
        line = f"tier {t['tier']} {t['type']:5s} {t['path']}: {_human(t['used'])} of {cap}"
        if "pool_files" in t:
            line += f" (usable {_human(t['usable_capacity'])}: the pool)"
        line += f", {_plural(t['segments'], 'segment')}"
        if "pool_files" in t:
            files, free = t["pool_files"], t["pool_free"]
            if t["pool_in_use"] is None:
                line += (f", pool holds {free} free files, more than the {files} configured "
                         "(its size changed after the store was created)")
            else:
                line += f", pool {t['pool_in_use']}/{files} files in use"
        if t["migration_fill"] is not None:
            line += (f"; migration fill {t['migration_fill']:.0%} ({t['fill_basis']}; "
                     f"{report['policy']})")
        lines.append(line)
    stats = report["migration"]
    if stats:
        lines.append(f"migration: {_plural(stats.get('runs', 0), 'run')}, "
                     f"{_plural(stats.get('segments_down', 0), 'segment')} "
                     f"({_human(stats.get('bytes_down', 0))}) down, "
                     f"{_plural(stats.get('segments_up', 0), 'segment')} "
                     f"({_human(stats.get('bytes_up', 0))}) up")
    lines += [f"note: {n}" for n in report["notes"]]
    return lines


def cmd_tiers(args: argparse.Namespace) -> int:
    _emit(tiers_report(_open_store(args.root)), args.json, render_tiers)
    return 0


def cmd_resize(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    store = _open_store(args.root)
    tier = store.tier(args.tier)
    before = tier.capacity
    pool_before = tier.pool_size if isinstance(tier, PmemTier) else None
    with tqdm(unit=" pool files", desc="pre-allocating", disable=None) as bar, \
            logging_redirect_tqdm():
        changed = store.resize_tier(args.tier, args.size, progress=bar.update)
    cap = _human(tier.capacity) if tier.capacity else "unbounded"
    line = (f"tier {tier.number} {tier.type} {tier.path}: "
            f"{_human(before) if before else 'unbounded'} -> {cap}")
    if pool_before is not None:
        line += (f"; pool {pool_before} -> {tier.pool_size} files "
                 f"({'+' if changed >= 0 else ''}{changed})")
    print(line + "; processes that have the store open see the new size when they reopen it")
    return 0


def cmd_relocate(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from tier_store import relocate_tier

    if not args.root.strip():
        raise PafkaError("the store root is empty: name the store's directory")
    with tqdm(unit=" segments", desc="checking", disable=None) as bar, \
            logging_redirect_tqdm():
        r = relocate_tier(args.root, args.tier, args.path, progress=bar.update)
    print(f"tier {r.tier}: {r.old_path} -> {r.new_path}; {r.segments} segments "
          f"({_human(r.bytes)}) found there. Processes that have the store open use the old "
          "path until they reopen it")
    return 0


def _config_args(args: argparse.Namespace) -> dict[str, str]:
    conf = {}
    for item in args.set or []:
        if "=" not in item:
            raise ConfigError(f"--set takes key=value, got {item!r}")
        k, v = (s.strip() for s in item.split("=", 1))
        if tier_key(k):
            # Store.open refuses both (saved in _store.json); say so in terms of this command.
            raise ConfigError(f"--set {k}: tier sizes and paths are fixed when the store is "
                              f"created (saved in {STORE_FILE}; `pafka resize` changes a "
                              "size, `pafka relocate` a path); --set takes changeable keys such as "
                              "storage.migrate.threshold")
        conf[k] = v
    return conf


class _ReportingStore(Store):
    """A store for ``pafka migrate``: reports each move as it completes (the service reports a
    run's moves only once all are done)."""

    on_moved: Callable[[MoveResult], None] | None = None  # called on the moving thread

    def move_segment(self, segment_id: str, *args: Any, **kwargs: Any) -> MoveResult:
        r = super().move_segment(segment_id, *args, **kwargs)
        if self.on_moved is not None:
            self.on_moved(r)
        return r


def _move_line(r: MoveResult) -> str:
    return (f"moved {r.topic}/{r.segment} ({_plural(len(r.sources), 'segment')}, "
            f"{_human(r.bytes)}) tier {'/'.join(map(str, r.from_tiers))} -> {r.to_tier} "
            f"in {r.seconds:.2f} s")


def cmd_migrate(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from migration import MigrationService
    store = _open_store(args.root, _config_args(args) or None, cls=_ReportingStore)
    assert isinstance(store, _ReportingStore)
    svc = MigrationService(store)
    low, high = svc.band()
    if args.follow:
        return _follow(store, svc)
    # Every run applies retention to every topic and reclaims deleted topics' files, even
    # with nothing to move or migration disabled (Kafka's log cleaner runs regardless).
    moves = svc.plan() if low >= 0 else []
    if not moves:
        svc.run_once()
        why = ("migration is disabled (storage.migrate.threshold=-1)" if low < 0 else
               f"every tier is within its {_band_text(low, high)} and in freshness order")
        moved = (f"; moved {svc.stats.segments_down} down and {svc.stats.segments_up} up"
                 if svc.stats.segments_down or svc.stats.segments_up else "")
        print(f"nothing to move: {why}{moved}; retention deleted "
              f"{_plural(svc.stats.segments_deleted, 'segment')}")
        return 0
    lock = threading.Lock()
    # Binary units as in the summary line; no bar when stderr is not a terminal.
    with tqdm(total=sum(m.bytes for m in moves), unit="iB", unit_scale=True,
              unit_divisor=1024, desc="migrating", disable=None) as bar, \
            logging_redirect_tqdm():
        def moved(r: MoveResult) -> None:
            with lock:  # moves complete on storage.migrate.threads threads
                bar.update(r.bytes)
        store.on_moved = moved
        done = svc.run_once()
    s = svc.stats
    skipped = (f"; {s.failed_moves} skipped (see above; pafka check {store.root} verifies "
               "the store)" if s.failed_moves else "; none skipped")
    print(f"moved {_plural(s.segments_down, 'segment')} ({_human(s.bytes_down)}) down and "
          f"{s.segments_up} ({_human(s.bytes_up)}) up in {_plural(len(done), 'move')}{skipped}; "
          f"retention deleted {_plural(s.segments_deleted, 'segment')}")
    return 0


def delete_topic(store: Store, name: str) -> dict[str, Any]:
    """Delete topic ``name``; what it held and how many files readers still pin."""
    t = store.topic(name)
    segs = t.segments()
    report = {"topic": name, "id": t.id, "partitions": t.partitions,
              "records": sum(s.records for s in segs), "segments": len(segs),
              "bytes": sum(s.bytes for s in segs)}
    report["pinned_files"] = store.delete_topic(name)
    return report


def render_delete(r: dict[str, Any]) -> list[str]:
    lines = [f"deleted topic {r['topic']} (id {r['id'] or 'none'}): {r['records']:,} records in "
             f"{_plural(r['segments'], 'segment')} ({_human(r['bytes'])})"]
    if r["pinned_files"]:
        lines.append(f"{_plural(r['pinned_files'], 'file')} still mapped by readers: reclaimed "
                     "once they let go, by the migration service's next run")
    return lines


def cmd_delete_topic(args: argparse.Namespace) -> int:
    store = _open_store(args.root)
    _emit(delete_topic(store, args.topic), args.json, render_delete)
    return 0


def _follow(store: Store, svc: MigrationService) -> int:
    interval = store.config["storage.migrate.interval.ms"] / 1000
    print(f"migrating {store.root} every {interval:g} s (Ctrl-C to stop)", flush=True)
    try:
        while True:
            try:
                done = svc.run_once()
            except BrokenPipeError:
                raise
            except Exception as e:
                # One failed run (a file gone, a disk error) must not end the service: the
                # next run plans afresh.
                print(f"pafka: migration run failed: {_error_text(e)}; next run in "
                      f"{interval:g} s", file=sys.stderr, flush=True)
                log.info("the failed run's traceback", exc_info=True)
                done = []
            for r in done:
                print(_move_line(r), flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _offsets(start: int, end: int) -> str:
    """An end-exclusive offset range, as topic.read() takes it."""
    return f"[{start}, {end})"


def cmd_describe(args: argparse.Namespace) -> int:
    store = _open_store(args.root)
    t = store.topic(args.topic)
    earliest, latest = t.earliest_offsets(), t.latest_offsets()
    print(f"topic {t.name}: {_plural(t.partitions, 'partition')}, log version {t.version}; "
          "offset ranges [first, end) exclude their end")
    print("schema:", ", ".join(f"{f.name} {f.type}" for f in t.schema))
    for p in range(t.partitions):
        print(f"  partition {p}: offsets {_offsets(earliest[p], latest[p])} "
              f"({latest[p] - earliest[p]:,} records)")
    for s in t.segments():
        print(f"  segment {s.id:>8} tier {s.tier} {s.tier_type:5s} offsets "
              f"{_offsets(s.base_offset, s.end_offset)} {_human(s.bytes):>10} "
              f"{'sealed' if s.sealed else 'active'}")
    for group, offs in t.positions().items():
        lag = sum(latest[p] - o for p, o in offs.items())
        print(f"  group {group}: {json.dumps(offs)} lag {lag:,}")
    return 0


RESET_NOTE = ("a running query of the group records its own position at its next commit, "
              "overwriting a reset (as in Kafka): stop the group's queries first. A query "
              "restarted from its checkpoint continues from the checkpoint; one started "
              "with a fresh checkpoint and startingOffsets=group starts from the reset")


def groups_report(store: Store, topic: str | None = None, group: str | None = None
                  ) -> dict[str, Any]:
    """Every consumer group of ``topic`` (all topics if None), or only ``group``: per
    partition its committed offset, the log's earliest and latest offsets, and the lag (None
    where the group has committed nothing; a reader starting from the group starts there at
    the earliest offset). Naming a group no topic has is an error listing the groups."""
    names = [topic] if topic is not None else store.topics()
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name in names:
        t = store.topic(name)
        positions = t.positions()
        seen.update(positions)
        earliest, latest = t.earliest_offsets(), t.latest_offsets()
        for g in sorted(positions):
            if group is not None and g != group:
                continue
            parts = []
            for p in range(t.partitions):
                committed = positions[g].get(p)
                parts.append({"partition": p, "committed": committed,
                              "earliest": earliest[p], "latest": latest[p],
                              "lag": None if committed is None else latest[p] - committed})
            out.append({"topic": name, "group": g, "partitions": parts,
                        "lag": sum(x["lag"] for x in parts if x["lag"] is not None)})
    if group is not None and not out:
        where = f"topic {topic!r}" if topic is not None else f"the store {store.root}"
        raise PafkaError(f"consumer group {group!r} has no committed offsets on {where}; "
                         f"groups: {', '.join(sorted(seen)) or '(none)'}")
    return {"root": store.root, "topic": topic, "groups": out}


def render_groups(report: dict[str, Any]) -> list[str]:
    """``pafka groups`` for people: one row per group and partition."""
    if not report["groups"]:
        where = f"topic {report['topic']}" if report["topic"] else report["root"]
        return [f"no consumer groups on {where}"]
    rows = [[g["topic"], g["group"], p["partition"], p["committed"], p["earliest"],
             p["latest"], p["lag"]] for g in report["groups"] for p in g["partitions"]]
    return _table(["TOPIC", "GROUP", "PARTITION", "COMMITTED", "EARLIEST", "LATEST", "LAG"],
                  rows)


def reset_group(store: Store, topic: str, group: str, to: str | int | None = None,
                timestamp_ms: int | None = None, partitions: list[int] | None = None,
                dry_run: bool = False) -> dict[str, Any]:
    """Set consumer group ``group``'s committed offsets on ``topic``: ``to`` is "earliest",
    "latest" or an offset within each partition's range, or ``timestamp_ms`` picks the first
    offset committed at or after it. Only ``partitions`` when given (the group's other
    partitions keep theirs), else every partition (the whole position is replaced). A group
    with no position yet is created. ``dry_run`` computes without recording."""
    if (to is None) == (timestamp_ms is None):
        raise PafkaError("give one of --reset-to and --reset-to-timestamp")
    t = store.topic(topic)
    before = t.positions().get(group)
    earliest, latest = t.earliest_offsets(), t.latest_offsets()
    chosen = sorted(set(partitions)) if partitions else list(range(t.partitions))
    for p in chosen:
        if not 0 <= p < t.partitions:
            raise PafkaError(f"--partition {p}: topic {topic!r} has partitions "
                             f"0..{t.partitions - 1}")
    new: dict[int, int] = {}
    for p in chosen:
        if timestamp_ms is not None:
            new[p] = t.offset_for_time(p, timestamp_ms)
        elif to == "earliest":
            new[p] = earliest[p]
        elif to == "latest":
            new[p] = latest[p]
        else:
            assert isinstance(to, int)
            if not earliest[p] <= to <= latest[p]:
                raise PafkaError(f"--reset-to {to} is outside partition {p} of topic "
                                 f"{topic!r}: it allows {earliest[p]} (earliest) to "
                                 f"{latest[p]} (latest: nothing left to read); use earliest, "
                                 "latest, or --partition to reset only some partitions")
            new[p] = to
    if not dry_run:
        if partitions:
            t.set_position(group, new)
        else:
            t.reset_position(group, new)
    was = before or {}
    return {"topic": topic, "group": group,
            "to": to if timestamp_ms is None else {"timestamp_ms": timestamp_ms},
            "created": before is None, "dry_run": dry_run,
            "partitions": [{"partition": p, "before": was.get(p), "after": new[p],
                            "latest": latest[p], "lag": latest[p] - new[p]} for p in chosen],
            "note": RESET_NOTE}


def render_reset(report: dict[str, Any]) -> list[str]:
    """The result of ``pafka groups --reset-to`` for people."""
    to = report["to"]
    what = f"timestamp {to['timestamp_ms']} ms" if isinstance(to, dict) else str(to)
    head = (f"{'would reset' if report['dry_run'] else 'reset'} consumer group "
            f"{report['group']} on topic {report['topic']} to {what}")
    if report["created"]:
        head += " (a new group)"
    if report["dry_run"]:
        head += "; dry run: nothing recorded"
    rows = [[p["partition"], p["before"], p["after"], p["latest"], p["lag"]]
            for p in report["partitions"]]
    return [head, *_table(["PARTITION", "BEFORE", "AFTER", "LATEST", "LAG"], rows),
            f"note: {report['note']}"]


def delete_group(store: Store, topic: str, group: str) -> dict[str, Any]:
    """Forget consumer group ``group``'s position on ``topic``."""
    t = store.topic(topic)
    before = t.positions().get(group)
    t.delete_group(group)
    return {"topic": topic, "group": group, "deleted": before}


def cmd_groups(args: argparse.Namespace) -> int:
    resetting = args.reset_to is not None or args.reset_to_timestamp is not None
    acting = "--reset-to" if resetting else "--delete" if args.delete else None
    if acting is not None and (args.topic is None or args.group is None):
        raise PafkaError(f"{acting} needs a topic and a group: pafka groups ROOT TOPIC --group "
                         f"NAME {acting}{' earliest' if resetting else ''}")
    if args.partition and not resetting:
        raise PafkaError("--partition applies to --reset-to and --reset-to-timestamp")
    if args.dry_run and not resetting:
        raise PafkaError("--dry-run applies to --reset-to and --reset-to-timestamp")
    store = _open_store(args.root)
    if resetting:
        _emit(reset_group(store, args.topic, args.group, args.reset_to, args.reset_to_timestamp,
                          args.partition, args.dry_run), args.json, render_reset)
    elif args.delete:
        _emit(delete_group(store, args.topic, args.group), args.json,
              lambda r: [f"deleted consumer group {r['group']} from topic {r['topic']} "
                         f"(it had committed {json.dumps(r['deleted'])})"])
    else:
        _emit(groups_report(store, args.topic, args.group), args.json, render_groups)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    store = _open_store(args.root)
    names = [args.topic] if args.topic else store.topics()
    total = sum(s.bytes for n in names for s in store.topic(n).segments())
    with tqdm(total=total, unit="iB", unit_scale=True, unit_divisor=1024, desc="verifying",
              disable=args.no_verify or None) as bar:
        reports = store.check(names, verify=not args.no_verify, progress=bar.update)
    bad = 0
    for r in reports:
        status = "ok" if r.ok else _plural(len(r.problems), "problem")
        print(f"{r.topic}: version {r.version}, {_plural(r.segments, 'segment')}, "
              f"{_plural(r.chunks, 'chunk')}, {_human(r.bytes_verified)} verified: {status}")
        for p in r.problems:
            print("  " + p)
        bad += not r.ok
    return 1 if bad else 0


# -- parsing -----------------------------------------------------------------------------------
def _seconds(text: str) -> float:
    """A positive, finite number of seconds (checked before Spark starts)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    """A whole number above 0 (checked before Spark starts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a whole number > 0, got {text!r}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _reset_target(text: str) -> str | int:
    """earliest | latest | an offset."""
    if text.strip().lower() in ("earliest", "latest"):
        return text.strip().lower()
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected earliest, latest or an offset (an integer "
                                         f">= 0), got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pafka", description=DESCRIPTION)
    ap.add_argument("--version", action="version", version=f"pafka {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="log at INFO level and show tracebacks")
    # -v after the command too; SUPPRESS keeps a subcommand from resetting a -v given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log at INFO level and show tracebacks")
    sub = ap.add_subparsers(dest="command")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              parents=[common])

    d = command("demo", "stream clicks into a topic with Spark and aggregate them with a second "
                        "query, on ./pafka-data (the only command that creates a store)")
    d.add_argument("--seconds", type=_seconds, default=10.0,
                   help="how long the producer's burst lasts (default 10)")
    d.add_argument("--rate", type=_positive_int, default=60_000,
                   help="clicks per second the producer writes (default 60000)")
    d.add_argument("--json", action="store_true", help="print the demo's facts as JSON")
    d.set_defaults(func=cmd_demo)
    t = command("topics", "list the topics of a store")
    t.add_argument("root")
    t.set_defaults(func=cmd_topics)
    u = command("tiers", "show each tier's usage, its usable capacity (a PMEM tier's: its "
                         "pool, log.pmem.pool.ratio of its size) and the fill the migration "
                         "policy sees")
    u.add_argument("root")
    u.add_argument("--json", action="store_true", help="print JSON instead of text")
    u.set_defaults(func=cmd_tiers)
    m = command("migrate", "apply the migration policy once, or keep applying it")
    m.add_argument("root")
    mode = m.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one run (the default)")
    mode.add_argument("--follow", action="store_true",
                      help="run every storage.migrate.interval.ms until interrupted")
    m.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a changeable store key for this run, e.g. storage.migrate.threshold=0.3"
                        " (not tier sizes or paths: see pafka resize and pafka relocate)")
    m.set_defaults(func=cmd_migrate)
    for name, func, help, arg, arg_help in [
            ("resize", cmd_resize, "change a tier's capacity (a PMEM tier's pool follows) and "
             "save it for every process", "size",
             "bytes, or with a suffix k, m, g, t (KiB, MiB, GiB, TiB)"),
            ("relocate", cmd_relocate, "point a tier at the directory (or URL) it was moved or "
             "copied to, once that holds all the tier's segments", "path",
             "the tier's new directory, or fsspec URL for a REMOTE tier")]:
        r = command(name, help)
        r.add_argument("root")
        r.add_argument("tier", type=int, help="tier number, 1 = fastest")
        r.add_argument(arg, help=arg_help)
        r.set_defaults(func=func)
    x = command("delete-topic", "delete a topic and reclaim its files on every tier; a topic "
                                "created under its name later is a new one (another id)")
    x.epilog = ("A streaming query whose checkpoint names the deleted topic fails with a clear "
                "error rather than reading a new topic of the same name.")
    x.add_argument("root")
    x.add_argument("topic")
    x.add_argument("--json", action="store_true", help="print JSON instead of text")
    x.set_defaults(func=cmd_delete_topic)
    c = command("describe", "partitions, offsets, segments and groups of a topic")
    c.add_argument("root")
    c.add_argument("topic")
    c.set_defaults(func=cmd_describe)
    g = command("groups", "list consumer groups with their committed offsets and lag per "
                          "partition, or reset or delete a group's offsets on a topic")
    g.epilog = ("Examples: pafka groups ROOT; pafka groups ROOT clicks --json; pafka groups "
                "ROOT clicks --group billing --reset-to earliest; ... --reset-to 1200 "
                "--partition 0; ... --reset-to-timestamp 1700000000000 --dry-run. Note: "
                + RESET_NOTE + ".")
    g.add_argument("root")
    g.add_argument("topic", nargs="?", help="the topic (all topics when listing without it)")
    g.add_argument("--group", help="one consumer group (required to reset or delete)")
    g.add_argument("--json", action="store_true", help="print JSON instead of text")
    to = g.add_mutually_exclusive_group()
    to.add_argument("--reset-to", type=_reset_target, metavar="earliest|latest|OFFSET",
                    help="set the group's committed offsets: each partition's earliest or "
                         "latest offset, or OFFSET (within each partition's range)")
    to.add_argument("--reset-to-timestamp", type=_non_negative, metavar="MS",
                    help="set the group's committed offsets to the first record committed at "
                         "or after MS (milliseconds since the epoch; latest if none)")
    to.add_argument("--delete", action="store_true",
                    help="forget the group's committed offsets on the topic")
    g.add_argument("--partition", type=_non_negative, action="append", metavar="P",
                   help="reset only partition P (repeatable); the group's other partitions "
                        "keep their offsets. Without it every partition is reset")
    g.add_argument("--dry-run", action="store_true",
                   help="show what a reset would record, without recording it")
    g.set_defaults(func=cmd_groups)
    k = command("check", "verify topics against their commit logs and checksums")
    k.add_argument("root")
    k.add_argument("--topic")
    k.add_argument("--no-verify", action="store_true", help="skip checksums (files only)")
    k.set_defaults(func=cmd_check)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    try:
        rc = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
        return rc
    except BrokenPipeError:
        # The reader went away (`pafka describe ... | head -1`): stop quietly, as Python's
        # docs on SIGPIPE recommend; stdout goes to devnull so the flush at exit cannot fail.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130
    except (PafkaError, OSError, UnicodeDecodeError) as e:
        # What the user can act on: a path and what is wrong with it, in one line.
        log.info("details", exc_info=True)
        print(f"pafka: {_error_text(e)}", file=sys.stderr)
        return 1
    except Exception as e:
        # Anything else (a store file the store could not parse, or a bug here): one line,
        # unless -v asks for the traceback.
        if verbose:
            raise
        print(f"pafka: {_error_text(e)} (pafka -v shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
