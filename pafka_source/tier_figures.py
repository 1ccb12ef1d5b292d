"""The numbers behind the notebooks' tier figures, as plain data: no matplotlib needed.

A tier's usage is counted the way the migration policy counts it (``migration.store_views``):
on a pmem tier each segment takes a whole pool file and the capacity is the pool; elsewhere
committed bytes against the configured size (0: unbounded). So a bar drawn from these numbers
crosses the threshold line exactly when the service starts moving segments down.

:mod:`pafka_source.tier_plots` draws them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from migration import MigrationService, store_views
from tier_store import PafkaError, Store, Topic

__all__ = ["TierSampler", "freshness", "human_size", "order_violations", "pool_files",
           "segment_ages", "tier_snapshot", "topic_segments", "topic_tier_bytes"]

log = logging.getLogger(__name__)

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_size(n: float) -> str:
    """A byte count in binary units with up to three significant digits, never rounded to
    zero: ``262144`` is ``"256 KiB"``, ``1572864`` is ``"1.5 MiB"``."""
    sign, n = ("-" if n < 0 else ""), abs(float(n))
    unit = _UNITS[0]
    for unit in _UNITS:
        if n < 1024 or unit == _UNITS[-1]:
            break
        n /= 1024
    if unit == "B":
        return f"{sign}{int(n)} B"
    digits = 0 if n >= 100 else 1 if n >= 10 else 2
    return f"{sign}{f'{n:.{digits}f}'.rstrip('0').rstrip('.')} {unit}"


def tier_snapshot(store: Store) -> dict[str, Any]:
    """Each tier's capacity and usage in the policy's terms, with the threshold band.

    ``band`` is (low, high) of ``storage.migrate.threshold[.low/.high]`` ((-1, -1): migration
    off). Per tier: ``capacity`` (0: unbounded), ``used`` (policy terms), ``committed``
    (bytes of the segments on it), ``segments``, ``pool_free`` (pmem only), ``size`` (the
    configured size) and ``thresholds``: the band in bytes where the policy applies one (a
    bounded tier that is not the last), else None."""
    low, high = MigrationService(store).band()
    _, views = store_views(store)
    usage = {u["tier"]: u for u in store.tier_usage()}
    last = max(v.number for v in views)
    tiers = []
    for v in views:
        u = usage[v.number]
        bounded = v.capacity > 0 and v.number != last and low >= 0
        tiers.append({
            "tier": v.number, "type": u["type"], "capacity": v.capacity, "size": u["capacity"],
            "used": v.used, "committed": u["used"], "segments": u["segments"],
            "pool_file": v.pool_file, "pool_free": u.get("pool_free"),
            "thresholds": [low * v.capacity, high * v.capacity] if bounded else None})
    return {"time": time.time(), "band": [low, high],
            "segment_bytes": store.config["log.segment.bytes"], "tiers": tiers}


def segment_ages(store: Store, now: float | None = None) -> list[dict[str, Any]]:
    """Every segment of every topic: topic, partition, id, tier, base offset, bytes, the
    most its file takes (``file_bytes``), whether it is sealed, and its age in seconds (since
    its newest record was committed)."""
    now = time.time() if now is None else now
    return [row for name in store.topics() for row in topic_segments(store.topic(name), now)]


def topic_segments(topic: Topic, now: float | None = None) -> list[dict[str, Any]]:
    """One topic's rows of :func:`segment_ages`."""
    now = time.time() if now is None else now
    return [{"topic": topic.name, "partition": s.partition, "id": s.id, "tier": s.tier,
             "base_offset": s.base_offset, "bytes": s.bytes, "file_bytes": s.file_bytes,
             "sealed": s.sealed, "age_s": max(0.0, now - s.last_timestamp / 1000.0)}
            for s in topic.segments()]


def order_violations(ages: list[dict[str, Any]]) -> list[str]:
    """Sealed segments (rows of :func:`segment_ages`) on a slower tier holding offsets above
    a sealed one on a faster tier of the same partition: the order the migration keeps."""
    by_part: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for a in ages:
        if a["sealed"]:
            by_part.setdefault((a["topic"], a["partition"]), []).append(a)
    out = []
    for (topic, p), segs in sorted(by_part.items()):
        for fast in segs:
            newer = [s for s in segs if s["tier"] > fast["tier"]
                     and s["base_offset"] > fast["base_offset"]]
            if newer:
                out.append(f"{topic}/{p}: {newer[0]['id']} on tier {newer[0]['tier']} "
                           f"is newer than {fast['id']} on tier {fast['tier']}")
    return out


