"""A consumer of a topic as a consumer group: it starts from the group's committed offsets,
polls for new records and commits its position back (the groups ``pafka groups`` lists).

A partition the group has no offset for starts as ``reset`` says (Kafka's
``auto.offset.reset``: earliest, latest, or none for an error). Records deleted by retention
before they were read are handled the same way (see :mod:`tier_store.follow`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import InvalidArgument
from .follow import FetchedBatch, PartitionCursor, check_reset, check_seconds, start_offset
from .positions import check_group_name
from .topic import Topic

if TYPE_CHECKING:
    from .store import Store


class Consumer:
    """Consumer group ``group`` reading ``topic`` of ``store`` (a name, or a handle).

    With ``group=None`` it reads from ``reset`` (or where :meth:`seek` puts it) and commits
    nothing, as a Kafka consumer without a group id. ``partitions`` limits it to those
    partitions; without it, it reads every partition, including those added later (from
    their earliest offset). A chunk that is :class:`CorruptSegment` stops :meth:`poll`
    unless ``skip_corrupt``: then it is skipped with a warning naming its offsets, and the
    position moves past it, as a Kafka consumer seeks past a corrupt record. Not
    thread-safe."""

    def __init__(self, store: Store | None, topic: str | Topic, group: str | None,
                 partitions: Iterable[int] | None = None, reset: str = "earliest",
                 poll_interval: float = 0.2, verify: bool = True, skip_corrupt: bool = False):
        if isinstance(topic, Topic):
            self.topic = topic
        elif store is None:
            raise InvalidArgument("Consumer needs a store to open topic "
                                  f"{topic!r} (or a Topic handle)")
        else:
            self.topic = store.topic(topic)
        self.group = None if group is None else check_group_name(group)
        self.reset = check_reset(reset)
        interval = check_seconds("poll_interval", poll_interval, allow_zero=False)
        assert interval is not None
        self.poll_interval = interval
        self.verify = verify
        self.skip_corrupt = skip_corrupt
        self._every = partitions is None
        committed = self.committed()
        if isinstance(partitions, str | bytes):
            raise InvalidArgument(f"partitions must be integers, got {partitions!r}")
        chosen = range(self.topic.partitions) if partitions is None else partitions
        self._cursors: dict[int, PartitionCursor] = {}
        for p in sorted({self.topic._check_partition(q) for q in chosen}):
            self._cursors[p] = self._cursor(p, committed.get(p))
        if not self._cursors:
            raise InvalidArgument(f"Consumer of topic {self.topic.name!r}: partitions names no "
                                  "partition (give some, or None for all)")
        self._committed = {p: c.position for p, c in self._cursors.items()
                           if committed.get(p) == c.position}
        self._turn = 0

    def __repr__(self) -> str:
        return (f"Consumer({self.topic.name!r}, group={self.group!r}, "
                f"positions={self.positions()})")

    def _cursor(self, p: int, committed: int | None) -> PartitionCursor:
        if committed is None:
            if self.reset == "none" and self.group is not None:
                raise InvalidArgument(
                    f"consumer group {self.group!r} has no committed offset for partition {p} "
                    f"of topic {self.topic.name!r}, and reset='none' (give earliest or latest)")
            # Without a group, reset="none" still needs a start: the earliest.
            committed = start_offset(self.topic, p,
                                     "earliest" if self.reset == "none" else self.reset)
        return PartitionCursor(self.topic, p, committed, self.reset, self.verify,
                               self.skip_corrupt)

    def assignment(self) -> list[int]:
        """The partitions this consumer reads."""
        return sorted(self._cursors)

    def positions(self) -> dict[int, int]:
        """Per partition, the offset of the next record :meth:`poll` returns."""
        return {p: c.position for p, c in sorted(self._cursors.items())}

    def committed(self) -> dict[int, int]:
        """The group's committed offsets, as the topic's log has them now."""
        if self.group is None:
            return {}
        return dict(sorted(self.topic.positions().get(self.group, {}).items()))

    def seek(self, partition: int, offset: Any) -> None:
        """Read ``partition`` from ``offset`` on ("earliest", "latest" or an offset)."""
        p = self.topic._check_partition(partition)
        if p not in self._cursors:
            raise InvalidArgument(f"partition {p} is not one this consumer reads: "
                                  f"{self.assignment()}")
        self._cursors[p].position = start_offset(self.topic, p, offset)

    def lag(self) -> int:
        """Records committed past the positions, as of the last poll."""
        return sum(c.available() for c in self._cursors.values())

    def poll(self, timeout: float = 0.0, max_records: int | None = None) -> list[FetchedBatch]:
        """The records committed past the positions (at most ``max_records``), waiting up
        to ``timeout`` seconds for some; ``[]`` if none came. Partitions take turns."""
        wait = check_seconds("timeout", timeout)
        assert wait is not None
        if max_records is not None and (isinstance(max_records, bool) or
                                        not isinstance(max_records, int) or max_records < 1):
            raise InvalidArgument(f"max_records must be a positive integer or None, got "
                                  f"{max_records!r}")
        deadline = time.monotonic() + wait
        while True:
            self.topic.refresh()
            if self._every and self.topic.partitions > len(self._cursors):
                # Added partitions: from the group's offset, else the earliest (all of it).
                committed = self.committed()
                for p in range(len(self._cursors), self.topic.partitions):
                    at = committed.get(p, start_offset(self.topic, p, "earliest"))
                    self._cursors[p] = PartitionCursor(self.topic, p, at, self.reset,
                                                       self.verify, self.skip_corrupt)
                    if committed.get(p) == at:
                        self._committed[p] = at
            before = self.positions()
            out = self._read(max_records)
            if not out and self.positions() != before:
                continue  # only corrupt chunks were skipped: what follows them is there now
            left = deadline - time.monotonic()
            if out or left <= 0:
                return out
            time.sleep(min(self.poll_interval, left))

    def _read(self, max_records: int | None) -> list[FetchedBatch]:
        order = sorted(self._cursors)
        order = order[self._turn % len(order):] + order[:self._turn % len(order)]
        self._turn += 1
        out: list[FetchedBatch] = []
        left = max_records
        for p in order:
            for fb in self._cursors[p].fetch(left):
                out.append(fb)
                if left is not None:
                    left -= fb.batch.num_rows
            if left is not None and left <= 0:
                break
        return out

    def commit(self) -> dict[int, int]:
        """Record the positions as the group's committed offsets (its other partitions
        keep theirs); nothing is published when they have not changed. Returns them."""
        if self.group is None:
            raise InvalidArgument(f"a consumer of topic {self.topic.name!r} without a group "
                                  "has no position to commit: give it a group")
        now = self.positions()
        changed = {p: o for p, o in now.items() if self._committed.get(p) != o}
        if changed:
            self.topic.set_position(self.group, changed)
            self._committed.update(changed)
        return now


__all__ = ["Consumer"]
