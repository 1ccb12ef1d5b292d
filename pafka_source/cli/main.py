"""The ``pafka`` command line: its parser and :func:`main`, which runs a subcommand's handler
and turns errors into one line on stderr with exit status 1 (``-v``, before or after the
command, adds tracebacks)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tier_store import PafkaError

from .. import __version__
from .args import add_json, add_root, add_topic, epoch_ms, offset_or_word, seconds, whole
from .commands import (
    cmd_check,
    cmd_delete_topic,
    cmd_describe,
    cmd_groups,
    cmd_migrate,
    cmd_relocate,
    cmd_resize,
    cmd_tiers,
    cmd_topics,
    groups_usage,
)
from .demo import cmd_demo
from .group_commands import RESET_NOTE
from .output import echo, error_text

log = logging.getLogger(__name__)

DESCRIPTION = ("The pafka command: create, produce to, consume and describe topics of a Pafka "
               "tier store; list, check and migrate its tiers; list and reset its consumer "
               "groups; measure it (perf); or run the end-to-end Spark demo.")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``pafka`` and its subcommands; each sets ``func``, its handler."""
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
                        "query, on ./pafka-data (a store of its own, made afresh)")
    d.add_argument("--seconds", type=seconds, default=10.0,
                   help="seconds of clicks in the burst: it writes rate × seconds clicks, "
                        "one trigger a second (default 10)")
    d.add_argument("--rate", type=whole(1), default=60_000,
                   help="clicks the producer writes per one-second trigger (default 60000)")
    d.add_argument("--json", action="store_true", help="print the demo's facts as JSON")
    d.set_defaults(func=cmd_demo)
    t = command("topics", "list the topics of a store")
    add_root(t)
    add_json(t)
    t.add_argument("--list", action="store_true", help="accepted for Kafka's kafka-topics "
                                                      "--list: topics always lists")
    t.set_defaults(func=cmd_topics)
    u = command("tiers", "show each tier's usage, its usable capacity (a PMEM tier's: its "
                         "pool, log.pmem.pool.ratio of its size) and the fill the migration "
                         "policy sees")
    add_root(u)
    add_json(u)
    u.set_defaults(func=cmd_tiers)
    m = command("migrate", "apply the migration policy once, or keep applying it")
    add_root(m)
    mode = m.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one run (the default)")
    mode.add_argument("--follow", action="store_true",
                      help="run every storage.migrate.interval.ms until interrupted")
    m.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a changeable store key for this run, e.g. storage.migrate.threshold=0.3"
                        " (not tier sizes or paths: see pafka resize and pafka relocate)")
    m.add_argument("--local", action="store_true",
                   help="on a store shared by many hosts: evict this host's own tier 1 only "
                        "(files compacted or deleted, and local copies beyond the threshold)")
    add_json(m, "with --follow, one object per line")
    m.set_defaults(func=cmd_migrate)
    for name, func, help, arg, arg_help in [
            ("resize", cmd_resize, "change a tier's capacity (a PMEM tier's pool follows) and "
             "save it for every process; on a store shared by many hosts, for each host's "
             "tier 1: this host's pool now, another's when it next opens the store", "size",
             "bytes, or with a suffix k, m, g, t (KiB, MiB, GiB, TiB)"),
            ("relocate", cmd_relocate, "point a tier at the directory (or URL) it was moved or "
             "copied to, once that holds all the tier's segments (a local root only: each host "
             "of a shared store keeps its tier 1 at the same path)", "path",
             "the tier's new directory, or fsspec URL for a REMOTE tier")]:
        r = command(name, help)
        add_root(r)
        r.add_argument("tier", type=int, metavar="TIER", help="tier number, 1 = fastest")
        r.add_argument(arg, metavar=arg.upper(), help=arg_help)
        add_json(r)
        r.set_defaults(func=func)
    x = command("delete-topic", "delete a topic and reclaim its files on every tier; a topic "
                                "created under its name later is a new one (another id)")
    x.epilog = ("A streaming query whose checkpoint names the deleted topic fails with a clear "
                "error rather than reading a new topic of the same name.")
    add_root(x)
    add_topic(x, "the topic to delete")
    x.add_argument("--purge-lake", action="store_true",
                   help="also delete the topic's Delta table on the LAKE tier (kept otherwise: "
                        "it is the topic's history)")
    add_json(x)
    x.set_defaults(func=cmd_delete_topic)
    c = command("describe", "partitions, offsets, segments and groups of a topic")
    add_root(c)
    add_topic(c)
    add_json(c)
    c.set_defaults(func=cmd_describe)
    g = command("groups", "list consumer groups with their committed offsets and lag per "
                          "partition, or reset or delete a group's offsets on a topic")
    g.epilog = ("Examples: pafka groups ROOT; pafka groups ROOT clicks --json; pafka groups "
                "ROOT clicks --group billing --reset-to earliest (shows the plan); ... "
                "--reset-to earliest --execute (records it); ... --reset-to 1200 "
                "--partition 0 --execute; ... --shift-by -100 --execute; ... --to-datetime "
                "2026-05-01T12:00:00Z --execute. As in Kafka, a reset is a dry run unless "
                "--execute is given. Note: " + RESET_NOTE + ".")
    add_root(g)
    g.add_argument("topic", nargs="?", metavar="TOPIC",
                   help="the topic (all topics when listing without it)")
    g.add_argument("--group", help="one consumer group (required to reset or delete)")
    add_json(g)
    to = g.add_mutually_exclusive_group()
    to.add_argument("--reset-to", type=offset_or_word, metavar="earliest|latest|OFFSET",
                    help="set the group's committed offsets: each partition's earliest or "
                         "latest offset, or OFFSET (within each partition's range)")
    to.add_argument("--reset-to-timestamp", type=whole(0), metavar="MS",
                    help="set the group's committed offsets to the first record committed at "
                         "or after MS (milliseconds since the epoch; latest if none)")
    to.add_argument("--to-datetime", type=epoch_ms, metavar="TIME",
                    help="as --reset-to-timestamp, with an ISO 8601 time such as "
                         "2026-05-01T12:00:00Z (UTC unless it names a zone), as Kafka's")
    to.add_argument("--shift-by", type=int, metavar="N",
                    help="move each partition's committed offset by N (negative: back), "
                         "kept within the partition's earliest and latest, as Kafka's")
    to.add_argument("--delete", action="store_true",
                    help="forget the group's committed offsets on the topic")
    g.add_argument("--partition", type=whole(0), action="append", metavar="P",
                   help="reset only partition P (repeatable); the group's other partitions "
                        "keep their offsets. Without it every partition is reset")
    run = g.add_mutually_exclusive_group()
    run.add_argument("--execute", action="store_true",
                     help="record the reset (without it, a reset only shows its plan)")
    run.add_argument("--dry-run", action="store_true",
                     help="show what a reset would record, without recording it (the "
                          "default)")
    g.set_defaults(func=cmd_groups, parser=g, check_usage=groups_usage)
    k = command("check", "verify topics against their commit logs and checksums")
    add_root(k)
    k.add_argument("--topic", metavar="TOPIC", help="check only this topic (default: all)")
    k.add_argument("--no-verify", action="store_true", help="skip checksums (files only)")
    add_json(k)
    k.set_defaults(func=cmd_check)
    for add in _extra_commands():
        add(command)
    return ap


