"""Housekeeping: what runs after a topic published a commit.

What it does: :func:`after_commit`, called by the store
(:meth:`~tier_store.host.TopicHost.after_commit`) after each commit that made records
visible, under the committing handle's lock:

1. Every ``log.checkpoint.interval`` versions (or when the last checkpoint this handle
   wrote is ``2 * log.checkpoint.interval`` versions old), take what a checkpoint of the
   state needs, and leave writing it to the maintenance thread (:mod:`.deferred`): the
   commit does not wait for that I/O. Then collect garbage (:mod:`.garbage`) here, where
   no append of this thread holds a partition's lock.
2. Apply retention (:mod:`.retention`) and collect dropped segments' index pieces
   (:mod:`.pieces`), at most every ``log.retention.check.interval.ms`` per host.
3. On a store shared by many hosts, reclaim the topic's bundles no committed chunk names
   (:mod:`.bundles`), at most every :func:`.bundles.sweep_interval` seconds per topic in
   this process: a listing per commit would cost more than the commit.

Each step is crash-safe on its own (see its module); a crash between them leaves the rest
to a later commit.

DANGER: what its steps delete: segments past retention, unreferenced segment files and
bundles (see those modules for what protects readers), and the commit-log entries and
checkpoints a new checkpoint supersedes, once older than ``log.cleanup.grace.ms`` (a reader
loading the log meanwhile still finds them). Its own rule: the
commit is already visible, so a failure here is logged, never raised. A caller told that
its commit failed would retry it and, without a writer id, append its records twice. A
failed checkpoint is written by a later commit (at most ``2 * log.checkpoint.interval``
versions on); garbage and retention run again too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import deferred
from .bundles import reclaim_due
from .garbage import collect_garbage
from .pieces import collect_pieces
from .retention import apply_retention, retention_due

if TYPE_CHECKING:
    from ..topic import Topic

log = logging.getLogger(__name__)


def after_commit(topic: Topic) -> None:
    """Housekeeping after ``topic`` published a commit: checkpoint, garbage, retention,
    bundles. Failures are logged, never raised (see the module docstring)."""
    version = topic.state(refresh=False).version
    interval = topic.setting("log.checkpoint.interval")
    # Overdue counts from the last checkpoint begun: one still being written is no reason to
    # write another off the interval (cleanup looks for checkpoints at its multiples).
    if (version % interval == 0 or version - topic.log.checkpoint_begun >= 2 * interval) \
            and not deferred.pending(topic.log):
        try:
            finish = topic.log.start_checkpoint(topic.setting("log.cleanup.grace.ms"),
                                                interval)
        except Exception as e:
            _failed(topic, version, f"writing the checkpoint at version {version}", e)
        else:
            deferred.submit(topic.log, lambda: _checkpoint_rest(topic, version, finish))
        # Here, not on the maintenance thread: a file is reclaimed under its partition's
        # append lock, taken without waiting, and a writer's next append holds it nearly
        # always (a producer's tier 1 filled with files retention had dropped).
        try:
            collect_garbage(topic)
        except Exception as e:
            _failed(topic, version, "collecting garbage", e)
    try:
        if retention_due(topic):
            apply_retention(topic)
            collect_pieces(topic)
    except Exception as e:
        _failed(topic, version, "applying retention", e)
    try:
        reclaim_due(topic)
    except Exception as e:
        _failed(topic, version, "reclaiming bundles", e)


def _checkpoint_rest(topic: Topic, version: int, finish: Callable[[], int]) -> None:
    """On the maintenance thread: write the checkpoint."""
    try:
        finish()
    except Exception as e:
        _failed(topic, version, f"writing the checkpoint at version {version}", e)


def _failed(topic: Topic, version: int, what: str, e: Exception) -> None:
    log.warning("topic %s: %s after committing version %d failed: %s: %s (the commit "
                "stands; this is retried after a later commit)", topic.name, what, version,
                type(e).__name__, e)


__all__ = ["after_commit"]
