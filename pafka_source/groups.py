"""Consumer-group positions recorded from the driver, as each micro-batch finishes.

A streaming source learns that a micro-batch finished only when Spark calls its ``commit`` at
the start of the next one, so a group recorded by the source alone lags one batch, and the
last batch of a stopped query is never recorded. :func:`track_groups` adds a
:class:`~pyspark.sql.streaming.StreamingQueryListener` to the session: on each query's
progress it records, for every pafka source read with ``consumerGroup``, the batch's end
offsets as the group's position. Once a query has read everything and stopped, its group
shows no lag.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any

from tier_store import PafkaError, Store, StoreNotFound, TopicNotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackedSource:
    """A pafka source of a query, and the consumer group it records (None: none)."""

    root: str
    group: str | None
    topics: tuple[str, ...]  # named topics; empty with a pattern
    pattern: str | None
    starting: str | None = None  # the startingOffsets option, as given

    def reads(self, topic: str) -> bool:
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics


def sources_of(options: list[dict[str, str]]) -> list[TrackedSource]:
    """A query's pafka sources from their options (keys in any case)."""
    out = []
    for raw in options:
        o = {k.lower(): v for k, v in raw.items()}
        group, root = o.get("consumergroup") or None, o.get("path")
        if not root:
            continue
        named = o.get("topic") or o.get("subscribe") or ""
        topics = tuple(t.strip() for t in named.split(",") if t.strip())
        out.append(TrackedSource(root, group, topics, o.get("subscribepattern"),
                                 o.get("startingoffsets")))
    return out


def _pafka_options(spark: Any, query_id: str) -> list[dict[str, str]] | None:
    """The options of each pafka source of a running query (None if it is not running).

    Spark reports no options in a query's progress; they are read from the query's plan,
    where each streaming relation keeps the options it was loaded with."""
    query = spark.streams.get(query_id)
    if query is None:
        return None
    plan = query._jsq.streamingQuery().logicalPlan()
    out = []
    leaves = plan.collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        try:
            relation = leaf.relation()
            if relation.table().name() != "pafka":
                continue
            options = relation.options().asCaseSensitiveMap()
        except Exception:  # a leaf of another kind (no relation, or no table)
            continue
        out.append({str(k): str(options.get(k)) for k in options.keySet()})
    return out


def _listener_base() -> type:
    from pyspark.sql.streaming import StreamingQueryListener
    return StreamingQueryListener


