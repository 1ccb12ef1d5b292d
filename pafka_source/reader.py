"""The ``pafka`` source's readers: batch and streaming, over topics of a tier store.

Planning (:mod:`.planning`) runs on the driver; offsets are Kafka's (:mod:`.offsets`).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar, cast

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

from tier_store import DataLoss, InvalidArgument, PafkaError, Topic

from .offsets import Offsets, bounds, recreated, split_ids, with_ids
from .options import SourceOptions
from .planning import PafkaPartition, Planning
from .progress import LAG_KEY, lag_report
from .pushdown import bounds as pushed_bounds

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


class PafkaBatchReader(Planning, DataSourceReader):
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
            raise InvalidArgument(f"option 'startingOffsets' is {at_latest} in a batch read: a "
                                  "batch "
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
                where = f"topic {name!r} partition {p} ({bounds(lo, hi)})"
                if s > hi:
                    raise InvalidArgument(f"{starting}: offset {s} of {where} is beyond the latest "
                                          "offset")
                if e > hi:
                    raise InvalidArgument(f"endingOffsets: offset {e} of {where} is beyond the "
                                          "latest "
                                          "offset: those records do not exist yet")
                if e < s:
                    raise InvalidArgument(f"endingOffsets: offset {e} of {where} is below the "
                                          f"starting offset {s}")


class PafkaFilteringBatchReader(PafkaBatchReader):
    """A batch read that takes the filters Spark pushes (``pushFilters=true``; PySpark
    4.1+ with ``spark.sql.python.filterPushdown.enabled``): those on the metadata columns
    skip topics, partitions and offsets before any byte is read (:mod:`.pushdown`). A
    class of its own: Spark refuses a reader that takes filters when pushdown is off."""

    def pushFilters(self, filters: list[Any]) -> Iterator[Any]:  # noqa: N802 - Spark's name
        self.bounds = pushed_bounds(filters)
        # Every filter goes back: Spark applies it to the rows read, so a bound only skips.
        yield from filters


def _one_line(method: F) -> F:
    """A driver-side method of the stream reader whose store errors fail the query in one
    line: PySpark's streaming runner prints a Python traceback with the error unless
    ``SPARK_HIDE_TRACEBACK`` is set when it formats it, and an error of the store names
    what is wrong already. The runner process serves this reader alone; other errors keep
    their traceback."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except PafkaError:
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
            raise

    return cast(F, run)


class PafkaStreamReader(Planning, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("pafka")``: Kafka's offsets, read limits and AvailableNow."""

    def __init__(self, opts: SourceOptions, schema: StructType):
        super().__init__(opts, schema)
        if opts.ending is not None:
            # As Kafka's source: "ending offset not valid in streaming queries".
            raise InvalidArgument("option 'endingOffsets' applies to batch reads (spark.read) "
                                  "only: "
                                  "a streaming read has no end; remove it, or use "
                                  "trigger(availableNow=True) to stop at the offsets of the start")
        if "maxtriggerdelay" in opts.given and opts.min_records is None:
            log.warning("option maxTriggerDelay has no effect without minOffsetsPerTrigger")
        self._target: Offsets | None = None
        self._last_batch_ms = time.time() * 1000
        self._planned: tuple[Offsets, Offsets] | None = None  # the last batch's range

    @_one_line
    def initialOffset(self) -> Offsets:
        start = self.starting_offsets("latest")
        return with_ids(
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
                hi = st.part(int(p)).next_offset
                if s > hi:
                    where = (f"topic {name!r} partition {p} "
                             f"({bounds(st.part(int(p)).start_offset, hi)})")
                    msg = what.format(s=s, where=where)
                    if self.opts.fail_on_data_loss:
                        raise DataLoss(f"{msg}; set failOnDataLoss=false to continue from the "
                                       "latest offset")
                    log.warning("%s; continuing from the latest offset (failOnDataLoss=false)",
                                msg)
                    s = hi
                out[name][p] = s
        return out

    @_one_line
    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.opts
        if o.max_records is not None:
            return ReadMaxRows(o.max_records)
        if o.max_bytes is not None:
            return ReadMaxBytes(o.max_bytes)
        if o.min_records is not None:
            return ReadMinRows(o.min_records)
        return ReadAllAvailable()

    @_one_line
    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def _latest(self, topics: dict[str, Topic] | None = None) -> Offsets:
        """The latest offsets of ``topics`` as read (default: refreshed now)."""
        topics = self.topics() if topics is None else topics
        return {name: {str(p): off for p, off in enumerate(t.state(refresh=False).next_offset)}
                for name, t in topics.items()}

    @_one_line
    def reportLatestOffset(self) -> Offsets:
        # Only this reaches a query's progress (as latestOffset): the lag rides along in it.
        topics = self.topics()  # one refresh per topic, for the offsets and the lag
        out = with_ids(self._latest(topics), topics)
        if self._planned is not None:
            try:
                out[LAG_KEY] = lag_report(topics, *self._planned)
            except (PafkaError, OSError) as e:  # a report never fails the query
                log.debug("lag not reported: %s", e)
        return out

    @_one_line
    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        topics = self.topics()  # refreshed once: reads only the new commit-log entries
        start, ids = split_ids(start)
        for name in recreated(ids, topics, self.opts.fail_on_data_loss):
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
        self._planned = (begin, latest)
        return with_ids({n: latest[n] for n in sorted(latest)}, topics, ids)

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

    @_one_line
    def partitions(self, start: Offsets, end: Offsets) -> list[PafkaPartition]:
        start, start_ids = split_ids(start)
        end, ids = split_ids(end)
        # A topic deleted and created again since this batch's end was chosen: its range
        # names the old records (an error, or skipped with failOnDataLoss=false).
        for name in recreated(ids, self.topics(), self.opts.fail_on_data_loss):
            end.pop(name)
        # An end in a new incarnation after a start in the old one: latestOffset chose to
        # read the new topic from its earliest offset (failOnDataLoss=false).
        for name, was in start_ids.items():
            if ids.get(name) and was != ids[name]:
                start.pop(name, None)
        return self.plan(start, end)

    @_one_line
    def commit(self, end: Offsets) -> None:
        if self.opts.consumer_group is None:
            return
        end, ids = split_ids(end)
        topics = self.topics()
        for name, parts in end.items():
            if name in topics and (not ids.get(name) or ids[name] == topics[name].id):
                # track_groups may have recorded a later batch's end already: never go back
                # (its listener moves a group back when a query restarts behind it).
                topics[name].advance_position(self.opts.consumer_group,
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

    @_one_line
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
