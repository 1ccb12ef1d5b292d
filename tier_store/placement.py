"""Where a new segment goes: the first local tier with room whose filesystem is not full.

A remote tier never takes appends. A tier whose filesystem answered ENOSPC (or EDQUOT) is
skipped until it has room for two segments again, so a full disk costs one failed write,
not one per append.

Room on a tier of fixed bytes is its capacity against the bytes the topics' states account
to it. Counting them loads every topic of the store, so it is done only for such a tier,
and at most every :data:`USAGE_MAX_AGE_S` seconds: between counts, the figure is the last
count plus a whole segment for each segment placed since, by any process of the host (the
ledger below). A count misses the segments other processes placed but have not committed
yet, so accounting stays soft by about one segment per concurrent writer. A pool tier counts
its free pool files; a tier without a capacity needs no count.

A new handle (a Spark task's process, a ``pafka`` command) would count on its first
segment. Each count is left at the root (``_tier_usage.json``), and a handle that finds one
at most :data:`SEED_MAX_AGE_S` old starts from it: placing a segment costs the same with one
topic or thousands. The file is also the processes' shared ledger: each placement, under
the flock of ``_tier_usage.lock``, reads it, checks the room, creates the segment and adds
the segment to it. So writers in several processes (Spark's Python workers) see each
other's new segments, and do not each fill the same room. The file is only a figure: a
damaged or strange one is ignored (counted instead), and a tier that looks full is
recounted. A store shared by many hosts keeps none (each host has its own first tier).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from .config import WHOLE_FILESYSTEM
from .errors import CorruptState, StoreFull
from .layout import file_lock, is_url, read_regular, write_atomic
from .tiers import NO_SPACE, SegmentWriter, Tier

log = logging.getLogger(__name__)

USAGE_MAX_AGE_S = 2.0
"""How old a count of the bytes on each tier may be when a segment is placed."""
SEED_MAX_AGE_S = 10.0
"""How old the count another handle left may be for a new handle to start from it."""
SEED_FILE = "_tier_usage.json"
LEDGER_LOCK = "_tier_usage.lock"


class Placement:
    """The placement rule over a store's tiers (one per store handle; thread-safe enough:
    the out-of-space set only ever loses or gains whole tier numbers)."""

    def __init__(self, root: str, tiers: list[Tier], count: Callable[[], Mapping[int, int]],
                 seeded: bool = True):
        self.root = root
        self._seed = os.path.join(root, SEED_FILE) if seeded and not is_url(root) else None
        self.tiers = tiers
        self._no_space: set[int] = set()
        self._count = count  # the committed bytes per tier, from every topic's state
        self._used: dict[int, int] | None = None
        self._counted_at = 0.0
        self._count_time = 0.0  # wall time of the count the figure starts from
        self._lock = threading.RLock()
        self.counts = 0  # full counts made: tests check that placing seldom needs one

    def used(self, recount: bool = False) -> dict[int, int]:
        """Bytes accounted per tier: a count at most :data:`USAGE_MAX_AGE_S` old (or made
        now, with ``recount``), plus the segments placed since, by any process (the ledger
        at the root) or by this handle."""
        with self._lock:
            if not recount:
                held = self._read_seed()
                if held is not None:
                    age, used, at = held
                    if self._used is None or age < USAGE_MAX_AGE_S:
                        # A new handle starts its own count's clock; a fresher ledger moves it.
                        self._counted_at = time.monotonic() - (age if self._used else 0.0)
                        self._used, self._count_time = used, at
            if recount or self._used is None or \
                    time.monotonic() - self._counted_at >= USAGE_MAX_AGE_S:
                self._used = dict(self._count())
                self._counted_at, self._count_time = time.monotonic(), time.time()
                self.counts += 1
                self._write_seed(self._used)
            return dict(self._used)

    @contextlib.contextmanager
    def _ledger(self) -> Iterator[None]:
        """Hold the ledger's flock (and this handle's lock): a placement's check, segment
        and reservation are one step for every process of the host."""
        with self._lock, contextlib.ExitStack() as stack:
            if self._seed is not None:
                try:
                    stack.enter_context(file_lock(os.path.join(self.root, LEDGER_LOCK)))
                except OSError as e:  # a read-only root: each process accounts for itself
                    log.debug("tier usage ledger not locked: %s", e)
            yield

    def _read_seed(self) -> tuple[float, dict[int, int], float] | None:
        """The ledger (its count's age, the figure, the count's time), if young enough and
        well formed; else None."""
        if self._seed is None:
            return None
        try:
            raw = read_regular(self._seed, CorruptState, "tier usage hint", follow=False)
            if raw is None:
                return None
            held = json.loads(raw)
            age = time.time() - held["time"]
            used = {int(k): v for k, v in held["used"].items()}
            if not 0 <= age <= SEED_MAX_AGE_S or not all(
                    type(v) is int and v >= 0 for v in used.values()):
                return None
            return age, used, float(held["time"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError, CorruptState) as e:
            log.debug("ignoring the tier usage hint %s: %s", self._seed, e)
            return None

    def _write_seed(self, used: dict[int, int]) -> None:
        if self._seed is None:
            return
        data = json.dumps({"time": self._count_time, "used": used}).encode()
        try:
            write_atomic(self._seed, data, durable=False)  # a hint: a crash may lose it
        except OSError as e:  # a read-only root, a full disk: the next handle counts
            log.debug("could not leave the tier usage hint %s: %s", self._seed, e)

    def place(self, topic: str, partition: int, seq: int, need: int,
              durable: bool = True) -> tuple[Tier, SegmentWriter]:
        """Create segment ``seq`` on the first local tier with room; :class:`StoreFull`
        naming every tier when none has room."""
        if not any(_counts_usage(t) for t in self.tiers):
            return self._place(topic, partition, seq, need, durable)
        with self._ledger():
            return self._place(topic, partition, seq, need, durable)

    def _place(self, topic: str, partition: int, seq: int, need: int,
               durable: bool) -> tuple[Tier, SegmentWriter]:
        used: dict[int, int] | None = None
        counted = False  # whether ``used`` was counted by this call
        for t in self.tiers:
            if t.is_remote or t.is_lake or self._out_of_space(t, need):
                continue
            if _counts_usage(t):
                if used is None:
                    used = self.used()
                if not t.has_room(used.get(t.number, 0), need) and not counted:
                    # The figure may be stale (segments moved or deleted since): a tier is
                    # full only by a count made now.
                    used, counted = self.used(recount=True), True
                if not t.has_room(used.get(t.number, 0), need):
                    continue
            elif not t.has_room(0, need):
                continue
            try:
                w = t.create_segment(topic, partition, seq, need, durable)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                self.mark_out_of_space(t, e)
                self._release_partial(t, topic, partition, seq)
                continue
            if w is not None:
                if _counts_usage(t) and self._used is not None:  # reserved whole, for all
                    self._used[t.number] = self._used.get(t.number, 0) + \
                        max(need, t.segment_bytes)
                    self._write_seed(self._used)
                return t, w
        now = self._count()
        usage = "; ".join(self._tier_line(t, now.get(t.number, 0)) for t in self.tiers)
        if len(self.tiers) == 1:  # nothing to migrate to: advise what can help
            raise StoreFull(
                f"no local tier has room for a new segment of topic {topic!r} partition "
                f"{partition} ({need} bytes): {usage}. The store has one tier, so nothing can "
                f"move away: raise its size (pafka resize {self.root} 1 SIZE, or -1 for its "
                "filesystem's free space), free space on its filesystem, lower "
                "log.retention.bytes/ms, or create the store with another tier "
                "(storage.tiers.types=FILE,HDD) for old segments to move to")
        raise StoreFull(
            f"no local tier has room for a new segment of topic {topic!r} partition "
            f"{partition} ({need} bytes): {usage}. Run the migration service (pafka migrate "
            f"{self.root} --follow, or pafka_source.start_migration) or speed it up "
            "(storage.migrate.threads, storage.migrate.bytes.per.second), lower "
            "log.retention.bytes/ms, or resize a tier (pafka resize)")

    @staticmethod
    def _release_partial(t: Tier, topic: str, partition: int, seq: int) -> None:
        """Remove what a segment creation that hit a full filesystem left on ``t`` (an
        empty file, a pool file taken): nothing references segment ``seq`` there yet (new
        numbers only grow, under the partition's lock), and the segment is made elsewhere."""
        try:
            t.release_segment(t.segment_path(topic, partition, seq))
        except OSError as e:
            log.warning("tier %d (%s): could not remove the unfinished segment %d of topic "
                        "%r partition %d: %s", t.number, t.path, seq, topic, partition, e)

    def _tier_line(self, t: Tier, used: int) -> str:
        used_of = f"{used} bytes used, sized by its filesystem" \
            if t.capacity == WHOLE_FILESYSTEM else \
            f"{used} of {t.capacity or 'unbounded'} bytes used"
        line = f"tier {t.number} ({t.type}, {t.path}): {used_of}"
        pool = t.free_pool_files()
        if pool is not None:
            line += f", {pool} free pool files"
        if t.is_lake:
            line = (f"tier {t.number} (LAKE, {t.path}): a Delta table per topic (takes sealed "
                    "segments from the migration service only)")
        elif t.is_remote:
            line += ", remote (takes sealed segments from the migration service only)"
        elif t.number in self._no_space:
            line += f", its filesystem is full ({t.free_bytes()} bytes free)"
        return line

    def mark_out_of_space(self, tier: Tier, error: OSError) -> None:
        """Record that ``tier``'s filesystem answered ENOSPC: new segments skip it until
        its filesystem has room for a segment again."""
        if tier.number not in self._no_space:
            log.warning("tier %d (%s) is out of space (%s): new segments go to the next "
                        "local tier with room until space returns", tier.number, tier.path,
                        os.strerror(error.errno or 0))
        self._no_space.add(tier.number)

    def _out_of_space(self, tier: Tier, need: int) -> bool:
        if tier.number not in self._no_space:
            return False
        free = tier.free_bytes()
        if free is not None and free >= 2 * max(need, tier.segment_bytes):
            self._no_space.discard(tier.number)
            log.info("tier %d (%s) has room again (%d bytes free)", tier.number, tier.path,
                     free)
            return False
        return True


def _counts_usage(t: Tier) -> bool:
    """Whether ``t.has_room`` needs the bytes accounted to ``t``: a capacity, no pool."""
    return t.capacity > 0 and not t.has_pool


__all__ = ["SEED_FILE", "SEED_MAX_AGE_S", "USAGE_MAX_AGE_S", "Placement"]
