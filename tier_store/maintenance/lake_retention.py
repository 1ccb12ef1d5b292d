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

from .demote import lake_table

if TYPE_CHECKING:
    from ..store import Store
    from ..topic import Topic

log = logging.getLogger(__name__)


def apply_lake_retention(topic: Topic, now_ms: int | None = None) -> int:
    """Remove from ``topic``'s lake table the oldest files past ``lake.retention.ms`` (see
    the module docstring); returns the rows removed."""
    keep_ms = topic.setting("lake.retention.ms")
    last = topic.store.tiers[-1]
    if keep_ms < 0 or not last.is_lake:
        return 0
    table = lake_table(topic, last)  # type: ignore[arg-type]
    cutoff = (int(time.time() * 1000) if now_ms is None else now_ms) - keep_ms
    ends = table.expired_ends(cutoff)
    if not ends:
        return 0
    # The log first: a lake segment it names below a cut goes from it before its file does.
    with topic.snapshot() as st:
        named = [s.id for s in st.segments.values()
                 if s.partition in ends and st.segments[s.id].lake is not None
                 and s.end <= ends[s.partition]]
    if named:
        topic.delete_segments(named, "lake.retention")
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
    log.info("deleted the lake table of topic %s (%s): %s", topic, topic_id, path)
    return True


__all__ = ["apply_lake_retention", "purge_lake"]
