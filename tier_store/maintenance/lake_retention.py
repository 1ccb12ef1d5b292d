"""Lake retention: a topic's table keeps its rows until ``lake.retention.ms`` says otherwise.

The log's retention (``log.retention.*``) drops lake segments from the log only: the table is
the topic's history. ``lake.retention.ms`` (-1 by default: keep every row) bounds that
history. Each pass of the migration service removes, per partition, the oldest run of files
whose rows are all older than it: whole files only, never a rewrite. Lake segments the log
still names among them are deleted from the log first, so a reader never plans a read of a
file the table dropped. The files themselves go when delta-rs vacuums them, after
``log.cleanup.grace.ms`` (at least an hour: vacuum counts hours), so a reader of an older
table version finishes.

``purge_lake`` deletes a topic's whole table: what ``pafka delete-topic --purge-lake`` asks.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from ..conflicts import SegmentsUnchanged, planned
from .demote import lake_table

if TYPE_CHECKING:
    from ..store import Store
    from ..topic import Topic

log = logging.getLogger(__name__)


def apply_lake_retention(topic: Topic, now_ms: int | None = None, scheduled: bool = False
                         ) -> int:
    """Remove from ``topic``'s lake table the oldest files past ``lake.retention.ms`` (see
    the module docstring); returns the rows removed. ``scheduled`` (the service's runs):
    at most every ``log.retention.check.interval.ms`` per table handle, since a check reads
    the table's whole file list."""
    keep_ms = topic.setting("lake.retention.ms")
    last = topic.store.tiers[-1]
    if keep_ms < 0 or not last.is_lake:
        return 0
    table = lake_table(topic, last)  # type: ignore[arg-type]
    now = time.monotonic()
    every = topic.setting("log.retention.check.interval.ms") / 1000.0
    if scheduled and now - table.retention_checked < every:
        return 0
    table.retention_checked = now
    cutoff = (int(time.time() * 1000) if now_ms is None else now_ms) - keep_ms
    ends = table.expired_ends(cutoff)
    if not ends:
        return 0
    # The log first: a lake segment it names below a cut goes from it before its file does.
    # A partition whose log holds anything else below its cut (a segment not in the lake, or
    # one across the cut) waits: its file could not go whole.
    with topic.snapshot() as st:
        below = {p: [s for s in st.partition_segments(p) if s.base < end]
                 for p, end in ends.items()}
        for p, segs in below.items():
            if any(s.lake is None or s.end > ends[p] for s in segs):
                del ends[p]
        named = [s for p in ends for s in below[p]]
        seen = SegmentsUnchanged(topic.name, planned(named), "lake retention")
    if not ends:
        return 0
    if named:
        # Refused if a segment below a cut changed since: then the next run decides again.
        topic.delete_segments([s.id for s in named], "lake.retention", requirements=[seen])
    hours = max(1, math.ceil(topic.setting("log.cleanup.grace.ms") / 3_600_000))
    removed = table.remove_below(ends, vacuum_hours=hours)
    log.info("topic %s: lake retention removed %d rows below offsets %s", topic.name, removed,
             ends)
    return removed


def purge_lake(store: Store, topic: str, topic_id: str) -> bool:
    """Delete the lake table of topic ``topic``'s incarnation ``topic_id`` (deleted first:
    a reader never meets a log naming files already gone); False if there is none."""
    from ..tiers.remote import filesystem
    last = store.tiers[-1]
    if not last.is_lake:
        return False
    fs, path = filesystem(last.table_uri(topic, topic_id))  # type: ignore[attr-defined]
    if not fs.exists(path):
        return False
    fs.rm(path, recursive=True)
    with last.tables_lock:  # type: ignore[attr-defined]
        last.tables.pop(topic_id, None)  # type: ignore[attr-defined]
    log.info("deleted the lake table of topic %s (%s): %s", topic, topic_id, path)
    return True


__all__ = ["apply_lake_retention", "purge_lake"]
