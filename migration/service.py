"""The migration service: applies the policy on a schedule, using the store's public API.

It runs in a long-lived Python process (``pafka migrate ROOT --follow``) or as a thread of the
user's driver program (``MigrationService(store).start()``). Several services may run on one
store: each move is an optimistic commit, so two never both move a segment, and none holds a
lock that a crash could leave behind.

Each run: seal active segments idle longer than ``log.segment.ms`` (so quiet topics migrate
too), reclaim files past the grace period, plan moves with
:func:`~migration.policy.plan_moves`, carry them out with ``storage.migrate.threads`` threads
within ``storage.migrate.bytes.per.second``, reclaim again, and record counters in
``<root>/_migration.json``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from tier_store import CommitConflict, PafkaError, Store, StoreFull
from tier_store.layout import write_atomic
from tier_store.moves import MoveResult, seal_idle

from .policy import Move, SegmentView, TierView, plan_moves

log = logging.getLogger(__name__)

STATS_FILE = "_migration.json"


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
    failed_moves: int = 0
    last_run_ms: int = 0
    tiers: list[dict[str, Any]] = field(default_factory=list)


class Throttle:
    """A token bucket shared by the copying threads: ``rate`` bytes per second, 0 = none."""

    def __init__(self, rate: int):
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def __call__(self, nbytes: int) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._next = max(self._next, now) + nbytes / self.rate
            wait = self._next - now
        if wait > 0:
            time.sleep(wait)


def store_views(store: Store) -> tuple[list[SegmentView], list[TierView]]:
    """The policy's view of a store: every committed segment, every tier's usage."""
    segs: list[SegmentView] = []
    for name in store.topics():
        for s in store.topic(name).segments():
            # A segment with chunks a writer may still commit waits: moving it would make
            # that commit fail.
            segs.append(SegmentView(name, s.id, s.partition, int(s.id.split("-")[1]), s.tier,
                                    s.bytes, s.last_timestamp, s.sealed and s.settled))
    tiers = []
    seg_bytes = store.config["log.segment.bytes"]
    for u in store.tier_usage():
        if "pool_files" in u:
            # pmem: capacity is the pool; usage the pool files of live segments (a file whose
            # segment moved away is leaving: it returns to the pool after the grace period).
            live = sum(1 for s in segs if s.tier == u["tier"])
            tiers.append(TierView(u["tier"], u["pool_files"] * seg_bytes, live * seg_bytes,
                                  seg_bytes))
        else:
            tiers.append(TierView(u["tier"], u["capacity"], u["used"]))
    return segs, tiers


class MigrationService:
    """Keeps fresh data on the fast tier: Pafka's threshold rule, run on a schedule."""

    def __init__(self, store: Store, on_move: Callable[[MoveResult], None] | None = None):
        self.store = store
        self.stats = MigrationStats()
        self._on_move = on_move
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- configuration ----------------------------------------------------------------------
    def band(self) -> tuple[float, float]:
        c = self.store.config
        t = c["storage.migrate.threshold"]
        if t == -1:
            return -1.0, -1.0
        low = c["storage.migrate.threshold.low"]
        high = c["storage.migrate.threshold.high"]
        low = t if low is None else low
        high = t if high is None else high
        if low > high:
            raise PafkaError(f"storage.migrate.threshold.low={low} is above "
                             f"storage.migrate.threshold.high={high}")
        return low, high

    # -- one run ----------------------------------------------------------------------------
    def plan(self) -> list[Move]:
        low, high = self.band()
        segs, tiers = store_views(self.store)
        return plan_moves(segs, tiers, low, high, self.store.config["log.segment.bytes"])

    def run_once(self) -> list[MoveResult]:
        """Seal idle segments, plan, move, reclaim; returns the moves made."""
        with self._lock:
            low, _ = self.band()
            if low < 0:
                return []
            idle = self.store.config["log.segment.ms"]
            for name in self.store.topics():
                topic = self.store.topic(name)
                self.stats.sealed_idle += len(seal_idle(topic, idle))
                # Files past their grace period free room (pool files) before planning.
                self.store.collect_garbage(topic)
            moves = self.plan()
            done = self._execute(moves)
            for name in self.store.topics():
                self.store.collect_garbage(self.store.topic(name))
            self.stats.runs += 1
            self.stats.last_run_ms = int(time.time() * 1000)
            self.stats.tiers = self.store.tier_usage()
            self._save_stats(done)
            return done

    def _execute(self, moves: list[Move]) -> list[MoveResult]:
        if not moves:
            return []
        throttle = Throttle(self.store.config["storage.migrate.bytes.per.second"])
        threads = self.store.config["storage.migrate.threads"]

        def one(m: Move) -> MoveResult | None:
            try:
                return self.store.move_segment(m.segments[0], m.target,
                                               merge_with=m.segments[1:], topic=m.topic,
                                               throttle=throttle)
            except (CommitConflict, StoreFull, PafkaError) as e:
                log.warning("move of %s/%s to tier %d skipped: %s", m.topic,
                            ",".join(m.segments), m.target, e)
                return None

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pafka-migrate") as ex:
            results = list(ex.map(one, moves))
        done = []
        for m, r in zip(moves, results, strict=True):
            if r is None:
                self.stats.failed_moves += 1
                continue
            done.append(r)
            if m.down:
                self.stats.segments_down += len(m.segments)
                self.stats.bytes_down += r.bytes
                self.stats.merged_segments += len(m.segments) - 1
            else:
                self.stats.segments_up += len(m.segments)
                self.stats.bytes_up += r.bytes
            if self._on_move is not None:
                self._on_move(r)
        return done

    def _save_stats(self, done: list[MoveResult]) -> None:
        """Add this run to the totals in ``<root>/_migration.json`` (read by the CLI)."""
        path = os.path.join(self.store.root, STATS_FILE)
        try:
            with open(path, "rb") as f:
                totals = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            totals = {}
        for r in done:
            key = "down" if r.to_tier > min(r.from_tiers) else "up"
            totals[f"segments_{key}"] = totals.get(f"segments_{key}", 0) + len(r.sources)
            totals[f"bytes_{key}"] = totals.get(f"bytes_{key}", 0) + r.bytes
        totals["runs"] = totals.get("runs", 0) + 1
        totals["last_run_ms"] = self.stats.last_run_ms
        totals["last_moves"] = [asdict(r) for r in done[-20:]]
        write_atomic(path, json.dumps(totals, indent=1).encode())

    # -- schedule ---------------------------------------------------------------------------
    def start(self) -> MigrationService:
        """Run the policy every ``storage.migrate.interval.ms`` in a daemon thread."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pafka-migration", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the service's thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def _loop(self) -> None:
        interval = self.store.config["storage.migrate.interval.ms"] / 1000.0
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # keep the service alive; the next run retries
                log.exception("migration run failed")
            self._stop.wait(interval)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the thread after the run in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> MigrationService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def read_stats(root: str) -> dict[str, Any]:
    """The totals the services of a store recorded (empty if none ran)."""
    try:
        with open(os.path.join(root, STATS_FILE), "rb") as f:
            return json.loads(f.read())
    except (FileNotFoundError, ValueError):
        return {}
