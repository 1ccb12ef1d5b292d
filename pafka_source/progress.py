"""How far a streaming query's pafka sources are behind their topics, batch by batch.

A Python stream reader cannot fill ``metrics`` in a query's progress, nor name itself in
``description`` (PySpark 4.3's ``PythonMicroBatchStream`` has no ``ReportsSourceMetrics`` and
keeps the JVM's own ``toString``). Each source's ``endOffset`` and ``latestOffset`` do reach
the progress: they name the topics, and the reader adds its lag under ``_lag`` in
``latestOffset`` (:func:`lag_report`).

:func:`track_lag` adds a :class:`~pyspark.sql.streaming.StreamingQueryListener` that turns
each progress into a :class:`LagSample` per pafka source: records and bytes behind the
topic's latest offsets, read from the store as the progress arrives, and the share of the
batch's bytes on tier 1. It keeps the samples (``latest``, ``history``) and logs each one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tier_store import Store, StoreNotFound, Topic, TopicNotFound

from .groups import TrackedSource, _pafka_options, listener_for, sources_of

log = logging.getLogger(__name__)

LAG_KEY = "_lag"  # the key of the reader's lag report in a source's latestOffset
HISTORY = 10_000  # samples kept per tracker: the oldest go first
FLUSH_TIMEOUT_S = 10.0  # how long history() waits for Spark to deliver posted events


@dataclass(frozen=True)
class TopicLag:
    """One topic's lag behind its latest offsets, and where the batch's bytes were."""

    topic: str
    records: int  # records behind the latest offsets, every partition
    bytes: int  # their approximate bytes (whole chunks, pro rata at the ends)
    partitions: dict[int, int]  # records behind, by partition
    batch_bytes: int = 0  # approximate bytes of the batch's records
    tier1_bytes: int = 0  # of those, the bytes in segments on tier 1

    @property
    def tier1_share(self) -> float | None:
        """The share of the batch's bytes on tier 1 (None for an empty batch)."""
        return self.tier1_bytes / self.batch_bytes if self.batch_bytes else None


@dataclass(frozen=True)
class LagSample:
    """A pafka source of a query after one micro-batch (see :func:`track_lag`)."""

    query_id: str
    query_name: str | None
    batch_id: int
    time: float  # seconds since the epoch when the progress arrived
    source: str  # names the store and the topics, e.g. "pafka clicks at /data/store"
    input_rows: int  # the batch's rows, from Spark's progress
    topics: dict[str, TopicLag] = field(default_factory=dict)

    @property
    def records(self) -> int:
        """Records behind the latest offsets, every topic."""
        return sum(t.records for t in self.topics.values())

    @property
    def bytes(self) -> int:
        """Approximate bytes behind the latest offsets, every topic."""
        return sum(t.bytes for t in self.topics.values())

    @property
    def tier1_share(self) -> float | None:
        """The share of the batch's bytes read from tier 1 (None for an empty batch)."""
        total = sum(t.batch_bytes for t in self.topics.values())
        return sum(t.tier1_bytes for t in self.topics.values()) / total if total else None

    def describe(self) -> str:
        """One line for a log."""
        share = self.tier1_share
        where = "" if share is None else f"; {share:.0%} of the batch on tier 1"
        return (f"query {self.query_name or self.query_id} batch {self.batch_id}, {self.source}: "
                f"{self.records} records ({self.bytes} bytes) behind the latest offsets{where}")


def topic_lag(topic: Topic, start: dict[str, int] | None, end: dict[str, int],
              batch_known: bool = True) -> TopicLag:
    """``topic``'s lag after a batch ``[start, end)`` (offsets by partition as strings; no
    ``start``: the batch started at the earliest offsets). A partition ``end`` lacks (new
    since) lags from its earliest offset. Without ``batch_known`` the batch's bytes are not
    measured (its tier-1 share is None).

    Segments come from the commit log's state, not their files: a measurement reads no
    segment and cannot fail on one being moved."""
    st = topic.state()  # one refresh; then O(partitions + chunks in the batch)
    latest = dict(enumerate(st.next_offset))
    earliest = st.start_offset
    behind: dict[int, int] = {}
    nbytes = 0
    for p, hi in latest.items():
        at = min(max(int(end.get(str(p), earliest[p])), earliest[p]), hi)
        behind[p] = hi - at
        if hi > at:
            nbytes += topic.bytes_between(p, at, hi)
    batch = tier1 = 0
    if batch_known and (start is not None or end):
        ranges = []
        begin = start or {}
        for p_s, e in end.items():
            p = int(p_s)
            if p < len(earliest):
                ranges.append((p, max(int(begin.get(p_s, earliest[p])), earliest[p]), e))
        # Only the batch's chunks: not every segment of the partition.
        by_tier = topic.bytes_by_tier(ranges)
        batch, tier1 = sum(by_tier.values()), by_tier.get(1, 0)
    return TopicLag(topic.name, sum(behind.values()), nbytes, behind, batch, tier1)


def lag_report(topics: dict[str, Topic], start: dict[str, Any], end: dict[str, Any]
               ) -> dict[str, dict[str, Any]]:
    """What a stream reader puts under :data:`LAG_KEY` in its latest offsets: for each topic,
    the records and bytes behind after the batch ``[start, end)`` it planned, and the share
    of the batch's bytes on tier 1 (null for an empty batch)."""
    out = {}
    for name, parts in end.items():
        t = topics.get(name)
        if t is None or name.startswith("_") or not isinstance(parts, dict):
            continue
        lag = topic_lag(t, start.get(name), parts)
        share = lag.tier1_share
        out[name] = {"records": lag.records, "bytes": lag.bytes,
                     "tier1Share": None if share is None else round(share, 4)}
    return out


