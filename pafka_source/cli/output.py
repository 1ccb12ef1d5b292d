"""What ``pafka`` prints: its commands' data as JSON (``--json``) or as lines for people.

The only module of the command that writes to stdout or stderr; the commands return data.
"""

from __future__ import annotations

import dataclasses
import datetime
import errno
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from tier_store import CheckReport, MoveResult, PafkaError, Relocation


def echo(line: str = "", *, err: bool = False, flush: bool = False) -> None:
    """Print one line to stdout, or to stderr with ``err``."""
    print(line, file=sys.stderr if err else sys.stdout, flush=flush)


def echo_lines(lines: Iterable[str]) -> None:
    for line in lines:
        echo(line)


def plain(data: Any) -> Any:
    """``data`` as JSON holds it: dataclasses (the store's reports) as objects, tuples as
    lists, mappings with text keys."""
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return {f.name: plain(getattr(data, f.name)) for f in dataclasses.fields(data)}
    if isinstance(data, dict):
        return {str(k): plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [plain(v) for v in data]
    return data


def emit(data: Any, as_json: bool, render: Callable[[Any], list[str]]) -> None:
    """Print a command's data: as JSON (``--json``), or rendered for people."""
    if as_json:
        echo(json.dumps(plain(data), indent=2))
        return
    echo_lines(render(data))


def emit_line(data: Any) -> None:
    """One JSON object on one line, flushed: a stream of events (``--follow --json``)."""
    echo(json.dumps(plain(data), separators=(",", ":")), flush=True)


# -- units and tables ----------------------------------------------------------------------
def human(n: float) -> str:
    """A byte count in binary units: ``512 B``, ``1.5 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _iso_ms(ms: int) -> str:
    """A commit time (ms since the epoch) in ISO 8601, UTC."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def offsets(start: int, end: int) -> str:
    """An end-exclusive offset range, as topic.read() takes it."""
    return f"[{start}, {end})"


def table(headers: list[str], rows: list[list[Any]], right: list[bool] | None = None
          ) -> list[str]:
    """Aligned columns: numbers right, text left, None as '-'; ``right`` says which columns
    go right when their cells are already formatted text."""
    cells = [headers] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = right or [all(isinstance(row[i], int | float | type(None)) for row in rows)
                        and bool(rows) for i in range(len(headers))]
    return ["  ".join(c.rjust(w) if num else c.ljust(w)
                      for c, w, num in zip(r, widths, numeric, strict=True)).rstrip()
            for r in cells]


# -- errors --------------------------------------------------------------------------------
def _os_error_text(e: OSError) -> str:
    """``/path: Permission denied``: the file first, as ls and cp write it."""
    names = [os.fsdecode(n) if isinstance(n, str | bytes) else str(n)
             for n in (e.filename, e.filename2) if n is not None]
    what = e.strerror or str(e) or type(e).__name__
    if e.errno == errno.EMFILE:  # a descriptor per topic opened: say which limit to raise
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        what += (f" (this process may hold {soft} and holds one per topic it opens; raise "
                 f"the hard limit, now {hard}, with ulimit -Hn or LimitNOFILE)")
    return f"{' -> '.join(names)}: {what}" if names else what


def error_text(e: BaseException) -> str:
    """An error in one line: the store's own words, or a path and what is wrong with it."""
    if isinstance(e, PafkaError):
        return str(e)
    if isinstance(e, OSError):
        return _os_error_text(e)
    if isinstance(e, UnicodeDecodeError):
        return f"a file is not {e.encoding} text: {e.reason} at byte {e.start}"
    return f"{type(e).__name__}: {e}"


# -- store commands ------------------------------------------------------------------------
def render_topics(topics: list[dict[str, Any]]) -> list[str]:
    """``pafka topics``: a line per topic (one whose log is damaged: the error)."""
    return [f"{t['topic']}\tERROR: {t['error']}" if "error" in t else
            f"{t['topic']}\tpartitions={t['partitions']}\tlatest={json.dumps(t['latest'])}"
            for t in topics]


def render_tiers(report: dict[str, Any]) -> list[str]:
    """``pafka tiers`` for people: a line per tier, the migration totals, then notes."""
    lines = []
    for t in report["tiers"]:
        if "lake" in t:
            x = t["lake"]
            lines.append(f"tier {t['tier']} LAKE  {t['path']}: {plural(x['tables'], 'table')}, "
                         f"{plural(x['files'], 'file')}, {x['rows']:,} rows, "
                         f"{human(x['bytes'])} (Delta Lake)")
            continue
        cap = human(t["capacity"]) if t["capacity"] else "unbounded"
        line = f"tier {t['tier']} {t['type']:5s} {t['path']}: {human(t['used'])} of {cap}"
        if "pool_files" in t:
            line += f" (usable {human(t['usable_capacity'])}: the pool)"
        line += f", {plural(t['segments'], 'segment')}"
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
        lines.append(f"migration: {plural(stats.get('runs', 0), 'run')}, "
                     f"{plural(stats.get('segments_down', 0), 'segment')} "
                     f"({human(stats.get('bytes_down', 0))}) down, "
                     f"{plural(stats.get('segments_up', 0), 'segment')} "
                     f"({human(stats.get('bytes_up', 0))}) up")
    lines += [f"note: {n}" for n in report["notes"]]
    return lines


def pmem_note(tier: int, pool_ratio: float, segment_bytes: int, files: int, usable: int,
              capacity: int) -> str:
    """Why a PMEM tier can use less than its size (a note of ``pafka tiers``)."""
    return (f"tier {tier} is PMEM: it holds segments only in its pool of pre-allocated files, "
            f"so it can use log.pmem.pool.ratio ({pool_ratio:g}) of its size in whole "
            f"segments of log.segment.bytes ({human(segment_bytes)}): "
            f"{plural(files, 'file')}, {human(usable)} of {human(capacity)}")


def render_resize(r: dict[str, Any]) -> list[str]:
    """``pafka resize``: the tier's size before and after, and its pool's."""
    cap = human(r["capacity"]) if r["capacity"] else "unbounded"
    line = (f"tier {r['tier']} {r['type']} {r['path']}: "
            f"{human(r['capacity_before']) if r['capacity_before'] else 'unbounded'} -> {cap}")
    if r["pool_before"] is not None:
        changed = r["pool_change"]
        line += (f"; pool {r['pool_before']} -> {r['pool_size']} files "
                 f"({'+' if changed >= 0 else ''}{changed})")
    return [line + "; processes that have the store open see the new size when they reopen it"]


def render_relocate(r: Relocation) -> list[str]:
    """``pafka relocate``: the tier's old and new path and what was found there."""
    return [f"tier {r.tier}: {r.old_path} -> {r.new_path}; {r.segments} segments "
            f"({human(r.bytes)}) found there. Processes that have the store open use the old "
            "path until they reopen it"]


def render_delete(r: dict[str, Any]) -> list[str]:
    """``pafka delete-topic``: what the topic held, and files readers still pin."""
    lines = [f"deleted topic {r['topic']} (id {r['id'] or 'none'}): {r['records']:,} records in "
             f"{plural(r['segments'], 'segment')} ({human(r['bytes'])})"]
    if r["pinned_files"]:
        lines.append(f"{plural(r['pinned_files'], 'file')} still mapped by readers: reclaimed "
                     "once they let go, by the migration service's next run")
    if r.get("lake_table"):
        lines.append(f"its lake table {r['lake_table']} was deleted" if r["lake_purged"] else
                     f"its lake table stays: {r['lake_table']} (--purge-lake deletes it)")
    return lines


def render_describe(d: dict[str, Any]) -> list[str]:
    """``pafka describe``: partitions and their offsets, segments, groups and their lag."""
    lines = [f"topic {d['topic']}: {plural(d['partitions'], 'partition')}, log version "
             f"{d['version']}; offset ranges [first, end) exclude their end",
             "schema: " + ", ".join(f"{name} {type_}" for name, type_ in d["schema"])]
    if d.get("config"):
        lines.append("topic config: " + ", ".join(f"{k}={v}" for k, v in d["config"].items()))
    for p in d["offsets"]:
        lines.append(f"  partition {p['partition']}: offsets "
                     f"{offsets(p['earliest'], p['latest'])} "
                     f"({p['latest'] - p['earliest']:,} record"
                     f"{'' if p['latest'] - p['earliest'] == 1 else 's'})")
    for s in d["segments"]:
        lines.append(f"  segment {s['id']:>8} tier {s['tier']} {s['tier_type']:5s} offsets "
                     f"{offsets(s['base_offset'], s['end_offset'])} {human(s['bytes']):>10} "
                     f"{'sealed' if s['sealed'] else 'active'}")
    for g in d["groups"]:
        lines.append(f"  group {g['group']}: {json.dumps(g['committed'])} lag {g['lag']:,}")
    history = d.get("schema_history") or []
    for h in history[1:]:  # the first is the schema the topic was created with
        lines.append(f"  schema change at log version {h['version']} "
                     f"({_iso_ms(h['ts'])}): " + "; ".join(h["changes"]))
    if d.get("lake"):
        x = d["lake"]
        lines.append(f"lake table {x['table']}: version {x['version']}, "
                     f"{plural(x['files'], 'file')}, {x['rows']:,} rows, {human(x['bytes'])}")
    return lines


def render_check(reports: list[CheckReport]) -> list[str]:
    """``pafka check``: a line per topic, then its problems."""
    lines = []
    for r in reports:
        status = "ok" if r.ok else plural(len(r.problems), "problem")
        lines.append(f"{r.topic}: version {r.version}, {plural(r.segments, 'segment')}, "
                     f"{plural(r.chunks, 'chunk')}, {human(r.bytes_verified)} verified: "
                     f"{status}")
        lines += ["  " + p for p in r.problems]
    return lines


# -- migration -----------------------------------------------------------------------------
def move_line(r: MoveResult) -> str:
    """One completed move, as ``pafka migrate --follow`` reports it."""
    return (f"moved {r.topic}/{r.segment} ({plural(len(r.sources), 'segment')}, "
            f"{human(r.bytes)}) tier {'/'.join(map(str, r.from_tiers))} -> {r.to_tier} "
            f"in {r.seconds:.2f} s")


def render_migration(r: dict[str, Any]) -> list[str]:
    """The summary of one ``pafka migrate`` run."""
    if not r["planned"]:
        moved = (f"; moved {r['segments_down']} down and {r['segments_up']} up"
                 if r["segments_down"] or r["segments_up"] else "")
        return [f"nothing to move: {r['idle_reason']}{moved}; retention deleted "
                f"{plural(r['segments_deleted'], 'segment')}"]
    skipped = (f"; {r['failed_moves']} skipped (see above; pafka check {r['root']} verifies "
               "the store)" if r["failed_moves"] else "; none skipped")
    return [f"moved {plural(r['segments_down'], 'segment')} ({human(r['bytes_down'])}) down "
            f"and {r['segments_up']} ({human(r['bytes_up'])}) up in "
            f"{plural(r['moves'], 'move')}{skipped}; retention deleted "
            f"{plural(r['segments_deleted'], 'segment')}"]


# -- consumer groups -----------------------------------------------------------------------
def render_groups(report: dict[str, Any]) -> list[str]:
    """``pafka groups`` for people: one row per group and partition."""
    if not report["groups"]:
        where = f"topic {report['topic']}" if report["topic"] else report["root"]
        return [f"no consumer groups on {where}"]
    rows = [[g["topic"], g["group"], p["partition"], p["committed"], p["earliest"],
             p["latest"], p["lag"]] for g in report["groups"] for p in g["partitions"]]
    return table(["TOPIC", "GROUP", "PARTITION", "COMMITTED", "EARLIEST", "LATEST", "LAG"],
                 rows)


def render_reset(report: dict[str, Any]) -> list[str]:
    """The result of ``pafka groups --reset-to`` for people."""
    to = report["to"]
    what = str(to) if not isinstance(to, dict) else \
        f"timestamp {to['timestamp_ms']} ms" if "timestamp_ms" in to else \
        f"its offsets shifted by {to['shift_by']}"
    head = (f"{'would reset' if report['dry_run'] else 'reset'} consumer group "
            f"{report['group']} on topic {report['topic']} to {what}")
    if report["created"]:
        head += " (a new group: check its name)" if report["dry_run"] else " (a new group)"
    if report["dry_run"]:
        head += "; dry run: nothing recorded (add --execute to record it)"
    rows = [[p["partition"], p["before"], p["after"], p["latest"], p["lag"]]
            for p in report["partitions"]]
    return [head, *table(["PARTITION", "BEFORE", "AFTER", "LATEST", "LAG"], rows),
            f"note: {report['note']}"]


def render_group_deleted(r: dict[str, Any]) -> list[str]:
    """The result of ``pafka groups --delete``."""
    return [f"deleted consumer group {r['group']} from topic {r['topic']} "
            f"(it had committed {json.dumps(r['deleted'])})"]


# -- the demo ------------------------------------------------------------------------------
def render_demo(s: dict[str, Any]) -> list[str]:
    """The demo's end summary: the counts that must match, then what the tiers did."""
    def check(ok: bool) -> str:
        return "ok" if ok else "MISMATCH"

    lines = [
        "3. What happened",
        f"  query 1 wrote {s['written']:,} clicks of the {s['announced']:,} announced; "
        f"query 2 counted {s['counted']:,}: "
        f"{check(s['announced'] == s['written'] == s['counted'] > 0)}",
        f"  consumer group {s['group']!r}: committed "
        f"{json.dumps({str(k): v for k, v in s['positions'].get(s['group'], {}).items()})}, "
        f"lag {s['lag']:,}: {check(s['lag'] == 0)}",
        f"  the migration service moved {s['moved_down']} segments down "
        f"({human(s['bytes_down'])}) and {s['moved_up']} up in {s['migration_runs']} runs"]
    for b, a in zip(s["tiers_before"], s["tiers_after"], strict=True):
        cap = human(a["capacity"]) if a["capacity"] else "unbounded"
        lines.append(f"  tier {a['tier']} {a['type']:5s} {human(b['used']):>9s} before -> "
                     f"{human(a['used']):>9s} after (of {cap}), {a['segments']} segments")
    order = s["order_violations"]
    lines.append("  freshness: in every partition, tier 2 holds only data older than tier 1's: "
                 + (check(True) if not order else f"{check(False)} ({'; '.join(order[:3])})"))
    lines.append("  top pages:")
    lines += [f"    {r['url']:10s} {r['clicks']:>8,} clicks  {r['amount']:>12,.0f} amount  "
              f"~{r['users']} users" for r in s["top"]]
    lines.append(f"  explore it: pafka tiers {s['root']}  |  pafka groups {s['root']} clicks")
    return lines


# -- topic management ------------------------------------------------------------------------
def render_created(r: dict[str, Any]) -> list[str]:
    """``pafka create-topic``: the topic, its partitions, schema and own keys."""
    own = ", ".join(f"{k}={v}" for k, v in r["config"].items())
    return [f"created topic {r['topic']} in {r['root']}: {plural(r['partitions'], 'partition')}"
            f"; schema: {r['schema']}" + (f"; config: {own}" if own else "")]


def render_partitions(r: dict[str, Any]) -> list[str]:
    """``pafka add-partitions``."""
    return [f"topic {r['topic']}: {r['before']} -> {plural(r['partitions'], 'partition')} "
            f"(+{r['added']}); readers and keyed writes see them at their next refresh"]


def render_altered(r: dict[str, Any]) -> list[str]:
    """``pafka alter-topic``: what changed, and the schema now."""
    if not r["changes"]:
        return [f"topic {r['topic']}: the schema is already {r['schema']}; nothing changed"]
    return [f"topic {r['topic']} at log version {r['version']}: " + "; ".join(r["changes"]),
            f"schema: {r['schema']}",
            "older records read added columns as null and widened ones in their new type"]


def render_topic_config(r: dict[str, Any]) -> list[str]:
    """``pafka config``: what changed, then every key with its value and where it comes from
    (``topic`` marks the topic's own)."""
    lines = [f"topic {r['topic']}: {c['key']} {c['before'] if c['before'] is not None else '-'}"
             f" -> {c['after'] if c['after'] is not None else '(the store value)'}"
             for c in r["changed"]]
    rows = [[c["key"], str(c["value"]), c["source"] + (" *" if c["source"] == "topic" else "")]
            for c in r["config"]]
    return lines + table(["KEY", "VALUE", "SOURCE"], rows) + [
        "* the topic's own value; set with --set KEY=VALUE, dropped with --unset KEY"]


def render_produced(r: dict[str, Any]) -> list[str]:
    """``pafka produce``'s summary."""
    parts = ", ".join(f"{p}: {n:,}" for p, n in r["partitions"].items() if n)
    rate = f", {r['records_per_second']:,} records/s" if r["records_per_second"] else ""
    return [f"produced {r['records']:,} records ({human(r['bytes'])}) from {r['file']} "
            f"({r['format']}) to topic {r['topic']} in {r['seconds']:.2f} s{rate}; "
            f"by partition: {parts or 'none'}"]
