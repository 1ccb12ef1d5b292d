"""The store commands of ``pafka``: each opens an existing store through the public API and
returns data (dicts, lists, the store's reports); :mod:`.output` renders it.

Every command but ``demo`` and ``create-topic --create-store`` works on an existing store and
never creates one: a mistyped root is an error, not a new empty store.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tier_store import (
    STORE_FILE,
    CheckReport,
    ConfigError,
    CorruptLog,
    CorruptSegment,
    InvalidArgument,
    MoveResult,
    PafkaError,
    Relocation,
    Store,
    StoreNotFound,
    Topic,
    lake_summary,
    purge_lake,
    relocate_tier,
    root_location,
    schema_changes,
    schema_history,
    tier_key,
)

from ..schema_text import schema_text, type_text
from .output import pmem_note

if TYPE_CHECKING:
    from migration import MigrationService

Progress = Callable[[int], None]


def check_root(root: str) -> None:
    """An empty root would silently be the current directory."""
    if not root.strip():
        raise InvalidArgument("the store root is empty: name the store's directory (an empty "
                              "path would be the current directory)")


def open_store(root: str, config: dict[str, str] | None = None,
               cls: type[Store] = Store) -> Store:
    """Open the existing store at ``root``; never create one."""
    check_root(root)
    path = root_location(root)  # an absolute directory or an s3:// URL; other schemes refused
    try:
        return cls.open(path, config, create=False)
    except StoreNotFound:
        if path.startswith("s3://"):
            raise
    except NotADirectoryError:
        if os.path.isdir(path):
            raise  # a path inside the store, not the root: its own error names it
    # In the command's terms: what is at the path, and how a store gets made.
    if not os.path.exists(path):
        why = "; no such directory"
    elif not os.path.isdir(path):
        why = "; not a directory"
    else:
        why = ""
    raise StoreNotFound(f"no store at {path} (no {STORE_FILE}{why}); check the path. pafka "
                        "opens existing stores only: Store.open() in Python, or the first "
                        "write of the Spark sink, creates one")


def config_args(items: list[str] | None) -> dict[str, str]:
    """``--set key=value`` items as a configuration dict; tier sizes and paths refused."""
    conf = {}
    for item in items or []:
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


# -- topics ----------------------------------------------------------------------------------
def list_topics(store: Store) -> list[dict[str, Any]]:
    """Every topic with its partition count and latest offsets; one whose commit log does
    not load has ``error`` instead (the others are still listed)."""
    out: list[dict[str, Any]] = []
    for name in store.topics():
        try:
            t = store.topic(name)
            out.append({"topic": name, "partitions": t.partitions, "latest": t.latest_offsets()})
        except (CorruptLog, CorruptSegment) as e:
            out.append({"topic": name, "error": str(e)})
    return out


def describe_topic(store: Store, name: str) -> dict[str, Any]:
    """A topic's schema, offsets per partition, segments, and consumer groups with their lag."""
    t = store.topic(name)
    earliest, latest = t.earliest_offsets(), t.latest_offsets()
    return {
        "topic": t.name, "partitions": t.partitions, "version": t.version,
        "schema": [(f.name, str(f.type)) for f in t.schema], "ddl": schema_text(t.schema),
        "config": t.config,
        "offsets": [{"partition": p, "earliest": earliest[p], "latest": latest[p]}
                    for p in range(t.partitions)],
        "segments": [{"id": s.id, "tier": s.tier, "tier_type": s.tier_type,
                      "base_offset": s.base_offset, "end_offset": s.end_offset,
                      "bytes": s.bytes, "sealed": s.sealed} for s in t.segments()],
        "groups": [{"group": group, "committed": offs,
                    "lag": sum(latest[p] - o for p, o in offs.items())}
                   for group, offs in t.positions().items()],
        "lake": lake_summary(t),
        "schema_history": _schema_history(t),
    }


def _schema_history(t: Topic) -> list[dict[str, Any]]:
    """Each schema the topic had: the log version and time it took effect, what changed."""
    out, before = [], None
    for version, ts, schema in schema_history(t):
        out.append({"version": version, "ts": ts, "ddl": schema_text(schema),
                    "changes": schema_changes(before, schema, type_text) if before else []})
        before = schema
    return out


def delete_topic(store: Store, name: str, purge: bool = False) -> dict[str, Any]:
    """Delete topic ``name`` (and with ``purge`` its lake table); what it held and how many
    files readers still pin."""
    t = store.topic(name)
    segs = t.segments()
    lake = lake_summary(t)
    report = {"topic": name, "id": t.id, "partitions": t.partitions,
              "records": sum(s.records for s in segs), "segments": len(segs),
              "bytes": sum(s.bytes for s in segs),
              "lake_table": lake["table"] if lake and lake["version"] >= 0 else None}
    report["pinned_files"] = store.delete_topic(name)
    # After the topic: a reader of it never meets a log naming files already gone.
    report["lake_purged"] = bool(purge and report["lake_table"] and
                                 purge_lake(store, name, report["id"]))
    return report


def check_names(store: Store, topic: str | None) -> tuple[list[str], int]:
    """The topics ``pafka check`` verifies (``topic``, or all) and the bytes they hold."""
    names = [topic] if topic else store.topics()
    total = 0
    for n in names:
        try:
            total += sum(s.bytes for s in store.topic(n).segments())
        except (CorruptLog, CorruptSegment):
            pass  # the check reports it
    return names, total


def check_topics(store: Store, names: list[str], verify: bool,
                 progress: Progress | None = None) -> list[CheckReport]:
    """Check ``names`` against their commit logs (and checksums with ``verify``)."""
    return store.check(names, verify=verify, progress=progress)