class GroupTracker:
    """Records each query's consumer-group positions from its progress (driver side).

    Thread-safe; Spark calls it on its listener thread. Use :func:`track_groups`."""

    def __init__(self, spark: Any):
        self._spark = spark
        self._sources: dict[str, list[TrackedSource]] = {}  # query id -> its sources
        self._pafka_sources: dict[str, int] = {}  # query id -> its pafka sources
        self._stores: dict[str, Store] = {}
        self._last: dict[tuple[str, str, str], dict[int, int]] = {}
        self._lock = threading.Lock()
        self.recorded = 0  # positions recorded (for tests and the demo)

    def on_start(self, query_id: str) -> None:
        """Learn a starting query's pafka sources while it runs (a query of one batch may
        have stopped by the time its progress arrives)."""
        with self._lock:
            self._known(query_id)

    def _known(self, query_id: str) -> list[TrackedSource] | None:
        sources = self._sources.get(query_id)
        if sources is None:
            options = _pafka_options(self._spark, query_id)
            if options is None:
                return None
            sources = self._sources[query_id] = sources_of(options)
            self._pafka_sources[query_id] = len(options)
        return sources

    def on_progress(self, progress: Any) -> None:
        with self._lock:
            sources = self._known(str(progress.id))
            if not sources or all(s.group is None for s in sources):
                return
            # Offsets without pafka's incarnation ids are trusted only in a query whose
            # sources are all pafka's (a Kafka source's offsets look the same).
            pafka_only = len(progress.sources) == self._pafka_sources.get(str(progress.id), -1)
            for sp in progress.sources:
                self._record(sources, sp.endOffset, pafka_only)

    def _record(self, sources: list[TrackedSource], end: str | None,
                pafka_only: bool) -> None:
        try:
            offsets = json.loads(end) if end else None
        except ValueError:
            return
        if not isinstance(offsets, dict):
            return
        ids = offsets.get("_ids") if isinstance(offsets.get("_ids"), dict) else {}
        for topic, parts in offsets.items():
            if topic.startswith("_") or not isinstance(parts, dict):
                continue  # the incarnation ids, or not a topic's offsets
            readers = [src for src in sources if src.reads(topic)]
            if len(readers) != 1 or (topic not in ids and not pafka_only):
                # Which source these offsets are of is not known for sure (two pafka sources
                # of one topic name, or another source kind beside them): record nothing.
                continue
            for src in readers:
                if src.group is None:
                    continue
                position = {int(p): int(o) for p, o in parts.items()}
                key = (src.root, topic, src.group)
                if self._last.get(key) == position:
                    continue
                store = self._stores.get(src.root)
                if store is None:
                    try:
                        store = Store.open(src.root, create=False)
                    except StoreNotFound:
                        continue  # deleted since: a position is never worth a new store
                    self._stores[src.root] = store
                try:
                    handle = store.topic(topic)
                except TopicNotFound:
                    continue  # deleted since
                if ids.get(topic) and handle.id != ids[topic]:
                    continue  # offsets of a topic deleted since
                handle.set_position(src.group, position)
                self._last[key] = position
                self.recorded += 1

    def forget(self, query_id: str) -> None:
        with self._lock:
            self._sources.pop(query_id, None)
            self._pafka_sources.pop(query_id, None)


def listener_for(tracker: Any, failed: str) -> Any:
    """A streaming query listener that hands each query's start, progress and end to
    ``tracker`` (``on_start``, ``on_progress``, ``forget``); a failure is logged as
    ``failed`` and never reaches Spark's listener thread. ``listener.tracker`` is it."""

    class PafkaListener(_listener_base()):  # type: ignore[misc]
        """Spark's listener interface around a tracker."""

        def __init__(self) -> None:
            super().__init__()
            self.tracker = tracker

        def onQueryStarted(self, event: Any) -> None:  # noqa: N802 (Spark's names)
            try:
                tracker.on_start(str(event.id))
            except Exception as e:  # learnt again at its first progress
                log.debug("query %s: sources not known at start: %s", event.id, e)

        def onQueryProgress(self, event: Any) -> None:  # noqa: N802
            try:
                tracker.on_progress(event.progress)
            except (PafkaError, OSError, ValueError) as e:
                log.warning("%s for query %s: %s", failed, event.progress.id, e)
            except Exception:  # a listener must never break Spark's listener thread
                log.exception("%s for query %s", failed, event.progress.id)

        def onQueryIdle(self, event: Any) -> None:  # noqa: N802
            pass

        def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
            tracker.forget(str(event.id))

    return PafkaListener()


def track_groups(spark: Any) -> Any:
    """Record every streaming query's consumer-group position as each micro-batch ends.

    Adds a listener to ``spark``'s streaming query manager (one per session is enough;
    a second call returns the first) and returns it; ``spark.streams.removeListener`` takes
    it off. A source records its group only with the ``consumerGroup`` option. Without this,
    a group lags one micro-batch, and a stopped query's last batch is never recorded."""
    existing = getattr(spark, "_pafka_group_listener", None)
    if existing is not None:
        return existing
    tracker = GroupTracker(spark)
    listener = listener_for(tracker, "consumer group position not recorded")
    spark.streams.addListener(listener)
    spark._pafka_group_listener = listener
    return listener


__all__ = ["GroupTracker", "TrackedSource", "listener_for", "track_groups"]
