"""Following a partition: yield its records as they are committed, from plain Python.

A :class:`PartitionCursor` holds one partition's position and reads on from it. Each read
plans ``[position, latest)`` from the state the handle last refreshed (a refresh reads only
the commit-log entries published since), and the position passes each batch as it is handed
out, so nothing is handed out twice. Segments moving between tiers are re-planned by
:func:`~tier_store.reading.execute`.

Records deleted by retention before they were read are handled as Kafka's
``auto.offset.reset`` says: ``"earliest"`` (the default) jumps to the first retained offset,
``"latest"`` to the end, and ``"none"`` raises :class:`DataLoss`. The jump is logged as a
warning naming the offsets lost.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa

from .errors import DataLoss, InvalidArgument
from .reading import execute, skip_warning

if TYPE_CHECKING:
    from .state import PartitionState
    from .topic import Topic

log = logging.getLogger(__name__)

RESETS = ("earliest", "latest", "none")


class FetchedBatch(NamedTuple):
    """Records read from one partition: row ``i`` of ``batch`` has offset ``offset + i``;
    ``timestamp`` is the commit time (ms since the epoch) of the chunk holding them. A
    named tuple: one per chunk read, and a frozen dataclass's init costs more."""

    partition: int
    offset: int
    timestamp: int
    batch: pa.RecordBatch

    @property
    def end(self) -> int:
        """The offset after the last row: where reading goes on."""
        return self.offset + self.batch.num_rows

    @property
    def offsets(self) -> pa.Array:
        """Each row's offset, as an int64 array."""
        return pa.array(np.arange(self.offset, self.end, dtype=np.int64))


def check_reset(reset: Any) -> str:
    """``reset`` if it is one of :data:`RESETS`; :class:`InvalidArgument` otherwise."""
    if reset not in RESETS:
        raise InvalidArgument(f"reset must be one of {', '.join(RESETS)} (as Kafka's "
                              f"auto.offset.reset), got {reset!r}")
    return str(reset)


def check_seconds(name: str, value: Any, allow_none: bool = False, allow_zero: bool = True
                  ) -> float | None:
    """``value`` as a finite number of seconds (``None`` if ``allow_none``)."""
    if value is None and allow_none:
        return None
    ok = (not isinstance(value, bool) and isinstance(value, int | float | np.number)
          and math.isfinite(value) and (value >= 0 if allow_zero else value > 0))
    if not ok:
        allowed = "a number of seconds " + (">= 0" if allow_zero else "> 0")
        raise InvalidArgument(f"{name} must be {allowed}"
                              f"{' or None' if allow_none else ''}, got {value!r}")
    return float(value)


def start_offset(topic: Topic, partition: int, start: Any) -> int:
    """Where reading ``partition`` starts: ``"earliest"``, ``"latest"`` or an offset from
    the earliest retained to the latest (both included)."""
    part = topic.state().part(partition)
    if start == "earliest":
        return part.start_offset
    if start == "latest":
        return part.next_offset
    if isinstance(start, bool) or not isinstance(start, int | np.integer):
        raise InvalidArgument(f"start must be 'earliest', 'latest' or an offset, got {start!r}")
    if not part.start_offset <= start <= part.next_offset:
        raise InvalidArgument(
            f"start offset {start} is outside partition {partition} of topic {topic.name!r}: "
            f"it allows {part.start_offset} (earliest) to {part.next_offset} (latest)")
    return int(start)


