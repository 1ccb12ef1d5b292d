"""A store root on an object store (``s3://bucket/prefix``), shared by many hosts.

Nothing there can be renamed or locked, so every file of the root is written once, with
an atomic put-if-absent (``If-None-Match: *``):

* ``_store.json`` and ``_migration.json`` are series of versions,
  ``_store/<20 digits>.json``; the highest is current. Replacing one puts the next number:
  of two writers that read the same version, exactly one wins (:meth:`replace_if`), the
  other reads again and merges. The oldest versions beyond the newest few are deleted.
* a topic is ``<topic>/_topic.json`` naming its incarnation, created if absent, and the
  incarnation's commit log under ``<topic>/<incarnation>/_log/``
  (:class:`~tier_store.logstore.objects.ObjectLogStore`). The topic exists iff both
  ``_topic.json`` and its log's first entry (or a checkpoint) do. Deleting it deletes
  ``_topic.json`` first: from then on handles on it fail with
  :class:`~tier_store.errors.TopicDeleted`, and a topic created under the name is a new
  incarnation whose log shares no key with the old one.

What only one host's processes share lives in that host's directory
(``storage.host.dir``): the store and tier locks, and the partitions' active pointers and
locks, under ``<topic>.<incarnation>/_partitions/`` so that a topic created again never
reuses old pointers. Those locks order this host's processes only; the root's own files
need none (put-if-absent orders every host).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING

from ..errors import ConfigError, CorruptState, TopicDeleted, TopicNotFound
from ..layout import (
    ENTRY_SUFFIX,
    LOG_DIR,
    MIGRATION_FILE,
    PARTITIONS_DIR,
    STORE_FILE,
    TOPIC_FILE,
    entry_name,
    file_lock,
    makedirs_durable,
    parse_log_name,
)
from ..logstore import LogStore
from .rootfiles import RootFiles, valid_topic_name

if TYPE_CHECKING:
    from ..objects import ObjectStore

log = logging.getLogger(__name__)

#: The root's own files, each kept as numbered versions under a prefix of its own.
VERSIONED = {STORE_FILE: "_store", MIGRATION_FILE: "_migration"}
#: Versions kept besides the newest (a reader that listed a moment ago still finds its own).
KEEP_VERSIONS = 4
_INCARNATION_RE = re.compile(r"^[0-9a-f]{32}$")


class ObjectRootFiles(RootFiles):
    """The root's files on an object store (see the module docstring); ``host_dir`` is this
    host's directory for locks and pointers (None until known: only reads work then)."""

    shared = True

    def __init__(self, objects: ObjectStore, host_dir: str | None):
        self.objects = objects
        self.root = objects.url
        self.host_dir = host_dir
        self._cache: dict[str, tuple[int, bytes]] = {}  # name -> (version, content)
        self._made: set[str] = set()
        self._guard = threading.Lock()

    def __repr__(self) -> str:
        return f"ObjectRootFiles({self.root!r}, host_dir={self.host_dir!r})"

    # -- versioned files ----------------------------------------------------------------
    def _prefix(self, name: str) -> str:
        try:
            return VERSIONED[name]
        except KeyError:
            raise ValueError(f"not a file of a store root: {name!r}") from None

    def _key(self, name: str, version: int) -> str:
        return f"{self._prefix(name)}/{entry_name(version)}"

    def _versions(self, name: str) -> list[int]:
        """The versions of ``name`` present, ascending; an object there that is not one is
        :class:`CorruptState` naming it (written by hand: nothing here writes it)."""
        prefix = self._prefix(name) + "/"
        out = []
        for info in self.objects.list(self._prefix(name)):
            rel = info.key[len(prefix):] if info.key.startswith(prefix) else info.key
            parsed = parse_log_name(rel)
            if parsed is None or parsed[1] != ENTRY_SUFFIX:
                raise CorruptState(
                    f"{self.objects.where(info.key)} is not a version of {name} (those are "
                    f"named {prefix}<20 digits>{ENTRY_SUFFIX}): it was not written by a "
                    "pafka store; delete it")
            out.append(parsed[0])
        return sorted(out)

    def read(self, name: str) -> bytes | None:
        for _ in range(8):
            versions = self._versions(name)
            if not versions:
                return None
            newest = versions[-1]
            with self._guard:
                cached = self._cache.get(name)
            if cached is not None and cached[0] == newest:
                return cached[1]
            data = self.objects.get(self._key(name, newest))
            if data is not None:
                with self._guard:
                    self._cache[name] = (newest, data)
                return data
            # Deleted since the listing (by hand: old versions only are pruned): list again.
        raise ConfigError(f"{self.objects.where(self._prefix(name))}/: the newest version of "
                          f"{name} keeps vanishing; is something deleting the store's objects?")

    def stamp(self, name: str) -> Hashable | None:
        versions = self._versions(name)
        return versions[-1] if versions else None

    def where(self, name: str) -> str:
        versions = self._versions(name)
        return self.objects.where(self._key(name, versions[-1]) if versions
                                  else self._prefix(name) + "/")

    def create(self, name: str, data: bytes) -> bool:
        return self.replace_if(name, data, None)

    def replace_if(self, name: str, data: bytes, stamp: Hashable | None) -> bool:
        if stamp is not None and (isinstance(stamp, bool) or not isinstance(stamp, int)):
            raise ValueError(f"not a stamp of an object root's file: {stamp!r}")
        version = 0 if stamp is None else stamp + 1
        if not self.objects.put_if_absent(self._key(name, version), data):
            return False
        with self._guard:
            self._cache[name] = (version, data)
        if version > KEEP_VERSIONS:
            # Each writer deletes the one that just fell out of the window: no listing.
            self.objects.delete([self._key(name, version - KEEP_VERSIONS - 1)])
        return True

    def replace(self, name: str, data: bytes) -> None:
        # Last writer wins, as with a rename; callers that merge use replace_if.
        for _ in range(100):
            if self.replace_if(name, data, self.stamp(name)):
                return
        raise ConfigError(f"{self.where(name)}: 100 writers in a row replaced {name} first; "
                          "giving up")

    # -- locks and the host directory ----------------------------------------------------
    def _host(self) -> str:
        if self.host_dir is None:
            raise ConfigError(f"the store at {self.root} needs this host's directory "
                              "(storage.host.dir), which is not known yet")
        return self.host_dir

    @contextlib.contextmanager
    def lock(self, name: str, shared: bool = False) -> Iterator[None]:
        """A ``flock`` in this host's directory: it orders this host's processes only."""
        if os.sep in name or name in ("", ".", ".."):
            raise ValueError(f"not a lock name: {name!r}")
        host = self._host()
        if host not in self._made:
            makedirs_durable(host)
            self._made.add(host)
        with file_lock(os.path.join(host, name), shared=shared):
            yield

    def partitions_dir(self, name: str, incarnation: str) -> str:
        path = os.path.join(self._host(), f"{name}.{incarnation}", PARTITIONS_DIR)
        if path not in self._made:
            makedirs_durable(path)
            self._made.add(path)
        return path

    def make_root(self) -> None:
        """Nothing to make: a prefix exists once an object is under it (the bucket must)."""

    # -- topics ---------------------------------------------------------------------------
    def _topic_key(self, name: str) -> str:
        return f"{name}/{TOPIC_FILE}"

    def incarnation(self, name: str) -> str | None:
        raw = self.objects.get(self._topic_key(name))
        if raw is None:
            return None
        try:
            inc = json.loads(raw)["incarnation"]
            if not isinstance(inc, str) or not _INCARNATION_RE.match(inc):
                raise ValueError(f"incarnation {inc!r} is not 32 lowercase hex digits")
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptState(
                f"{self.objects.where(self._topic_key(name))} is damaged: expected "
                f'{{"incarnation": "<32 hex digits>"}} ({e}); it was not written by a pafka '
                f"store. Restore it, or delete it to drop topic {name!r}") from None
        return inc

    def check_incarnation(self, name: str, incarnation: str) -> None:
        """:class:`TopicDeleted` unless ``_topic.json`` of ``name`` names ``incarnation``."""
        now = self.incarnation(name)
        if now != incarnation:
            what = "is gone" if now is None else f"names incarnation {now}"
            again = "" if now is None else " and created again"
            raise TopicDeleted(
                f"topic {name!r} of the store at {self.root} was deleted{again}: "
                f"{self.objects.where(self._topic_key(name))} {what}, not {incarnation}; open "
                "the topic again")

    def _log_objects(self, name: str, incarnation: str) -> ObjectStore:
        return self.objects.child(name).child(incarnation).child(LOG_DIR)

    def _log(self, name: str, incarnation: str) -> LogStore:
        from ..logstore.objects import ObjectLogStore
        return ObjectLogStore(self._log_objects(name, incarnation), name,
                              lambda: self.check_incarnation(name, incarnation))

    def is_topic(self, name: str) -> bool:
        inc = self.incarnation(name)
        if inc is None:
            return False
        logs = self._log_objects(name, inc)
        # Cleanup deletes old entries (entry 0 too) once a checkpoint covers them.
        return logs.exists(entry_name(0)) or \
            bool(logs.list())

    def topic_names(self) -> list[str]:
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in self.objects.prefixes()}
        return sorted(n for n in names if valid_topic_name(n) and self.is_topic(n))

    def topic_log(self, name: str) -> LogStore:
        inc = self.incarnation(name)
        if inc is None:
            raise TopicNotFound(f"topic {name!r} does not exist in {self.root} (no "
                                f"{self.objects.where(self._topic_key(name))})")
        return self._log(name, inc)

    def new_topic_log(self, name: str, incarnation: str) -> tuple[LogStore, str]:
        body = json.dumps({"incarnation": incarnation}).encode()
        for _ in range(8):
            if self.objects.put_if_absent(self._topic_key(name), body):
                return self._log(name, incarnation), incarnation
            now = self.incarnation(name)
            if now is not None:
                # Taken: a topic (entry 0 then refuses this creation), or a creation that
                # died before its entry 0 (this one finishes it, in that incarnation).
                return self._log(name, now), now
        raise ConfigError(f"{self.objects.where(self._topic_key(name))} keeps appearing and "
                          f"vanishing: is topic {name!r} being created and deleted in a loop?")

    def delete_topic_log(self, name: str, incarnation: str) -> None:
        # _topic.json first: from then on the topic is gone for every host. (S3 has no
        # conditional delete: a deletion racing another host's deletion and re-creation of
        # the name may delete the new _topic.json; the check narrows that to a moment.)
        if self.incarnation(name) == incarnation:
            self.objects.delete([self._topic_key(name)])
        logs = self.objects.child(name).child(incarnation)
        deleted = logs.delete([info.key for info in logs.list()])
        log.info("topic %s: deleted incarnation %s of the store at %s (%d objects)", name,
                 incarnation, self.root, deleted)
        if self.host_dir is not None:
            here = os.path.join(self.host_dir, f"{name}.{incarnation}")
            self._made.discard(os.path.join(here, PARTITIONS_DIR))
            shutil.rmtree(here, ignore_errors=True)

    def reclaim_deleted(self) -> None:
        """This host's pointers and locks of topics deleted from other hosts."""
        if self.host_dir is None or not os.path.isdir(self.host_dir):
            return
        for entry in os.listdir(self.host_dir):
            name, _, inc = entry.rpartition(".")
            path = os.path.join(self.host_dir, entry)
            if not name or not _INCARNATION_RE.match(inc) or not os.path.isdir(path):
                continue
            try:
                gone = self.incarnation(name) != inc
            except CorruptState:
                continue
            if gone:
                self._made.discard(os.path.join(path, PARTITIONS_DIR))
                shutil.rmtree(path, ignore_errors=True)


__all__ = ["KEEP_VERSIONS", "ObjectRootFiles"]