def freshness(ages: list[dict[str, Any]], pool_files: Mapping[int, int] | None = None
              ) -> dict[str, Any]:
    """Whether the sealed segments keep the freshness order: within each partition, none on
    a slower tier holds newer offsets than one on a faster tier (``partition_order``), and
    across all of them, none on a slower tier is younger than one on a faster tier
    (``age_order``). ``violations`` names the offending pairs (at most ten).

    As in the policy, a segment whose file is bigger than a faster pmem tier's pool file
    (``pool_files``: tier -> pool file size) can never go there: it and the older segments
    of its partition are left out of the age order, and listed in ``exempt``."""
    sealed = [a for a in ages if a["sealed"]]
    violations = order_violations(sealed)
    partition_order = not violations
    age_order, exempt = True, set()
    tiers = sorted({a["tier"] for a in sealed})
    for faster in tiers[:-1]:
        limit = (pool_files or {}).get(faster, 0)
        slower = [a for a in sealed if a["tier"] > faster]
        if limit:
            # Per partition, the newest offset of a segment too big for a pool file.
            cut: dict[tuple[str, int], int] = {}
            for a in slower:
                if a["file_bytes"] > limit:
                    key = (a["topic"], a["partition"])
                    cut[key] = max(cut.get(key, -1), a["base_offset"])
            never = [a for a in slower
                     if a["base_offset"] <= cut.get((a["topic"], a["partition"]), -1)]
            exempt |= {f"{a['topic']}/{a['id']}" for a in never}
            slower = [a for a in slower if a not in never]
        if not slower:
            continue
        oldest_fast = max(a["age_s"] for a in sealed if a["tier"] == faster)
        youngest = min(slower, key=lambda a: a["age_s"])
        # Ages come from commit times in ms: allow the same millisecond.
        if youngest["age_s"] < oldest_fast - 0.001:
            age_order = False
            violations.append(f"{youngest['topic']}/{youngest['id']} on tier "
                              f"{youngest['tier']} is {youngest['age_s']:.3f} s old, younger "
                              f"than a tier-{faster} segment ({oldest_fast:.3f} s)")
    return {"partition_order": partition_order, "age_order": age_order,
            "held": partition_order and age_order, "violations": violations[:10],
            "exempt": sorted(exempt)}


def pool_files(snapshot: dict[str, Any]) -> dict[int, int]:
    """Tier -> pool file size of the pmem tiers of a :func:`tier_snapshot`."""
    return {t["tier"]: t["pool_file"] for t in snapshot["tiers"] if t["pool_file"]}


def topic_tier_bytes(store: Store) -> dict[str, dict[int, int]]:
    """Committed bytes of each topic on each tier (every tier listed, 0 when empty)."""
    numbers = [u["tier"] for u in store.tier_usage()]
    out = {}
    for name in store.topics():
        per = dict.fromkeys(numbers, 0)
        for s in store.topic(name).segments():
            per[s.tier] += s.bytes
        out[name] = per
    return out


class TierSampler:
    """Samples tier usage (:func:`tier_snapshot`) and the bytes moved between tiers every
    ``interval`` seconds in a daemon thread, for plots over time.

    Each sample: ``t`` (seconds since :meth:`start`), ``tiers`` (the snapshot's), ``down``
    and ``up`` (bytes of the segments seen on a slower, or faster, tier than at the sample
    before: moves as the commit log shows them, whoever made them), and whatever
    ``extra()`` returns."""

    def __init__(self, store: Store, interval: float = 0.1,
                 extra: Callable[[], dict[str, Any]] | None = None):
        self.store, self.interval, self.extra = store, interval, extra
        self.samples: list[dict[str, Any]] = []
        self.start_time = time.time()
        self.down = self.up = 0
        self._seen: dict[tuple[str, str], int] = {}  # (topic, segment id) -> tier
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, Any]:
        """Take one sample now (and keep it)."""
        extra = self.extra() if self.extra else {}
        seen = {}
        for name in self.store.topics():
            for s in self.store.topic(name).segments():
                key = (name, s.id)
                seen[key] = s.tier
                was = self._seen.get(key, s.tier)  # a merge keeps its first segment's id
                if s.tier > was:
                    self.down += s.bytes
                elif s.tier < was:
                    self.up += s.bytes
        self._seen = seen
        row = {"t": time.time() - self.start_time, "tiers": tier_snapshot(self.store)["tiers"],
               "down": self.down, "up": self.up, **extra}
        self.samples.append(row)
        return row

    def start(self) -> TierSampler:
        """Start sampling; ``t`` counts from now."""
        self.start_time = time.time()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pafka-tier-sampler",
                                        daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except (PafkaError, OSError) as e:  # a file moved away mid-sample: skip it
                log.debug("tier sample skipped: %s", e)
            self._stop.wait(self.interval)

    def stop(self) -> list[dict[str, Any]]:
        """Stop sampling (after one last sample); returns the samples."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        self.sample()
        return self.samples
