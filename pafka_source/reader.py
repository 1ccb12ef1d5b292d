"""The ``pafka`` source: batch and streaming readers over topics of a tier store.

Planning runs on the driver, where the commit log is held and refreshed incrementally; each
Spark partition carries :class:`~tier_store.reading.ReadPlan` s (files, byte ranges, offsets),
so executors only map files and slice Arrow batches — they never read the commit log.

Streaming positions are Kafka's: ``{"<topic>": {"<partition>": <next offset>}}`` with partitions
in ascending order (Spark compares offsets as JSON text).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tier_store import DataLoss, PafkaError, SchemaMismatch, Store, Topic, TopicDeleted
from tier_store.layout import STORE_FILE
from tier_store.reading import ReadPlan, execute

from .options import SourceOptions
from .types import conform_batch, target_arrow_schema

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
# The key, beside the topics, under which a streaming offset names each topic's incarnation
# (topic names cannot start with "_").
IDS_KEY = "_ids"


def split_ids(offsets: dict[str, Any]) -> tuple[Offsets, dict[str, str]]:
    """(the topics' offsets, their incarnation ids) of a streaming offset."""
    ids = offsets.get(IDS_KEY)
    return ({n: v for n, v in offsets.items() if n != IDS_KEY},
            dict(ids) if isinstance(ids, dict) else {})
SPARK_BATCH_ROWS = 65_536
# Ranges of fewer records than this share Spark partitions, up to this many records each: a
# task costs a scheduling and a Python worker round trip whatever it reads, and that was
# most of what a small micro-batch spread over every topic partition cost.
PACK_RECORDS = 65_536


@dataclass
class PafkaPartition(InputPartition):
    """One Spark partition: planned offset ranges, each of one topic partition (several
    only when they are small)."""

    plans: tuple[ReadPlan, ...]

    def __init__(self, *plans: ReadPlan):  # InputPartition's own __init__ takes a value
        self.plans = plans
        self.value = None


def require_store(root: str) -> None:
    """Fail unless a store exists at ``root``: ``Store.open`` creates one, and a reader must
    not leave a store behind at a mistyped path."""
    if not os.path.isfile(os.path.join(root, STORE_FILE)):
        raise PafkaError(f"no pafka store at {root} (no {STORE_FILE}); a read does not create "
                         "one: check the path given to load()")


def check_offset_options(topics: list[Topic], opts: SourceOptions) -> None:
    """Every topic and partition that startingOffsets, endingOffsets or
    startingOffsetsByTimestamp names is one this read reads."""
    by_name = {t.name: t for t in topics}
    for option, spec in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending),
                         ("startingOffsetsByTimestamp", opts.starting_by_timestamp)):
        if not isinstance(spec, dict):
            continue
        for name, parts in spec.items():
            t = by_name.get(name)
            if t is None:
                raise PafkaError(f"option {option!r} names topic {name!r}, which this read does "
                                 f"not read (it reads {', '.join(sorted(by_name))})")
            unknown = [p for p in parts if int(p) >= t.partitions]
            if unknown:
                raise PafkaError(f"option {option!r} names partition {', '.join(unknown)} of "
                                 f"topic {name!r}, which has partitions 0..{t.partitions - 1}")


def _bounds(earliest: int, latest: int) -> str:
    return f"earliest {earliest}, latest {latest}"


def resolve_topics(store: Store, opts: SourceOptions) -> list[Topic]:
    """The topics an options set names, checked to share one schema."""
    if opts.pattern is not None:
        rx = re.compile(opts.pattern)
        names = [n for n in store.topics() if rx.fullmatch(n)]
        if not names:
            raise PafkaError(f"no topic of {store.root} matches subscribePattern "
                             f"{opts.pattern!r}; topics: {', '.join(store.topics()) or '(none)'}")
    else:
        names = list(opts.topics)
    topics = [store.topic(n) for n in names]
    check_same_schema(topics)
    return topics


def check_same_schema(topics: list[Topic]) -> None:
    first = topics[0]
    for t in topics[1:]:
        if not t.schema.equals(first.schema):
            raise SchemaMismatch(f"topics read together must have equal schemas: {t.name!r} has "
                                 f"({_describe(t.schema)}), {first.name!r} has "
                                 f"({_describe(first.schema)})")


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)


