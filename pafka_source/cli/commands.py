"""The handlers of ``pafka``'s subcommands: from parsed arguments to a store command's data,
printed by :mod:`.output`, and an exit status. Progress bars (tqdm) are drawn here."""

from __future__ import annotations

import argparse
import logging
import threading
import time
from typing import TYPE_CHECKING

from tier_store import InvalidArgument, MoveResult

from . import group_commands as groups
from . import output as out
from . import store_commands as sc

if TYPE_CHECKING:
    from migration import MigrationService

log = logging.getLogger(__name__)


def cmd_topics(args: argparse.Namespace) -> int:
    topics = sc.list_topics(sc.open_store(args.root))
    out.emit(topics, args.json, out.render_topics)
    return 1 if any("error" in t for t in topics) else 0


def cmd_tiers(args: argparse.Namespace) -> int:
    out.emit(sc.tiers_report(sc.open_store(args.root)), args.json, out.render_tiers)
    return 0


def cmd_resize(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    store = sc.open_store(args.root)
    with tqdm(unit=" pool files", desc="pre-allocating", disable=None) as bar, \
            logging_redirect_tqdm():
        r = sc.resize_tier(store, args.tier, args.size, progress=bar.update)
    out.emit(r, args.json, out.render_resize)
    return 0


def cmd_relocate(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    sc.check_root(args.root)
    with tqdm(unit=" segments", desc="checking", disable=None) as bar, \
            logging_redirect_tqdm():
        r = sc.relocate(args.root, args.tier, args.path, progress=bar.update)
    out.emit(r, args.json, out.render_relocate)
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from migration import MigrationService
    store = sc.open_store(args.root, sc.config_args(args.set) or None, cls=sc.ReportingStore)
    assert isinstance(store, sc.ReportingStore)
    if args.local:
        return _evict(store, args.follow, args.json)
    svc = MigrationService(store)
    svc.band()  # a misconfigured band fails here, --follow too
    if args.follow:
        return _follow(store, svc, args.json)
    plan = sc.plan_migration(svc)
    if not plan["moves"]:
        out.emit(sc.run_migration(store, svc, plan), args.json, out.render_migration)
        return 0
    lock = threading.Lock()
    # Binary units as in the summary line; no bar when stderr is not a terminal.
    with tqdm(total=plan["bytes"], unit="iB", unit_scale=True, unit_divisor=1024,
              desc="migrating", disable=None) as bar, logging_redirect_tqdm():
        def moved(r: MoveResult) -> None:
            with lock:  # moves complete on storage.migrate.threads threads
                bar.update(r.bytes)
        report = sc.run_migration(store, svc, plan, on_moved=moved)
    out.emit(report, args.json, out.render_migration)
    return 0


def _follow(store: sc.ReportingStore, svc: MigrationService, as_json: bool) -> int:
    """``pafka migrate --follow``: a line per move (with ``--json``, a JSON object per line,
    the first one saying what runs); a failed run is reported on stderr, and the next runs."""
    interval = store.config["storage.migrate.interval.ms"] / 1000
    if as_json:
        out.emit_line({"event": "started", "root": store.root, "interval_s": interval})
    else:
        out.echo(f"migrating {store.root} every {interval:g} s (Ctrl-C to stop)", flush=True)
    try:
        while True:
            try:
                done = svc.run_once()
            except BrokenPipeError:
                raise
            except Exception as e:
                # One failed run (a file gone, a disk error) must not end the service: the
                # next run plans afresh.
                out.echo(f"pafka: migration run failed: {out.error_text(e)}; next run in "
                         f"{interval:g} s", err=True, flush=True)
                log.info("the failed run's traceback", exc_info=True)
                done = []
            for r in done:
                if as_json:
                    out.emit_line({"event": "moved", **out.plain(r)})
                else:
                    out.echo(out.move_line(r), flush=True)
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0


def _evict(store: sc.ReportingStore, follow: bool, as_json: bool) -> int:
    """``pafka migrate --local``: evict this host's tier 1 once, or on every interval."""
    if store.shared is None:
        raise InvalidArgument(f"{store.root} is not shared by many hosts (an s3:// root with a "
                              "REMOTE last tier): --local has nothing of its own to do; run "
                              "pafka migrate without it")
    interval = store.config["storage.migrate.interval.ms"] / 1000
    while True:
        try:
            r = store.evict_local()
        except Exception as e:
            if not follow:
                raise
            # One failed pass (the root unreachable a moment) must not end the loop.
            out.echo(f"pafka: eviction failed: {out.error_text(e)}; next in {interval:g} s",
                     err=True, flush=True)
            time.sleep(interval)
            continue
        assert r is not None
        if as_json:
            out.emit_line({"event": "evicted", "host": store.shared.host, **out.plain(r)})
        else:
            limit = "" if r.limit is None else f" of {r.limit} allowed"
            out.echo(f"tier 1 of host {store.shared.host}: released {r.garbage} unreferenced "
                     f"files and {r.copies} local copies ({r.copy_bytes} bytes); {r.used} "
                     f"bytes used{limit}", flush=True)
        if not follow:
            return 0
        time.sleep(interval)


def cmd_delete_topic(args: argparse.Namespace) -> int:
    store = sc.open_store(args.root)
    out.emit(sc.delete_topic(store, args.topic, args.purge_lake), args.json, out.render_delete)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    store = sc.open_store(args.root)
    out.emit(sc.describe_topic(store, args.topic), args.json, out.render_describe)
    return 0


def _resetting(args: argparse.Namespace) -> bool:
    return args.reset_to is not None or args.reset_to_timestamp is not None or \
        args.to_datetime is not None or args.shift_by is not None


def groups_usage(args: argparse.Namespace) -> str | None:
    """A misuse of ``pafka groups``' flags (a usage error, exit 2), or None."""
    resetting = _resetting(args)
    acting = "--reset-to" if resetting else "--delete" if args.delete else None
    if acting is not None and (args.topic is None or args.group is None):
        return (f"{acting} needs a topic and a group: pafka groups ROOT TOPIC --group NAME "
                f"{acting}{' earliest' if resetting else ''}")
    for flag, given in (("--partition", args.partition), ("--dry-run", args.dry_run),
                        ("--execute", args.execute)):
        if given and not resetting:
            return (f"{flag} applies to a reset (--reset-to, --reset-to-timestamp, "
                    "--to-datetime, --shift-by)")
    return None


def cmd_groups(args: argparse.Namespace) -> int:
    if args.to_datetime is not None:
        args.reset_to_timestamp = args.to_datetime
    resetting = _resetting(args)
    store = sc.open_store(args.root)
    if resetting:
        out.emit(groups.reset_group(store, args.topic, args.group, args.reset_to,
                                    args.reset_to_timestamp, args.partition,
                                    not args.execute, args.shift_by),
                 args.json, out.render_reset)
    elif args.delete:
        out.emit(groups.delete_group(store, args.topic, args.group), args.json,
                 out.render_group_deleted)
    else:
        out.emit(groups.groups_report(store, args.topic, args.group), args.json,
                 out.render_groups)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tqdm import tqdm
    store = sc.open_store(args.root)
    names, total = sc.check_names(store, args.topic)
    with tqdm(total=total, unit="iB", unit_scale=True, unit_divisor=1024, desc="verifying",
              disable=args.no_verify or None) as bar:
        reports = sc.check_topics(store, names, verify=not args.no_verify,
                                  progress=bar.update)
    out.emit(reports, args.json, out.render_check)
    return 1 if any(not r.ok for r in reports) else 0
