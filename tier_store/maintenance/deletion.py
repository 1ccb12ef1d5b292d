"""Deletion: deleting a topic, and reclaiming what deleted topics left on the tiers.

What it does: :func:`delete_topic` takes a topic out of the store, all of it: its commit
log, its segments on every tier; :func:`reclaim_deleted` reclaims what deleted topics left
(the migration service runs it on every run). Both work on the store, through the small
protocol :class:`DeletionHost`.

DANGER: it deletes a whole topic: every record, the commit log, the consumer positions.
Readers are protected twice: a segment file a reader maps (pins) is left in the graves
until it is released, never reused under it; and a reader's plan names the incarnation it
read (the topic's id), so it never reads a topic created again under the name.

A topic is deleted in ordered, crash-safe steps (each rename is atomic):

1. Each local tier's directory of the topic is renamed to ``<tier>/_deleted/<topic>.<id>``,
   and a remote tier's objects of the topic are deleted. Until step 2 the topic still
   exists, with its data gone: a crash here leaves a topic whose reads fail as data loss,
   and deleting it again finishes the job.
2. The topic's directory under the root (its commit log, pointers and locks) is renamed to
   ``<root>/_deleted/<topic>.<id>``; on an object root (``s3://``) its ``_topic.json`` is
   deleted, then its incarnation's log objects, then this host's pointers and locks
   (:meth:`~tier_store.ownership.RootFiles.delete_topic_log`). From here the topic does not
   exist, and a topic created
   under its name is a new incarnation, with a new id. Handles on the old one fail
   (:class:`~tier_store.errors.TopicDeleted`), commits of chunks written to it are refused,
   and a streaming query whose offsets name it stops with a clear error.
3. The graves are reclaimed: files no reader pins go at once (pool files back to the pool);
   a file still mapped by a reader is left for the next pass, which the migration service
   runs on every run (:func:`reclaim_deleted`).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import TYPE_CHECKING, Protocol

from ..layout import DELETED_DIR, bury
from ..pins import MAPS
from .garbage import release_file

if TYPE_CHECKING:
    from ..ownership import RootFiles
    from ..tiers import Tier
    from ..topic import Topic

log = logging.getLogger(__name__)


class DeletionHost(Protocol):
    """What deleting a topic needs of the store that holds it."""

    root: str
    tiers: list[Tier]
    files: RootFiles

    def topic(self, name: str) -> Topic:
        """The handle of an existing topic; TopicNotFound lists the topics."""

    def forget_topic(self, name: str, incarnation: str = "") -> None:
        """Close the cached handle on topic ``name`` and its cached lock files."""

    def claim_remote(self, tier: Tier) -> None:
        """Make sure remote ``tier`` is this store's before deleting files there."""


def _bury_strays(store: DeletionHost, tier_dir: str, graves: str) -> None:
    """Move to the graves a tier's directories of topics that do not exist: what a writer
    holding a handle on a deleted topic created there after the deletion. (A topic's tier
    directories are made by its appends, after its commit log exists.)"""
    try:
        names = os.listdir(tier_dir)
    except FileNotFoundError:
        return
    for n in names:
        d = os.path.join(tier_dir, n)
        if n.startswith(("_", ".")) or not os.path.isdir(d) or os.path.islink(d) or \
                store.files.is_topic(n):
            continue
        log.info("tier %s: %s belongs to no topic (left by a writer of a deleted topic); "
                 "reclaiming it", tier_dir, n)
        bury(d, graves, f"{n}.stray-{uuid.uuid4().hex[:8]}")


def delete_topic(store: DeletionHost, name: str) -> int:
    """Delete topic ``name`` of ``store`` (see the module's steps); returns the number of
    its segment files still pinned by readers, reclaimed by a later pass."""
    topic = store.topic(name)  # TopicNotFound listing the topics
    grave = f"{name}.{topic.id or uuid.uuid4().hex}"
    for tier in store.tiers:
        if tier.is_lake:
            continue  # the table stays: its rows outlive the topic unless purged on purpose
        if not tier.local:
            store.claim_remote(tier)
            tier.delete_topic(name)
            continue
        d = os.path.join(tier.path, name)
        if os.path.isdir(d) and not os.path.islink(d):
            bury(d, os.path.join(tier.path, DELETED_DIR), grave)
    store.forget_topic(name, topic.id)
    store.files.delete_topic_log(name, topic.id)
    log.info("deleted topic %s (id %s) of the store at %s", name, topic.id or "none",
             store.root)
    # This process's own cached mappings of the topic pin its files: drop them.
    MAPS.drop_under([os.path.join(t.path, name) + os.sep for t in store.tiers if t.local])
    return reclaim_deleted(store)


def reclaim_deleted(store: DeletionHost) -> int:
    """Reclaim what deleted topics left: their logs, and their segment files that no reader
    pins. Returns how many files are still pinned (left for the next pass)."""
    store.files.reclaim_deleted()
    pinned = 0
    for tier in store.tiers:
        if not tier.local or tier.is_lake:  # a lake's directories are tables, not topics
            continue
        tgraves = os.path.join(tier.path, DELETED_DIR)
        _bury_strays(store, tier.path, tgraves)
        if not os.path.isdir(tgraves):
            continue
        for dirpath, _dirs, files in os.walk(tgraves, topdown=False):
            for f in files:
                path = os.path.join(dirpath, f)
                if os.path.islink(path):
                    os.unlink(path)
                elif not release_file(tier, path, lambda _st: True) and os.path.exists(path):
                    pinned += 1
            if dirpath != tgraves:
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass  # files still pinned in it
    if pinned:
        log.info("store %s: %d files of deleted topics are still mapped by readers; they are "
                 "reclaimed once released", store.root, pinned)
    return pinned


__all__ = ["DeletionHost", "delete_topic", "reclaim_deleted"]