class PartitionCursor:
    """One partition's read position, and reading on from it (see the module's docstring).

    Not thread-safe: one reader per cursor."""

    def __init__(self, topic: Topic, partition: int, position: int, reset: str = "earliest",
                 verify: bool = True, skip_corrupt: bool = False):
        self.topic = topic
        self.partition = partition
        self.position = position
        self.reset = check_reset(reset)
        self.verify = verify
        self.skip_corrupt = skip_corrupt

    def __repr__(self) -> str:
        return f"PartitionCursor({self.topic.name!r}, {self.partition}, at {self.position})"

    def available(self) -> int:
        """Records committed past the position, as the handle's state has them."""
        part = self._part()
        return max(0, part.next_offset - max(self.position, part.start_offset))

    def fetch(self, max_records: int | None = None) -> Iterator[FetchedBatch]:
        """Yield the records from the position to the latest offset of the handle's state
        (at most ``max_records``), moving the position past each batch as it is yielded."""
        left = max_records
        for _ in range(3):  # a retention run deleting under the read: reset, read again
            if self.position < self._part().start_offset:
                self._out_of_range(self._part())
            try:
                for fb in self._read(left):
                    self.position = fb.end
                    if left is not None:
                        left -= fb.batch.num_rows
                    yield fb
                return
            except DataLoss:
                self.topic.refresh()
                if self.position >= self._part().start_offset:
                    raise  # not retention: a file lost from under the log
        raise DataLoss(f"topic {self.topic.name!r} partition {self.partition}: retention "
                       f"keeps deleting offset {self.position} before it can be read")

    def _part(self) -> PartitionState:
        return self.topic.state(refresh=False).part(self.partition)

    def _read(self, limit: int | None) -> Iterator[FetchedBatch]:
        part = self._part()
        end = part.next_offset if limit is None else min(part.next_offset,
                                                         self.position + limit)
        if end <= self.position:
            return
        plan = self.topic.plan_read(self.partition, self.position, end)
        skip = None
        if self.skip_corrupt:
            skip = skip_warning(f"topic {self.topic.name!r} partition {self.partition}: the "
                                "reader", self._past)
        # closing: a reader stopping early lets go of the plan's mappings at once.
        with contextlib.closing(execute(plan, self.verify, skip_corrupt=skip)) as batches:
            for pb in batches:
                yield FetchedBatch(self.partition, pb.offset, pb.timestamp, pb.batch)

    def _past(self, end: int) -> None:
        """Go on from ``end``: the offsets before it were skipped as corrupt."""
        self.position = max(self.position, end)

    def _out_of_range(self, part: PartitionState) -> None:
        lost = (f"topic {self.topic.name!r} partition {self.partition}: offsets "
                f"[{self.position}, {part.start_offset}) were deleted by retention before "
                "they were read")
        if self.reset == "none":
            raise DataLoss(f"{lost}; the earliest offset is {part.start_offset} (reset="
                           "'earliest' jumps there, as Kafka's auto.offset.reset)")
        to = part.start_offset if self.reset == "earliest" else part.next_offset
        log.warning("%s; reset=%r: reading on from offset %d", lost, self.reset, to)
        self.position = to


def follow(topic: Topic, partition: int, start: Any = "earliest", poll_interval: float = 0.2,
           timeout: float | None = None, reset: str = "earliest", verify: bool = True,
           skip_corrupt: bool = False) -> Iterator[FetchedBatch]:
    """Yield ``partition``'s records from ``start`` ("earliest", "latest" or an offset) as
    they are committed, as :class:`FetchedBatch` es (batch, first offset, commit time).
    ``Topic.follow`` is this function: ``topic.follow(partition, start, ...)``.

    It polls every ``poll_interval`` seconds, and stops after ``timeout`` seconds without
    new records (None: never; 0: once caught up). Records deleted by retention before they
    were read go as ``reset`` says (see the module's docstring). With ``skip_corrupt``, a
    corrupt chunk is skipped with a warning naming its offsets, instead of raising
    :class:`CorruptSegment`. Arguments are checked on the call, not at the first
    ``next()``."""
    p = topic._check_partition(partition)
    poll = check_seconds("poll_interval", poll_interval, allow_zero=False)
    limit = check_seconds("timeout", timeout, allow_none=True)
    assert poll is not None
    cursor = PartitionCursor(topic, p, start_offset(topic, p, start), reset, verify,
                             skip_corrupt)
    return _follow(cursor, poll, limit)


def _follow(cursor: PartitionCursor, poll: float, limit: float | None
            ) -> Iterator[FetchedBatch]:
    idle_since = time.monotonic()
    while True:
        cursor.topic.refresh()
        got = False
        for fb in cursor.fetch():
            got = True
            yield fb
        if got:
            idle_since = time.monotonic()  # the caller's time between batches is not idle
            continue
        waited = time.monotonic() - idle_since
        if limit is not None and waited >= limit:
            return
        time.sleep(poll if limit is None else max(0.0, min(poll, limit - waited)))


__all__ = ["RESETS", "FetchedBatch", "PartitionCursor", "check_reset", "check_seconds",
           "follow", "start_offset"]