# -- tiers -----------------------------------------------------------------------------------
def band_text(low: float, high: float) -> str:
    """The migration policy's thresholds in words."""
    if low < 0:
        return "migration disabled (storage.migrate.threshold=-1)"
    if low == high:
        return f"threshold {low:.0%}"
    return f"band {low:.0%}..{high:.0%}"


def tiers_report(store: Store) -> dict[str, Any]:
    """Each tier's usage, its usable capacity, the fill the migration policy sees, and the
    migration totals: the data of ``pafka tiers``."""
    from migration import MigrationService, store_views
    try:
        policy = band_text(*MigrationService(store).band())
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
        if tier.has_pool:
            files, free = t["pool_files"], t["pool_free"]
            ratio = store.config["log.pmem.pool.ratio"]
            # More free files than configured: the size changed after the pool was made, and
            # in use cannot be told from the free count.
            row["pool_in_use"] = files - free if free <= files else None
            row["pool_ratio"] = ratio
            row["usable_capacity"] = files * tier.segment_bytes
            notes.append(pmem_note(t["tier"], ratio, tier.segment_bytes, files,
                                   row["usable_capacity"], t["capacity"]))
        if tier.is_lake:  # its tables, as their Delta logs tell
            tables = [lake_summary(store.topic(n)) for n in store.topics()]
            row["lake"] = {k: sum(x[k] for x in tables if x and x["version"] >= 0)
                           for k in ("files", "rows", "bytes")}
            row["lake"]["tables"] = sum(1 for x in tables if x and x["version"] >= 0)
        row["migration_fill"] = fill.get(t["tier"])
        row["fill_basis"] = (None if row["migration_fill"] is None else
                             "segments per pool file" if "pool_files" in t else
                             "bytes of capacity")
        rows.append(row)
    return {"root": store.root, "policy": policy, "tiers": rows,
            "migration": store.migration_totals() or None, "notes": notes}


def resize_tier(store: Store, number: int, size: str,
                progress: Progress | None = None) -> dict[str, Any]:
    """Change tier ``number``'s capacity; its size and pool before and after."""
    tier = store.tier(number)
    before, pool_before = tier.capacity, tier.pool_size
    changed = store.resize_tier(number, size, progress=progress)
    return {"tier": tier.number, "type": tier.type, "path": tier.path,
            "capacity_before": before, "capacity": tier.capacity,
            "pool_before": pool_before, "pool_size": tier.pool_size, "pool_change": changed}


def relocate(root: str, number: int, path: str, progress: Progress | None = None
             ) -> Relocation:
    """Point tier ``number`` of the store at ``root`` at ``path``, where its files now are."""
    check_root(root)
    return relocate_tier(root, number, path, progress=progress)


# -- migration -------------------------------------------------------------------------------
class ReportingStore(Store):
    """A store for ``pafka migrate``: reports each move as it completes (the service reports a
    run's moves only once all are done)."""

    on_moved: Callable[[MoveResult], None] | None = None  # called on the moving thread

    def move_segment(self, segment_id: str, *args: Any, **kwargs: Any) -> MoveResult:
        r = super().move_segment(segment_id, *args, **kwargs)
        if self.on_moved is not None:
            self.on_moved(r)
        return r


def plan_migration(svc: MigrationService) -> dict[str, Any]:
    """What the next run of the service would move (``moves``, ``bytes``), or why nothing
    (``idle_reason``). Fails on a misconfigured threshold band."""
    low, high = svc.band()
    moves = svc.plan() if low >= 0 else []
    idle = None if moves else (
        "migration is disabled (storage.migrate.threshold=-1)" if low < 0 else
        _stuck(svc.store.tier_usage(), high) or
        f"every tier is within its {band_text(low, high)} and in freshness order")
    return {"moves": moves, "bytes": sum(m.bytes for m in moves), "idle_reason": idle}


def _stuck(usage: list[dict[str, Any]], high: float) -> str | None:
    """Why nothing moves although a tier is over the threshold: it is the last tier (or the
    only one), so nothing is below it to move to. None if no tier is over it."""
    over = [u for u in usage if u["capacity"] and u["used"] > high * u["capacity"]]
    if not over:
        return None
    u = over[0]
    last = u["tier"] == max(x["tier"] for x in usage)
    below = ("the store has one tier: nothing is below it to move to" if len(usage) == 1 else
             f"tier {u['tier']} is the last: nothing is below it to move to" if last else
             "the tiers below have no room for its segments")
    return (f"tier {u['tier']} is {u['used'] / u['capacity']:.0%} full, over its "
            f"threshold {high:.0%}, but {below}. Raise a size (pafka resize ROOT TIER SIZE), "
            "add a tier (storage.tiers.types), or let retention delete old segments "
            "(retention.ms, retention.bytes)")


def run_migration(store: ReportingStore, svc: MigrationService, plan: dict[str, Any],
                  on_moved: Callable[[MoveResult], None] | None = None) -> dict[str, Any]:
    """One run of the migration service after ``plan``: the totals of what it moved and
    deleted; ``on_moved`` gets each move as it completes.

    Every run applies retention to every topic and reclaims deleted topics' files, even with
    nothing to move or migration disabled (Kafka's log cleaner runs regardless)."""
    store.on_moved = on_moved
    try:
        done = svc.run_once()
    finally:
        store.on_moved = None
    s = svc.stats
    return {"root": store.root, "planned": bool(plan["moves"]),
            "idle_reason": plan["idle_reason"], "moves": len(done),
            "segments_down": s.segments_down, "bytes_down": s.bytes_down,
            "segments_up": s.segments_up, "bytes_up": s.bytes_up,
            "failed_moves": s.failed_moves, "segments_deleted": s.segments_deleted}