def read_plan(plan: ReadPlan, target: pa.Schema, include_metadata: bool, verify: bool,
              fail_on_data_loss: bool) -> Iterator[pa.RecordBatch]:
    """Execute a plan on an executor, adding metadata columns and casting to ``target``."""
    try:
        for pb in execute(plan, verify):
            b = pb.batch
            if include_metadata:
                n = b.num_rows
                cols = b.columns + [
                    pa.array([plan.topic] * n, pa.string()) if n < 64 else
                    pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)),
                                                   pa.array([plan.topic])).cast(pa.string()),
                    pa.array(np.full(n, plan.partition, np.int32)),
                    pa.array(np.arange(pb.offset, pb.offset + n, dtype=np.int64)),
                    pa.array(np.full(n, pb.timestamp * 1000, np.int64)).cast(
                        pa.timestamp("us", tz="UTC")),
                ]
                b = pa.RecordBatch.from_arrays(cols, names=target.names)
            b = conform_batch(b, target)
            # Zero-copy slices of at most SPARK_BATCH_ROWS: a chunk may hold one batch of
            # hundreds of thousands of rows, which costs the JVM side page faults to take in.
            for at in range(0, b.num_rows, SPARK_BATCH_ROWS):
                yield b.slice(at, SPARK_BATCH_ROWS) if b.num_rows > SPARK_BATCH_ROWS else b
    except DataLoss as e:
        if fail_on_data_loss:
            raise
        log.warning("skipping lost data (failOnDataLoss=false): %s", e)


