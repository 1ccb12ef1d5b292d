"""Planning a ``pafka`` read on the driver, and executing its plans on executors.

Planning runs on the driver, where the commit log is held and refreshed incrementally; each
Spark partition carries :class:`~tier_store.ReadPlan` s (files, byte ranges, offsets), so
executors only map files and slice Arrow batches — they never read the commit log.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from tier_store import (
    DataLoss,
    InvalidArgument,
    PafkaError,
    ReadPlan,
    SchemaMismatch,
    SkipCorrupt,
    Store,
    Topic,
    TopicDeleted,
    TopicNotFound,
    chunk_filter,
    execute,
    host_id,
    read_counts,
    select_columns,
    skip_warning,
)

from .handles import store_to_read
from .offsets import (
    Offsets,
    group_offsets,
    offsets_by_timestamp,
    resolve_offsets,
)
from .options import SourceOptions
from .pushdown import Bounds, clamp, named
from .types import conform_batch, spark_schema, target_arrow_schema

log = logging.getLogger(__name__)

# Arrow batches handed to Spark hold at most this many rows.
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


def resolve_topics(store: Store, opts: SourceOptions) -> list[Topic]:
    """The topics an options set names, checked to share one schema."""
    if opts.pattern is not None:
        rx = re.compile(opts.pattern)
        names = [n for n in store.topics() if rx.fullmatch(n)]
        if not names:
            raise InvalidArgument(f"no topic of {store.root} matches subscribePattern "
                                  f"{opts.pattern!r}; topics: "
                                  f"{', '.join(store.topics()) or '(none)'}")
    else:
        names = list(opts.topics)
    topics = [store.topic(n) for n in names]
    check_same_schema(topics)
    return topics


def check_same_schema(topics: list[Topic]) -> None:
    """Topics read together share one schema."""
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
    """Execute a plan on an executor, adding metadata columns and casting to ``target``.

    Without ``fail_on_data_loss``, offsets deleted since planning are skipped and the read
    goes on from the earliest offset still present, to the plan's end; and a corrupt chunk
    is skipped with a warning naming its offsets, as the Kafka source skips what it cannot
    read."""
    at = plan.start
    skip = None if fail_on_data_loss else skip_warning("a read (failOnDataLoss=false)")
    while True:
        try:
            for b, end in _plan_batches(plan, target, include_metadata, verify, skip):
                yield b
                at = end
            return
        except DataLoss as e:
            if fail_on_data_loss:
                raise
            log.warning("skipping lost data (failOnDataLoss=false): %s", e)
            resumed = _resume(plan, at)
            if resumed is None:
                return
            plan = resumed


def _resume(plan: ReadPlan, at: int) -> ReadPlan | None:
    """``[earliest, plan.end)`` of the plan's partition planned again, once offsets from
    ``at`` on were lost; None when nothing of the range is left or nothing moved on."""
    try:
        topic = store_to_read(plan.root, {}).topic(plan.topic)
    except TopicNotFound:
        return None
    if plan.topic_id and topic.id != plan.topic_id:
        return None
    start = max(at, topic.earliest_offsets()[plan.partition])
    if start >= plan.end or start <= plan.start:
        return None  # nothing left, or the loss is not retention's: do not spin
    again = topic.plan_read(plan.partition, start, plan.end)
    again.schema, again.columns = plan.schema, plan.columns  # the shape Spark was promised
    return again


def _plan_batches(plan: ReadPlan, target: pa.Schema, include_metadata: bool, verify: bool,
                  skip: SkipCorrupt | None) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The plan's batches for Spark, each with the offset after its last row."""
    for pb in execute(plan, verify, skip_corrupt=skip):
        b = pb.batch
        if include_metadata:
            n = b.num_rows
            if b.schema.names != target.names[:b.num_columns]:
                raise PafkaError(f"a read of topic {plan.topic!r} gave columns "
                                 f"{b.schema.names}, not the query's: restart the query")
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
            part = b.slice(at, SPARK_BATCH_ROWS) if b.num_rows > SPARK_BATCH_ROWS else b
            yield part, pb.offset + at + part.num_rows