def _offsets(raw: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class LagTracker:
    """Keeps a :class:`LagSample` per pafka source of each query's progress (driver side).

    Thread-safe; Spark calls it on its listener thread. Use :func:`track_lag`."""

    def __init__(self, spark: Any):
        self._spark = spark
        self._sources: dict[str, list[TrackedSource]] = {}
        self._stores: dict[str, Store] = {}
        self._history: list[LagSample] = []
        self._lock = threading.Lock()

    def on_start(self, query_id: str) -> None:
        """Learn a starting query's pafka sources while it still runs."""
        with self._lock:
            self._known(query_id)

    def _known(self, query_id: str) -> list[TrackedSource] | None:
        if query_id not in self._sources:
            options = _pafka_options(self._spark, query_id)
            if options is None:
                return None
            self._sources[query_id] = sources_of(options)
        return self._sources[query_id]

    def forget(self, query_id: str) -> None:
        """Drop a stopped query's sources (its samples stay)."""
        with self._lock:
            self._sources.pop(query_id, None)

    def on_progress(self, progress: Any) -> list[LagSample]:
        """The samples of one progress event, kept and logged."""
        with self._lock:
            sources = self._known(str(progress.id))
            if not sources:
                return []
            out = []
            for sp in progress.sources:
                sample = self._sample(progress, sp, sources)
                if sample is not None:
                    out.append(sample)
                    log.info("%s", sample.describe())
            self._history.extend(out)
            del self._history[:-HISTORY]
            return out

    def _sample(self, progress: Any, sp: Any, sources: list[TrackedSource]
                ) -> LagSample | None:
        end, start = _offsets(sp.endOffset), _offsets(sp.startOffset)
        started, start = start is not None, start or {}
        if end is None:
            return None
        names = [n for n, v in end.items() if not n.startswith("_") and isinstance(v, dict)]
        readers = {s for s in sources for n in names if s.reads(n)}
        if len(readers) != 1 or "_ids" not in end:
            return None  # not a pafka source, or not known for sure which one
        src = readers.pop()
        # A query's first progress has no start: its batch began at the starting offsets,
        # known here only when they are the earliest.
        known = started or (src.starting or "").strip().lower() == "earliest"
        store = self._store(src.root)
        if store is None:
            return None
        ids = end["_ids"] if isinstance(end["_ids"], dict) else {}
        lags = {}
        for name in names:
            try:
                t = store.topic(name).refresh()
            except TopicNotFound:
                continue  # deleted since
            if ids.get(name) and t.id != ids[name]:
                continue  # created again since: these offsets are of the old topic
            lags[name] = topic_lag(t, start.get(name) if name in start else None, end[name],
                                   batch_known=known)
        return LagSample(str(progress.id), progress.name, int(progress.batchId), time.time(),
                         f"pafka {', '.join(names)} at {src.root}",
                         int(progress.numInputRows), lags)

    def _store(self, root: str) -> Store | None:
        store = self._stores.get(root)
        if store is None:
            try:
                store = self._stores[root] = Store.open(root, create=False)
            except StoreNotFound:
                return None  # deleted since: never create a store to measure it
        return store

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
        """Wait until Spark has delivered every progress event posted so far (a query's last
        one arrives after ``awaitTermination`` returns); False if it could not tell."""
        try:
            bus = self._spark.sparkContext._jsc.sc().listenerBus()
            bus.waitUntilEmpty(int(timeout_s * 1000))
            return True
        except Exception as e:  # Py4J errors: Spark Connect, a stopped session, a timeout
            log.debug("progress events not flushed: %s", e)
            return False

    def history(self, query: str | None = None, flush: bool = True) -> list[LagSample]:
        """The samples, oldest first; of one query (its id or name) when given. With
        ``flush``, the progress events Spark posted before the call are delivered first
        (:meth:`flush`); a listener of your own must pass ``flush=False``, as Spark calls
        listeners one at a time."""
        if flush:
            self.flush()
        with self._lock:
            return [s for s in self._history
                    if query is None or query in (s.query_id, s.query_name)]

    def latest(self, query: str | None = None, flush: bool = True) -> LagSample | None:
        """The newest sample (of one query, by id or name, when given), or None; ``flush``
        as in :meth:`history`."""
        found = self.history(query, flush)
        return found[-1] if found else None


def track_lag(spark: Any) -> LagTracker:
    """Measure every streaming query's pafka sources after each micro-batch.

    Adds a listener to ``spark``'s streaming query manager (a second call returns the first
    tracker) and returns its :class:`LagTracker`; ``tracker.listener`` is what
    ``spark.streams.removeListener`` takes. Samples are logged at INFO by this module."""
    existing = getattr(spark, "_pafka_lag_tracker", None)
    if existing is not None:
        return existing
    tracker = LagTracker(spark)
    tracker.listener = listener_for(tracker, "lag not measured")  # type: ignore[attr-defined]
    spark.streams.addListener(tracker.listener)  # type: ignore[attr-defined]
    spark._pafka_lag_tracker = tracker
    return tracker


__all__ = ["LAG_KEY", "LagSample", "LagTracker", "TopicLag", "lag_report", "topic_lag",
           "track_lag"]