def _extra_commands() -> list:
    """Commands defined in their own modules: each module's ``add_commands(command)`` adds
    its subparsers with ``command(name, help)``."""
    from . import consume, perf, topic_commands
    return [topic_commands.add_commands, consume.add_commands, perf.add_commands]


def main(argv: list[str] | None = None) -> int:
    """Run ``pafka`` with ``argv`` (default: the process's arguments); the exit status."""
    ap = build_parser()
    given = sys.argv[1:] if argv is None else argv
    if any(a == "--bootstrap-server" or a.startswith("--bootstrap-server=") for a in given):
        ap.error("--bootstrap-server: pafka has no broker to connect to; give the store's "
                 "directory or URL as ROOT instead, e.g. pafka consume ./store clicks")
    args = ap.parse_args(argv)
    verbose = bool(getattr(args, "verbose", False))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        ap.print_help()
        return 2
    # Flags that need one another: a usage error (exit 2) from the subcommand's parser.
    check = getattr(args, "check_usage", None)
    if check is not None and (problem := check(args)):
        args.parser.error(problem)
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
        echo(f"pafka: {error_text(e)}", err=True)
        return 1
    except Exception as e:
        # Anything else (a store file the store could not parse, or a bug here): one line,
        # unless -v asks for the traceback.
        if verbose:
            raise
        echo(f"pafka: {error_text(e)} (pafka -v shows the traceback)", err=True)
        return 1

