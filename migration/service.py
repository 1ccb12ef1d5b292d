"""The migration service: applies the policy on a schedule, using the store's public API.

It runs in a long-lived Python process (``pafka migrate ROOT --follow``) or as a thread of the
user's driver program (``MigrationService(store).start()``). Several services may run on one
store: each move is an optimistic commit, so two never both move a segment, and none holds a
lock that a crash could leave behind.

Each run:

1. **Retention** on every topic (``log.retention.bytes``/``.ms``, the topic's own values when
   it was created with them), as Kafka's log cleaner thread does: a topic nobody writes to
   any more still loses its expired segments. Retention is not migration: it runs even when
   ``storage.migrate.threshold`` is -1. One topic's failure stops no other.
2. Seal active segments idle longer than ``log.segment.ms`` (so quiet topics migrate too) and
   reclaim files past the grace period.
3. Plan with :func:`~migration.policy.plan_moves` (the freshness order across all tiers).
4. **Demotions first**, in :func:`~migration.policy.demotion_phases`' order (tier 1's drain
   never waits for a lake's conversion it does not need); one off a pmem tier gives its pool
   file back at once. Then **promotions**, the fastest target tier first; those to a pmem
   tier beyond its free pool files wait for a later run (newest first). Each phase uses
   ``storage.migrate.threads`` threads within ``storage.migrate.bytes.per.second``.
5. Reclaim again, and add the run to the store's totals
   (:meth:`tier_store.Store.save_migration_totals`, shown by ``pafka tiers``).

On a store shared by many hosts (an ``s3://`` root, tier 1 on each host, then a REMOTE tier
every host reaches) the service runs once per store, in the driver, and **compacts**: step 3
plans with :func:`~migration.policy.plan_compaction` (every tier-1 segment of any host that
the log shows sealed, to the shared tier, oldest first; ``storage.migrate.threshold`` does not
stop it, since every bundle stays until its segment is compacted), the copies read the
chunks from their bundles, and step 5 also deletes the bundles no committed chunk names and
evicts this host's own tier 1 (:meth:`tier_store.Store.evict_local`). Retention is as above.

Nothing is planned out of a LAKE tier (see :mod:`tier_store.maintenance.demote`).

A segment whose file cannot be read (gone with a tier on RAM after a reboot, or corrupt)
affects only itself: its move is skipped with a warning naming it, it is not planned again for
a while (a back-off from ``FAILED_RETRY_S`` doubling up to ``FAILED_RETRY_MAX_S``), and every
other segment still migrates. A merge holding such a segment moves its others one by one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tier_store import (
    CommitConflict,
    CorruptLog,
    CorruptSegment,
    CorruptState,
    DataLoss,
    MoveResult,
    OldCopyInGrace,
    PafkaError,
    SegmentId,
    Store,
    StoreFull,
    apply_lake_retention,
    seal_idle,
)

from . import policy
from .policy import Move, SegmentView, TierView, plan_compaction, plan_moves
from .stats import MigrationStats, read_stats, save_run
from .throttle import Throttle

__all__ = ["FAILED_RETRY_MAX_S", "FAILED_RETRY_S", "MigrationService", "MigrationStats",
           "Throttle", "read_stats", "store_views"]

log = logging.getLogger(__name__)

# A segment whose file cannot be read is planned again only after this many seconds, doubled
# on each further failure up to FAILED_RETRY_MAX_S (a missing file rarely comes back).
FAILED_RETRY_S = 60.0
FAILED_RETRY_MAX_S = 3600.0


def store_views(store: Store) -> tuple[list[SegmentView], list[TierView]]:
    """The policy's view of a store: every committed segment, every tier's usage.

    A tier's usage is counted the policy's way, so that a move changes it by exactly what
    the policy expects: a pool file per segment on a pmem tier, committed bytes elsewhere."""
    segs: list[SegmentView] = []
    for name in store.topics():
        try:
            segments = store.topic(name).segments()
            # On a shared store the hosts' pointers are not visible here: the log decides.
            ready = store.compactable(name) if store.is_shared else None
        except (CorruptLog, CorruptState) as e:  # one topic's damage stops no other
            log.warning("topic %s: not migrated, its commit log is damaged: %s", name, e)
            continue
        for s in segments:
            # A segment with chunks a writer may still commit waits: moving it would make
            # that commit fail. Nothing leaves a lake.
            movable = s.sealed and s.settled if ready is None else s.id in ready
            movable = movable and not store.tier(s.tier).is_lake
            segs.append(SegmentView(name, s.id, s.partition, SegmentId.parse(s.id).seq, s.tier,
                                    s.bytes, s.last_timestamp, movable, s.file_bytes))
    tiers = []
    seg_bytes = store.config["log.segment.bytes"]
    for u in store.tier_usage():
        on_tier = [s for s in segs if s.tier == u["tier"]]
        if store.tier(u["tier"]).has_pool:
            # pmem: capacity is the pool; usage the pool files of live segments (a file whose
            # segment moved away is leaving: it returns to the pool after the grace period).
            tiers.append(TierView(u["tier"], u["pool_files"] * seg_bytes,
                                  len(on_tier) * seg_bytes, seg_bytes))
        else:
            tiers.append(TierView(u["tier"], u["capacity"], sum(s.bytes for s in on_tier)))
    return segs, tiers


class MigrationService:
    """Keeps the freshest data on the fastest tiers, and applies retention, on a schedule."""

    def __init__(self, store: Store, on_move: Callable[[MoveResult], None] | None = None):
        self.store = store
        self.stats = MigrationStats()
        self._on_move = on_move
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # (topic, segment id, tier) -> (time.monotonic() to plan it again at, back-off in s)
        self._unreadable: dict[tuple[str, str, int], tuple[float, float]] = {}
        self._unreadable_lock = threading.Lock()
        # (topic, segment id, target tier) of moves refused while the segment's old file on
        # the target tier is in its grace period: logged once (at info), not on every run.
        self._in_grace: set[tuple[str, str, int]] = set()
        self._reopened: Store | None = None  # a handle this service opened (and closes)

    # -- configuration ----------------------------------------------------------------------
    def band(self) -> tuple[float, float]:
        """The (low, high) fill band of ``storage.migrate.threshold[.low/.high]``;
        (-1, -1) when migration is disabled (:func:`~migration.policy.fill_band`)."""
        return policy.fill_band(self.store.config)

    # -- one run ----------------------------------------------------------------------------
    def plan(self) -> list[Move]:
        """The moves the policy makes now, leaving out segments waiting out a back-off."""
        return self._plan()[0]

    def _plan(self) -> tuple[list[Move], list[TierView]]:
        low, high = self.band()
        segs, tiers = store_views(self.store)
        now = time.monotonic()
        with self._unreadable_lock:
            live = {(s.topic, s.id, s.tier) for s in segs}
            for key in [k for k in self._unreadable if k not in live]:
                del self._unreadable[key]  # deleted (retention), or moved by another service
            ids = {(s.topic, s.id) for s in segs}
            self._in_grace = {k for k in self._in_grace if k[:2] in ids}
            # A segment that failed to move for an unreadable file waits out its back-off:
            # seen as not movable, it still counts in its tier's usage and breaks merge runs.
            segs = [dataclasses.replace(s, sealed=False)
                    if self._unreadable.get((s.topic, s.id, s.tier), (0.0, 0.0))[0] > now else s
                    for s in segs]
        if self.store.is_shared:
            return plan_compaction(segs, max(t.number for t in tiers)), tiers
        return plan_moves(segs, tiers, low, high, self.store.config["log.segment.bytes"]), tiers

    def run_once(self) -> list[MoveResult]:
        """Apply retention, seal idle segments, plan, move (demotions, then promotions),
        reclaim; returns the moves made. Retention runs even when migration is disabled
        (``storage.migrate.threshold=-1``): it is not migration (Kafka's log cleaner)."""
        with self._lock:
            self._follow_relocation()
            deleted = sum(len(ids) for ids in self._apply_retention().values())
            low, _ = self.band()
            if low < 0 and not self.store.is_shared:
                self._collect_garbage()  # the files retention deleted, after their grace
                self._finish_run([], deleted)
                return []
            idle = self.store.config["log.segment.ms"]
            for name in self.store.topics():
                try:
                    topic = self.store.topic(name)
                    self.stats.sealed_idle += len(seal_idle(topic, idle))
                    # Files past their grace period free room (pool files) before planning.
                    self.store.collect_garbage(topic)
                except (PafkaError, OSError) as e:  # one topic's trouble stops no other
                    log.warning("topic %s: sealing idle segments or garbage collection "
                                "failed: %s", name, e)
            moves, tiers = self._plan()
            ups = [m for m in moves if not m.down]
            done: list[MoveResult] = []
            for batch in policy.demotion_phases(moves, tiers):
                done += self._execute(batch)
            if ups:
                self._collect_garbage()  # pool files a reader pinned may be free by now
                free = {u["tier"]: u["pool_free"] for u in self.store.tier_usage()
                        if self.store.tier(u["tier"]).has_pool}
                for target in sorted({m.target for m in ups}):
                    batch = [m for m in ups if m.target == target]  # newest first
                    if target in free and len(batch) > free[target]:
                        log.info("%d promotions to tier %d wait for pool files (freed ones "
                                 "return to the pool once no reader maps them)",
                                 len(batch) - max(0, free[target]), target)
                        batch = batch[:max(0, free[target])]
                    done += self._execute(batch)
            self._collect_garbage(last=True)
            self._finish_run(done, deleted)
            return done

    def apply_retention(self) -> dict[str, list[str]]:
        """Apply retention to every topic now (``Topic.apply_retention``, with the topic's
        own retention settings); returns the deleted segment ids by topic. A topic whose
        retention fails is logged and skipped. :meth:`run_once` does this first."""
        with self._lock:
            self._follow_relocation()
            return self._apply_retention()

    def _apply_retention(self) -> dict[str, list[str]]:
        deleted: dict[str, list[str]] = {}
        for name in self.store.topics():
            try:
                ids = self.store.topic(name).apply_retention()
                self._lake_retention(name)
            except Exception as e:  # one topic's trouble stops no other
                log.warning("topic %s: applying retention failed: %s: %s", name,
                            type(e).__name__, e)
                continue
            if ids:
                deleted[name] = ids
        n = sum(len(ids) for ids in deleted.values())
        self.stats.segments_deleted += n
        if n:
            log.info("retention deleted %d segments: %s", n, ", ".join(
                f"{name}/{sid}" for name, ids in deleted.items() for sid in ids))
        return deleted

    def _lake_retention(self, name: str) -> None:
        try:  # the log's retention is done whatever happens here; the table's waits a run
            apply_lake_retention(self.store.topic(name), scheduled=True)
        except Exception as e:
            log.warning("topic %s: lake retention failed: %s: %s", name, type(e).__name__, e)

    def _collect_garbage(self, last: bool = False) -> None:
        """Reclaim files past their grace; on a run's ``last`` pass on a shared store, also
        bundles no chunk names, and this host's tier-1 copies beyond the threshold."""
        sweep = last and self.store.is_shared
        for name in self.store.topics():
            try:
                self.store.collect_garbage(self.store.topic(name), bundles=sweep)
            except (PafkaError, OSError) as e:
                log.warning("topic %s: garbage collection failed: %s", name, e)
        if sweep:
            try:
                self.store.evict_local()
            except (PafkaError, OSError) as e:
                log.warning("evicting this host's tier 1 failed: %s", e)
        try:
            # Files of deleted topics that readers pinned when the topic was deleted.
            self.store.reclaim_deleted()
        except (PafkaError, OSError) as e:
            log.warning("reclaiming deleted topics' files failed: %s", e)

    def _finish_run(self, done: list[MoveResult], deleted: int) -> None:
        self.stats.runs += 1
        self.stats.last_run_ms = int(time.time() * 1000)
        self.stats.tiers = self.store.tier_usage()
        save_run(self.store, done, deleted, self.stats.last_run_ms)

    def _follow_relocation(self) -> None:
        """After ``pafka relocate`` moved a tier, this handle's writes to the old place would
        be refused on every run: open the store again, on the tiers' new places."""
        if not self.store.relocated():
            return
        log.info("a tier of the store at %s was relocated: the migration service opens the "
                 "store again", self.store.root)
        old, self.store = self.store, self.store.reopen()
        if old is self._reopened:
            old.close()
        self._reopened = self.store

    def _execute(self, moves: list[Move]) -> list[MoveResult]:
        if not moves:
            return []
        throttle = Throttle(self.store.config["storage.migrate.bytes.per.second"])
        threads = self.store.config["storage.migrate.threads"]

        def one(m: Move) -> list[MoveResult]:
            r, unreadable = self._move(m, throttle)
            if r is not None:
                return [r]
            if not unreadable or len(m.segments) == 1:
                return []
            # A merge with an unreadable source: move the sources one by one, so that only
            # the unreadable one stays behind (and waits out its back-off).
            singles = (self._move(dataclasses.replace(m, segments=(sid,)), throttle)[0]
                       for sid in m.segments)
            return [x for x in singles if x is not None]

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pafka-migrate") as ex:
            results = list(ex.map(one, moves))
        done = []
        for rs in results:
            if not rs:
                self.stats.failed_moves += 1
            for r in rs:
                done.append(r)
                self.stats.count(r)
                if self._on_move is not None:
                    self._on_move(r)
        return done

    def _move(self, m: Move, throttle: Throttle) -> tuple[MoveResult | None, bool]:
        """Carry out one move; returns (its result or None, whether it failed because a
        source file is unreadable). Never raises for one segment's trouble."""
        what = f"{m.topic}/{','.join(m.segments)}"
        try:
            r = self.store.move_segment(m.segments[0], m.target, merge_with=m.segments[1:],
                                        topic=m.topic, throttle=throttle)
        except (DataLoss, CorruptSegment, OSError) as e:
            # Persistent until someone restores or deletes the segment: reads of it fail
            # too, but it must not stop the other segments from migrating.
            if len(m.segments) == 1:
                backoff = self._mark_unreadable((m.topic, m.segments[0], m.source))
                log.warning("move of %s to tier %d failed: %s; not planned again for %.0f s",
                            what, m.target, e, backoff)
            else:
                log.warning("merge of %s to tier %d failed: %s; moving them one by one",
                            what, m.target, e)
            return None, True
        except OldCopyInGrace as e:
            # Expected after a segment came back up and goes down again: it moves once the
            # grace period of its old file there is over (or the file is adopted).
            key = (m.topic, m.segments[0], m.target)
            with self._unreadable_lock:
                first = key not in self._in_grace
                self._in_grace.add(key)
            log.log(logging.INFO if first else logging.DEBUG,
                    "move of %s to tier %d waits: %s", what, m.target, e)
            return None, False
        except (CommitConflict, StoreFull, PafkaError) as e:
            log.warning("move of %s to tier %d skipped: %s", what, m.target, e)
            return None, False
        with self._unreadable_lock:
            for sid in m.segments:
                self._unreadable.pop((m.topic, sid, m.source), None)
                self._in_grace.discard((m.topic, sid, m.target))
        if self.store.tier(m.source).has_pool:  # freed pool files back now, not at run end
            with contextlib.suppress(PafkaError, OSError):  # the run's end collects again
                self.store.collect_garbage(self.store.topic(m.topic), tier=m.source)
        return r, False

    def _mark_unreadable(self, key: tuple[str, str, int]) -> float:
        """Hold segment ``key`` (topic, id, tier) back from planning for a doubling
        back-off; returns it in seconds."""
        with self._unreadable_lock:
            _, last = self._unreadable.get(key, (0.0, FAILED_RETRY_S / 2))
            backoff = min(FAILED_RETRY_MAX_S, last * 2)
            self._unreadable[key] = (time.monotonic() + backoff, backoff)
        return backoff

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
        """Stop the thread after the run in progress, and close the handle the service
        opened itself after a relocation (the one it was given is the caller's)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            if self._reopened is not None:
                self._reopened.close()

    def __enter__(self) -> MigrationService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