class _Planning:
    """What batch and streaming readers share: options, the store, and splitting ranges."""

    def __init__(self, opts: SourceOptions, schema: StructType):
        self.opts = opts
        self.schema = schema
        self.target = target_arrow_schema(schema)
        self._store: Store | None = None
        self._topics: dict[str, Topic] = {}
        # Lost ranges already reported: latestOffset and planning see the same gap.
        self._reported_losses: set[tuple[str, str, int]] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy: they need the options and schema, not store handles.
        state = dict(self.__dict__)
        state["_store"] = None
        state["_topics"] = {}
        return state

    @property
    def store(self) -> Store:
        if self._store is None:
            require_store(self.opts.root)
            self._store = Store.open(self.opts.root, self.opts.config or None)
        return self._store

    def topics(self) -> dict[str, Topic]:
        """The topics read, refreshed; a pattern is re-evaluated (new topics join). A topic
        deleted since is looked up again: a topic created again under its name is a new
        incarnation (another :attr:`Topic.id`); a named one that is gone fails naming it."""
        for name, t in list(self._topics.items()):
            try:
                t.refresh()
            except TopicDeleted:
                del self._topics[name]
        if not self._topics or self.opts.pattern is not None or \
                len(self._topics) < len(self.opts.topics or ()):
            found = resolve_topics(self.store, self.opts)
            for t in found:
                if t.name not in self._topics and self._topics:
                    check_same_schema([next(iter(self._topics.values())), t])
                self._topics.setdefault(t.name, t)
        return dict(sorted(self._topics.items()))

    def with_ids(self, offsets: Offsets, topics: dict[str, Topic],
                 previous: dict[str, str] | None = None) -> Offsets:
        """``offsets`` with each topic's incarnation under :data:`IDS_KEY`, so that a
        checkpoint names the topic it read, not only its name. A topic no longer there
        keeps the id ``previous`` gave it: created again, it is then known as another."""
        ids = {n: previous[n] for n in offsets if previous and previous.get(n)}
        ids.update({n: topics[n].id for n in offsets if n in topics and topics[n].id})
        out: dict[str, Any] = dict(offsets)
        if ids:
            out[IDS_KEY] = dict(sorted(ids.items()))
        return out

    def recreated(self, ids: dict[str, str], topics: dict[str, Topic]) -> set[str]:
        """Topics whose incarnation is not the one ``ids`` (from a checkpoint's offsets)
        names: deleted and created again since. With failOnDataLoss (the default) that is
        an error; otherwise they are read again from their earliest offset."""
        out = set()
        for name, was in ids.items():
            t = topics.get(name)
            if t is None or not was or not t.id or t.id == was:
                continue
            msg = (f"topic {name!r} was deleted and created again since this query's offsets "
                   f"were recorded (they name topic id {was}; the topic now has id {t.id}): "
                   "the new topic's records are not the ones the query was reading")
            if self.opts.fail_on_data_loss:
                raise TopicDeleted(f"{msg}. Start the query with a new checkpoint location, or "
                                   "set failOnDataLoss=false to read the new topic from its "
                                   "earliest offset")
            log.warning("%s; reading the new topic from its earliest offset "
                        "(failOnDataLoss=false)", msg)
            out.add(name)
        return out

    def resolve(self, spec: Any, default: str, kind: str) -> Offsets:
        """Offsets for every partition of every topic from a starting/ending spec."""
        out: Offsets = {}
        for name, t in self.topics().items():
            earliest, latest = t.earliest_offsets(), t.latest_offsets()
            parts: dict[str, int] = {}
            chosen = spec if spec is not None else default
            given = chosen.get(name, {}) if isinstance(chosen, dict) else {}
            if isinstance(chosen, dict):
                unknown = [p for p in given if int(p) >= t.partitions]
                if unknown:
                    raise PafkaError(f"{kind} names partitions {unknown} of topic {name!r}, "
                                     f"which has partitions 0..{t.partitions - 1}")
            for p in range(t.partitions):
                if isinstance(chosen, str):
                    off = earliest[p] if chosen == "earliest" else latest[p]
                else:
                    off = given.get(str(p), -2 if kind.startswith("starting") else -1)
                    off = earliest[p] if off == -2 else latest[p] if off == -1 else off
                parts[str(p)] = off
            out[name] = parts
        if isinstance(spec, dict):
            missing = [n for n in spec if n not in out]
            if missing:
                raise PafkaError(f"{kind} names topics {missing} that are not read "
                                 f"(reading {list(out)})")
        return out

    def starting_offsets(self, default: str) -> Offsets:
        """Where a read starts: startingTimestamp/startingOffsetsByTimestamp, the consumer
        group's offsets (startingOffsets=group), or startingOffsets (``default`` unset)."""
        by_time = self.by_timestamp()
        if by_time is not None:
            return by_time
        if self.opts.starting == "group":
            return self.group_offsets()
        return self.resolve(self.opts.starting, default, "startingOffsets")

    def group_offsets(self) -> Offsets:
        """The committed offsets of ``consumerGroup`` for every partition read; a partition
        (or topic) the group has no offset for starts at its earliest offset, as Kafka's
        ``auto.offset.reset=earliest``. A group none of the topics has is an error listing
        the groups they have: most likely a misspelt name."""
        group = self.opts.consumer_group
        assert group is not None  # SourceOptions.parse requires it with startingOffsets=group
        topics = self.topics()
        positions = {name: t.positions().get(group) for name, t in topics.items()}
        if all(pos is None for pos in positions.values()):
            known = sorted({g for t in topics.values() for g in t.state(refresh=False).positions})
            where = (f"topic {next(iter(topics))!r}" if len(topics) == 1 else
                     f"topics {', '.join(repr(n) for n in topics)}")
            raise PafkaError(
                f"option 'startingOffsets' is 'group', but consumer group {group!r} has no "
                f"committed offsets on {where}; groups there: {', '.join(known) or '(none)'}. "
                "Check the 'consumerGroup' option, or record the group's position first "
                "(pafka groups ROOT TOPIC --group NAME --reset-to earliest|latest|OFFSET)")
        out: Offsets = {}
        for name, t in topics.items():
            earliest = t.earliest_offsets()
            pos = positions[name] or {}
            missing = [p for p in range(t.partitions) if p not in pos]
            if missing:
                log.info("consumer group %s has no committed offset for topic %s partition(s) "
                         "%s: starting them at their earliest offset", group, name,
                         ", ".join(map(str, missing)))
            out[name] = {str(p): pos.get(p, earliest[p]) for p in range(t.partitions)}
        return out

    def report_loss(self, name: str, p: str, start: int, earliest: int) -> None:
        """Log, once per gap, that ``[start, earliest)`` of a partition is skipped."""
        if (name, p, start) in self._reported_losses:
            return
        self._reported_losses.add((name, p, start))
        log.warning("topic %r partition %s: offsets [%d, %d) were deleted by retention before "
                    "they were read; skipping to offset %d (failOnDataLoss=false)", name, p,
                    start, earliest, earliest)

    def by_timestamp(self) -> Offsets | None:
        opts = self.opts
        if opts.starting_timestamp is None and opts.starting_by_timestamp is None:
            return None
        out: Offsets = {}
        for name, t in self.topics().items():
            stamps = (opts.starting_by_timestamp or {}).get(name, {})
            out[name] = {}
            for p in range(t.partitions):
                ts = opts.starting_timestamp if opts.starting_timestamp is not None \
                    else stamps.get(str(p))
                out[name][str(p)] = t.offset_for_time(p, ts) if ts is not None \
                    else t.earliest_offsets()[p]
        return out

    def plan(self, start: Offsets, end: Offsets) -> list[PafkaPartition]:
        """Split ``[start, end)`` into Spark partitions of bounded size."""
        ranges: list[tuple[Topic, int, int, int]] = []
        topics = self.topics()
        for name, parts in end.items():
            t = topics[name]
            earliest = t.earliest_offsets()
            for p, e in parts.items():
                s = start.get(name, {}).get(p, earliest[int(p)])
                if s < earliest[int(p)]:
                    if self.opts.fail_on_data_loss:
                        raise DataLoss(f"topic {name!r} partition {p}: offsets [{s}, "
                                       f"{earliest[int(p)]}) were deleted by retention before "
                                       "they were read; set failOnDataLoss=false to skip them")
                    self.report_loss(name, p, s, earliest[int(p)])
                    s = earliest[int(p)]
                if e > s:
                    ranges.append((t, int(p), s, e))
        pieces: list[tuple[Topic, int, int, int]] = []
        cap = self.opts.max_records_per_partition
        total = sum(e - s for _, _, s, e in ranges)
        if self.opts.min_partitions and total:
            cap = min(cap, max(1, -(-total // self.opts.min_partitions)))
        for t, p, s, e in ranges:
            n = -(-(e - s) // cap)
            step = -(-(e - s) // n)
            for lo in range(s, e, step):
                pieces.append((t, p, lo, min(e, lo + step)))
        # minPartitions asks for parallelism: its pieces stay apart however small.
        pack = 0 if self.opts.min_partitions else min(cap, PACK_RECORDS)
        out: list[PafkaPartition] = []
        small: list[ReadPlan] = []
        small_records = 0
        for t, p, s, e in pieces:
            plan = t.plan_read(p, s, e)
            if e - s >= pack:
                out.append(PafkaPartition(plan))
                continue
            if small_records + e - s > pack:
                out.append(PafkaPartition(*small))
                small, small_records = [], 0
            small.append(plan)
            small_records += e - s
        if small:
            out.append(PafkaPartition(*small))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, PafkaPartition):
            # A batch read with nothing to read: partitions() returned [] and PySpark planned
            # one InputPartition(None) in its place.
            return iter(())
        return (b for plan in partition.plans
                for b in read_plan(plan, self.target, self.opts.include_metadata,
                                   self.opts.verify, self.opts.fail_on_data_loss))


class PafkaBatchReader(_Planning, DataSourceReader):
    """``spark.read.format("pafka")``: from startingOffsets (default earliest) to
    endingOffsets (default latest), as they are when the query is planned.

    As in Kafka's source, a batch read cannot start at the latest offsets (it would read
    nothing), and every offset it names must lie in the log: a starting offset beyond the
    latest, an ending offset beyond the latest or below the starting one is an error naming
    the partition and its range. Streaming-only options are ignored with a warning."""

    def __init__(self, opts: SourceOptions, schema: StructType):
        super().__init__(opts, schema)
        if opts.starting == "latest":
            at_latest = "'latest'"
        elif isinstance(opts.starting, dict):
            at_latest = ", ".join(f"{n} partition {p}" for n, parts in opts.starting.items()
                                  for p, o in parts.items() if o == -1)
            at_latest = f"-1 (latest) for {at_latest}" if at_latest else ""
        else:
            at_latest = ""
        if at_latest:
            raise PafkaError(f"option 'startingOffsets' is {at_latest} in a batch read: a batch "
                             "read cannot start at the latest offsets, it would read nothing "
                             "(Kafka's source refuses it too); use earliest, offsets or "
                             "startingTimestamp")
        ignored = opts.ignored_in_batch()
        if ignored:
            log.warning("option(s) %s only apply to streaming reads: ignored in a batch read",
                        ", ".join(ignored))

    def partitions(self) -> list[PafkaPartition]:
        start = self.starting_offsets("earliest")
        end = self.resolve(self.opts.ending, "latest", "endingOffsets")
        self._check_range(start, end)
        return self.plan(start, end)

    def _check_range(self, start: Offsets, end: Offsets) -> None:
        """The range asked for lies in the log (a start below the earliest offset is data
        loss, which plan() reports or skips as failOnDataLoss says)."""
        starting = "startingOffsets" if self.opts.starting_timestamp is None and \
            self.opts.starting_by_timestamp is None else "startingTimestamp"
        for name, t in self.topics().items():
            earliest, latest = t.earliest_offsets(), t.latest_offsets()
            for p, e in end[name].items():
                s, lo, hi = start[name][p], earliest[int(p)], latest[int(p)]
                where = f"topic {name!r} partition {p} ({_bounds(lo, hi)})"
                if s > hi:
                    raise PafkaError(f"{starting}: offset {s} of {where} is beyond the latest "
                                     "offset")
                if e > hi:
                    raise PafkaError(f"endingOffsets: offset {e} of {where} is beyond the latest "
                                     "offset: those records do not exist yet")
                if e < s:
                    raise PafkaError(f"endingOffsets: offset {e} of {where} is below the "
                                     f"starting offset {s}")


class PafkaStreamReader(_Planning, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("pafka")``: Kafka's offsets, read limits and AvailableNow."""

    def __init__(self, opts: SourceOptions, schema: StructType):
        super().__init__(opts, schema)
        if opts.ending is not None:
            # As Kafka's source: "ending offset not valid in streaming queries".
            raise PafkaError("option 'endingOffsets' applies to batch reads (spark.read) only: "
                             "a streaming read has no end; remove it, or use "
                             "trigger(availableNow=True) to stop at the offsets of the start")
        if "maxtriggerdelay" in opts.given and opts.min_records is None:
            log.warning("option maxTriggerDelay has no effect without minOffsetsPerTrigger")
        self._target: Offsets | None = None
        self._last_batch_ms = time.time() * 1000

    def initialOffset(self) -> Offsets:
        start = self.starting_offsets("latest")
        return self.with_ids(
            self._within_log(start, "startingOffsets: offset {s} of {where} is beyond the "
                                    "latest offset"), self.topics())

    def _within_log(self, start: Offsets, what: str) -> Offsets:
        """``start`` with every offset beyond its partition's latest handled as Kafka's source
        does: data loss, which fails the query, or with failOnDataLoss=false continues from the
        latest offset. Offsets only grow, so a position beyond the latest is a mistake or a
        topic deleted and created again, not records still to come."""
        topics = self.topics()
        out: Offsets = {}
        for name, parts in start.items():
            t = topics.get(name)
            if t is None:
                out[name] = dict(parts)
                continue
            st = t.state(refresh=False)
            out[name] = {}
            for p, s in parts.items():
                if int(p) >= st.partitions:
                    out[name][p] = s
                    continue
                hi = st.next_offset[int(p)]
                if s > hi:
                    where = (f"topic {name!r} partition {p} "
                             f"({_bounds(st.start_offset[int(p)], hi)})")
                    msg = what.format(s=s, where=where)
                    if self.opts.fail_on_data_loss:
                        raise DataLoss(f"{msg}; set failOnDataLoss=false to continue from the "
                                       "latest offset")
                    log.warning("%s; continuing from the latest offset (failOnDataLoss=false)",
                                msg)
                    s = hi
                out[name][p] = s
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.opts
        if o.max_records is not None:
            return ReadMaxRows(o.max_records)
        if o.max_bytes is not None:
            return ReadMaxBytes(o.max_bytes)
        if o.min_records is not None:
            return ReadMinRows(o.min_records)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def _latest(self) -> Offsets:
        return {name: {str(p): off for p, off in t.latest_offsets().items()}
                for name, t in self.topics().items()}

    def reportLatestOffset(self) -> Offsets:
        return self.with_ids(self._latest(), self.topics())

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        topics = self.topics()  # refreshed once: reads only the new commit-log entries
        start, ids = split_ids(start)
        for name in self.recreated(ids, topics):
            start.pop(name)  # read again from the new topic's earliest offset
        # A position beyond the log (the topic was deleted and created again since the
        # checkpoint) is data loss; with failOnDataLoss=false the query continues from the
        # latest offset, as below.
        self._within_log(start, "the query's position {s} in {where} is beyond the latest "
                                "offset: the topic was deleted and created again, or lost records")
        latest = {n: {str(p): o for p, o in enumerate(t.state(refresh=False).next_offset)}
                  for n, t in topics.items()}
        if self._target is not None:
            latest = {n: {p: min(o, self._target.get(n, {}).get(p, o)) for p, o in parts.items()}
                      for n, parts in latest.items() if n in self._target}
        # Partitions and topics that appeared since start begin at their earliest offset.
        # With failOnDataLoss=false, a start below the earliest offset (retention deleted
        # records the query had not read) jumps to it here, before the limit is applied:
        # otherwise each micro-batch would cover only lost offsets, empty, until past the gap.
        begin: Offsets = {}
        held: Offsets = {}  # where the query stands, for a trigger that reads nothing
        for n, parts in latest.items():
            earliest = topics[n].state(refresh=False).start_offset
            begin[n], held[n] = {}, {}
            for p, o in parts.items():
                first = earliest[int(p)]
                at = held[n][p] = min(start.get(n, {}).get(p, first), o)
                if at < first and not self.opts.fail_on_data_loss:
                    self.report_loss(n, p, at, first)
                    at = min(first, o)
                begin[n][p] = at
        if not isinstance(limit, ReadAllAvailable):
            latest = self._limit(begin, latest, topics, held)
        if latest != held:
            self._last_batch_ms = time.time() * 1000
        # Keep offsets of topics that start knows but no longer match (e.g. a deleted topic).
        for n, parts in start.items():
            latest.setdefault(n, dict(parts))
        return self.with_ids({n: latest[n] for n in sorted(latest)}, topics, ids)

    def _limit(self, begin: Offsets, latest: Offsets, topics: dict[str, Topic],
               held: Offsets) -> Offsets:
        """The end of the next batch from ``begin`` under the read limits; ``held`` (where
        the query stands) while minOffsetsPerTrigger waits, so that no batch runs."""
        o = self.opts
        avail = {(n, p): latest[n][p] - begin[n][p] for n in latest for p in latest[n]}
        total = sum(avail.values())
        if total == 0:
            return latest
        if o.min_records is not None and self._target is None and total < o.min_records and \
                time.time() * 1000 - self._last_batch_ms < o.max_trigger_delay_ms:
            return held
        allow = total
        if o.max_records is not None:
            allow = min(allow, o.max_records)
        if o.max_bytes is not None:
            nbytes = sum(topics[n].bytes_between(int(p), begin[n][p], latest[n][p])
                         for n, p in avail)
            if nbytes > o.max_bytes:
                allow = min(allow, max(1, int(total * o.max_bytes / nbytes)))
        if allow >= total:
            return latest
        # Share the allowance in proportion to each partition's backlog, as Kafka does.
        keys = sorted(avail)
        shares = {k: avail[k] * allow // total for k in keys}
        left = allow - sum(shares.values())
        for k in sorted(keys, key=lambda k: avail[k] - shares[k], reverse=True):
            if left <= 0:
                break
            if shares[k] < avail[k]:
                shares[k] += 1
                left -= 1
        return {n: {p: begin[n][p] + shares[(n, p)] for p in latest[n]} for n in latest}

    def partitions(self, start: Offsets, end: Offsets) -> list[PafkaPartition]:
        start, start_ids = split_ids(start)
        end, ids = split_ids(end)
        # A topic deleted and created again since this batch's end was chosen: its range
        # names the old records (an error, or skipped with failOnDataLoss=false).
        for name in self.recreated(ids, self.topics()):
            end.pop(name)
        # An end in a new incarnation after a start in the old one: latestOffset chose to
        # read the new topic from its earliest offset (failOnDataLoss=false).
        for name, was in start_ids.items():
            if ids.get(name) and was != ids[name]:
                start.pop(name, None)
        return self.plan(start, end)

    def commit(self, end: Offsets) -> None:
        if self.opts.consumer_group is None:
            return
        end, ids = split_ids(end)
        topics = self.topics()
        for name, parts in end.items():
            if name in topics and (not ids.get(name) or ids[name] == topics[name].id):
                topics[name].set_position(self.opts.consumer_group,
                                          {int(p): o for p, o in parts.items()})


class FailedStreamReader(PafkaStreamReader):
    """A stream reader that could not be built: it raises its error from the first call.

    An error raised by ``streamReader()`` reaches the user masked: PySpark's streaming runner
    then fails in its own ``finally: reader.stop()`` (UnboundLocalError). Raised from
    ``initialOffset()``/``latestOffset()``, the same error fails the query with its message."""

    def __init__(self, error: Exception):  # no options to parse: they are what failed
        self.error = error

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def _fail(self) -> NoReturn:
        raise self.error

    def initialOffset(self) -> Offsets:
        self._fail()

    def getDefaultReadLimit(self) -> ReadLimit:
        self._fail()

    def prepareForTriggerAvailableNow(self) -> None:
        self._fail()

    def reportLatestOffset(self) -> Offsets:
        self._fail()

    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        self._fail()

    def partitions(self, start: Offsets, end: Offsets) -> list[PafkaPartition]:
        self._fail()

    def commit(self, end: Offsets) -> None:
        self._fail()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        self._fail()