def read_schema(topic: Topic, opts: SourceOptions) -> pa.Schema:
    """What a read gives of ``topic``: its schema, or the ``columns`` option's part of it."""
    if opts.columns is None:
        return topic.schema
    schema = topic.schema
    names = select_columns(schema, opts.columns, f"option 'columns' (topic {topic.name!r})")
    return pa.schema([schema.field(c) for c in names])


class Planning:
    """What batch and streaming readers share: options, the store, the topics read, where a
    read starts, and splitting offset ranges into Spark partitions."""

    def __init__(self, opts: SourceOptions, schema: StructType):
        self.opts = opts
        self.schema = schema
        self.target = target_arrow_schema(schema)
        self._store: Store | None = None
        self._topics: dict[str, Topic] = {}
        self._checked: dict[str, pa.Schema] = {}  # per topic, its schema found the query's
        self.bounds: Bounds | None = None  # what filters Spark pushed let a read skip
        # Lost ranges already reported: latestOffset and planning see the same gap.
        self._reported_losses: set[tuple[str, str, int]] = set()

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy: they need the options and schema, not store handles.
        state = dict(self.__dict__)
        state["_store"] = None
        state["_topics"] = {}
        state["_checked"] = {}
        return state

    @property
    def store(self) -> Store:
        """The store read (opened on first use; a read never creates one)."""
        if self._store is None:
            self._store = store_to_read(self.opts.root, self.opts.config, shared=False)
        return self._store

    def topics(self) -> dict[str, Topic]:
        """The topics read, refreshed; a pattern is re-evaluated (new topics join). A topic
        deleted since is looked up again: a topic created again under its name is a new
        incarnation (another :attr:`Topic.id`); a named one that is gone fails naming it."""
        gone = []
        for name, t in list(self._topics.items()):
            try:
                t.refresh()
            except TopicDeleted:
                del self._topics[name]
                gone.append(name)
        if not self._topics or self.opts.pattern is not None or \
                len(self._topics) < len(self.opts.topics or ()):
            try:
                found = resolve_topics(self.store, self.opts)
            except TopicNotFound as e:
                if gone and not isinstance(e, TopicDeleted):
                    raise TopicDeleted(
                        f"topic {gone[0]!r} was deleted while this query read it, and no "
                        f"topic of that name is in {self.opts.root} now: the query cannot go "
                        "on (a topic created under the name again is read from its earliest "
                        "offset with failOnDataLoss=false)") from None
                raise
            for t in found:
                if t.name not in self._topics and self._topics:
                    check_same_schema([next(iter(self._topics.values())), t])
                self._topics.setdefault(t.name, t)
        for t in self._topics.values():
            if t.schema is not self._checked.get(t.name):
                self._check_schema(t)
        return dict(sorted(self._topics.items()))

    def _check_schema(self, t: Topic) -> None:
        """A query reads in the schema it started with (Spark fixes it): a topic whose schema
        changed since is an error saying what changed and to restart the query."""
        now = spark_schema(read_schema(t, self.opts), self.opts.include_metadata)
        if now != self.schema:
            was = {f.name: f for f in self.schema.fields}
            diff = []
            for f in now.fields:
                old = was.get(f.name)
                if old is None:
                    diff.append(f"added {f.name} {f.dataType.simpleString()}")
                elif old.dataType != f.dataType:
                    diff.append(f"widened {f.name} {old.dataType.simpleString()} → "
                                f"{f.dataType.simpleString()}")
                elif old.nullable != f.nullable:
                    diff.append(f"made {f.name} nullable")
            raise SchemaMismatch(
                f"topic {t.name!r} changed its schema after this query started "
                f"({'; '.join(diff) or now.simpleString()}): restart the query to read every "
                "record in the new schema (older records read added columns as null)")
        self._checked[t.name] = t.schema

    def resolve(self, spec: Any, default: str, kind: str) -> Offsets:
        """Offsets for every partition of every topic from a starting/ending spec."""
        return resolve_offsets(self.topics(), spec, default, kind)

    def starting_offsets(self, default: str) -> Offsets:
        """Where a read starts: startingTimestamp/startingOffsetsByTimestamp, the consumer
        group's offsets (startingOffsets=group), or startingOffsets (``default`` unset)."""
        topics = self.topics()
        by_time = offsets_by_timestamp(topics, self.opts)
        if by_time is not None:
            return by_time
        if self.opts.starting == "group":
            group = self.opts.consumer_group
            assert group is not None  # SourceOptions.parse requires it with startingOffsets=group
            return group_offsets(topics, group)
        return resolve_offsets(topics, self.opts.starting, default, "startingOffsets")

    def report_loss(self, name: str, p: str, start: int, earliest: int) -> None:
        """Log, once per gap, that ``[start, earliest)`` of a partition is skipped."""
        if (name, p, start) in self._reported_losses:
            return
        self._reported_losses.add((name, p, start))
        log.warning("topic %r partition %s: offsets [%d, %d) were deleted by retention before "
                    "they were read; skipping to offset %d (failOnDataLoss=false)", name, p,
                    start, earliest, earliest)

    def plan(self, start: Offsets, end: Offsets) -> list[PafkaPartition]:
        """Split ``[start, end)`` into Spark partitions of bounded size."""
        ranges: list[tuple[Topic, int, int, int]] = []
        topics = self.topics()
        pushed = self.bounds
        for name, parts in end.items():
            if pushed is not None and not pushed.keeps_topic(name):
                continue
            t = topics[name]
            earliest = t.earliest_offsets()
            for p, e in parts.items():
                if pushed is not None and not pushed.keeps_partition(int(p)):
                    continue
                s = start.get(name, {}).get(p, earliest[int(p)])
                if s < earliest[int(p)]:
                    if self.opts.fail_on_data_loss:
                        raise DataLoss(f"topic {name!r} partition {p}: offsets [{s}, "
                                       f"{earliest[int(p)]}) were deleted by retention before "
                                       "they were read; set failOnDataLoss=false to skip them")
                    self.report_loss(name, p, s, earliest[int(p)])
                    s = earliest[int(p)]
                if pushed is not None:
                    s, e = clamp(pushed, t, int(p), s, e)
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
        # Planned per topic at once: one lock and one refresh, not one per partition.
        by_topic: dict[str, list[int]] = {}
        for i, (t, _, _, _) in enumerate(pieces):
            by_topic.setdefault(t.name, []).append(i)
        plans: dict[int, ReadPlan] = {}
        for idx in by_topic.values():
            t = pieces[idx[0]][0]
            # Chunks whose statistics exclude the pushed conditions are not planned at all.
            keep = None if pushed is None else \
                chunk_filter(t.schema, named(t.schema.names, pushed.where), strict=False)
            plans.update(zip(idx, t.plan_reads([pieces[i][1:] for i in idx], keep),
                             strict=True))
        for i, (_, _, s, e) in enumerate(pieces):
            plan = plans[i]
            if not plan.chunks:
                continue  # every chunk skipped
            # Its range was committed in the schema checked (a change since lies past it).
            plan.schema = self._checked.get(plan.topic, plan.schema)
            plan.columns = self.opts.columns
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
        return _counted((b for plan in partition.plans
                         for b in read_plan(plan, self.target, self.opts.include_metadata,
                                            self.opts.verify, self.opts.fail_on_data_loss)),
                        partition)


def _counted(batches: Iterator[pa.RecordBatch], partition: PafkaPartition
             ) -> Iterator[pa.RecordBatch]:
    """``batches``, then how many chunks and bytes the read found on this host's tier and how
    many it read from elsewhere (a shared tier): logged, and appended as one JSON line to
    ``$PAFKA_READ_STATS/<host>-<pid>.jsonl`` when that directory is set (by
    ``spark.executorEnv.PAFKA_READ_STATS`` on a cluster)."""
    before = read_counts()
    yield from batches
    after = read_counts()
    delta = {k: after[k] - before[k] for k in after}
    here = host_id()
    log.debug("read %s: %d chunks on this host (%s), %d from elsewhere",
             ", ".join(f"{p.topic}/{p.partition}" for p in partition.plans),
             delta["local_chunks"], here, delta["remote_chunks"])
    where = os.environ.get("PAFKA_READ_STATS")
    if where:
        line = json.dumps({"host": here, "plans": [[p.topic, p.partition, p.start, p.end]
                                                   for p in partition.plans], **delta})
        with open(os.path.join(where, f"{here}-{os.getpid()}.jsonl"), "a") as f:
            f.write(line + "\n")
