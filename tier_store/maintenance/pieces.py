"""Collecting index pieces: a segment's pieces go once nothing can read them.

What it does: :func:`collect_pieces` lists the topic's piece folders (one listing of the
index directory, never the log) and deletes those of segments the log no longer holds.

Who may still read a dropped segment's pieces: a handle replaying the ``move`` that dropped
it (the new rows take their commit times from the old ones), from a checkpoint older than
that move. So a folder goes only when:

* its segment is not in the state (on that tier), and
* its tombstone's entry is older than the newest checkpoint (every later load starts past
  it) and than ``log.cleanup.grace.ms`` (as entries and segment files are kept), or
* it has no tombstone naming an entry (an orphan: a crashed checkpointer's) and has not
  changed for twice the grace period.

A handle older than that which replays the move anyway finds a piece missing
(:class:`~tier_store.index_pieces.PiecesGone`) and reads the newest checkpoint instead.

Runs with retention: at most every ``log.retention.check.interval.ms`` after commits, and on
every run of the migration service.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..index_pieces import parse_piece_dir
from ..layout import segment_id

if TYPE_CHECKING:
    from ..topic import Topic

log = logging.getLogger(__name__)


def collect_pieces(topic: Topic, now: float | None = None) -> int:
    """Delete the piece folders of ``topic``'s dropped segments (see the module); returns
    how many pieces went."""
    now = time.time() if now is None else now
    grace_s = topic.setting("log.cleanup.grace.ms") / 1000.0
    commit_log = topic.log.commit_log
    st = topic.state()
    newest = commit_log.last_checkpoint()
    deleted = 0
    for folder, mtime in commit_log.store.piece_folders():
        parsed = parse_piece_dir(folder)
        if parsed is None:
            log.warning("topic %s: %r in its index directory is not a piece folder; left "
                        "alone", topic.name, folder)
            continue
        p, seq, tier = parsed
        sid = segment_id(p, seq)
        seg = st.segments.get(sid)
        if seg is not None and seg.tier == tier:
            continue
        tomb = st.tombstone(sid, tier)
        if tomb is not None and len(tomb) == 3:
            if newest is None or tomb[2] >= newest or now - tomb[1] / 1000.0 <= grace_s:
                continue
        elif now - mtime <= 2 * grace_s:
            continue
        deleted += commit_log.store.delete_piece_folder(f"_index/{folder}")
        log.debug("topic %s: deleted the index pieces of segment %s on tier %d", topic.name,
                  sid, tier)
    return deleted


__all__ = ["collect_pieces"]
