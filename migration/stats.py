"""The service's counters: those of one service (:class:`MigrationStats`) and the store's
totals over every run of every service (:meth:`tier_store.Store.migration_totals`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from tier_store import CorruptState, MoveResult, Store

log = logging.getLogger(__name__)

LAST_MOVES = 20  # moves of the last run kept in the totals, for `pafka tiers`


@dataclass
class MigrationStats:
    """Counters of one service (and, in the stats file, the totals of every run)."""

    runs: int = 0
    segments_down: int = 0
    segments_up: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    merged_segments: int = 0
    sealed_idle: int = 0
    segments_deleted: int = 0  # by retention
    failed_moves: int = 0
    last_run_ms: int = 0
    tiers: list[dict[str, Any]] = field(default_factory=list)

    def count(self, r: MoveResult) -> None:
        """Add move ``r`` to the counters."""
        if is_demotion(r):
            self.segments_down += len(r.sources)
            self.bytes_down += r.bytes
            self.merged_segments += len(r.sources) - 1
        else:
            self.segments_up += len(r.sources)
            self.bytes_up += r.bytes


def is_demotion(r: MoveResult) -> bool:
    """Whether ``r`` moved data to a slower tier."""
    return r.to_tier > min(r.from_tiers)


def save_run(store: Store, done: Iterable[MoveResult], deleted: int, last_run_ms: int) -> None:
    """Add a run (its moves ``done``, ``deleted`` segments by retention) to the store's
    totals, which ``pafka tiers`` shows. Merged against services saving at the same time
    (on a shared root, one per host)."""
    done = list(done)

    def add(totals: dict[str, Any]) -> dict[str, Any]:
        for r in done:
            key = "down" if is_demotion(r) else "up"
            totals[f"segments_{key}"] = totals.get(f"segments_{key}", 0) + len(r.sources)
            totals[f"bytes_{key}"] = totals.get(f"bytes_{key}", 0) + r.bytes
        totals["segments_deleted"] = totals.get("segments_deleted", 0) + deleted
        totals["runs"] = totals.get("runs", 0) + 1
        totals["last_run_ms"] = max(last_run_ms, totals.get("last_run_ms", 0))
        totals["last_moves"] = [asdict(r) for r in done[-LAST_MOVES:]]
        return totals

    try:
        store.update_migration_totals(add)
    except CorruptState as e:  # counters only: start them afresh rather than stop migrating
        log.warning("%s; the migration totals start afresh", e)
        store.save_migration_totals(add({}))


def read_stats(root: str) -> dict[str, Any]:
    """The totals the services of the store at ``root`` recorded (empty if none ran, or if
    they are unreadable: they are only counters). :class:`tier_store.StoreNotFound` if there
    is no store at ``root``."""
    with Store.open(root, create=False) as store:
        try:
            return store.migration_totals()
        except CorruptState as e:
            log.warning("%s", e)
            return {}
