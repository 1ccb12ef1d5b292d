"""The seam for what a store keeps under its root, besides the topics' commit logs.

A store's root holds small files of its own state — ``_store.json`` (its configuration,
layout and tier relocation counts), ``_migration.json`` (the migration service's counters)
— the store and tier locks (``_store.lock``: opens against a resize or relocation;
``_tiers.lock``: the relocation fence around every publish), and one directory per topic.
Everything the store does with them goes through :class:`RootFiles`, stated as a contract
so that another implementation (an object store, where ``create`` is a put-if-absent and
locks become conditional writes) can take the place of :class:`PosixRootFiles` without
touching the store's logic.

Contract:

* ``read(name)`` returns a file's whole content as last replaced or created, or None when
  there is none; never a partial write.
* ``create(name, data)`` makes the file iff it does not exist, atomically (two creators:
  exactly one gets True) and durably on return.
* ``replace(name, data)`` replaces the content atomically and durably: a reader sees the
  old or the new content, a crash leaves one of them.
* ``stamp(name)`` changes whenever the file is created or replaced (None if there is none):
  a cached parse is reused while it is the same.
* ``replace_if(name, data, stamp)`` replaces the content iff ``stamp(name)`` still is
  ``stamp`` (None: creates it iff absent), atomically against every other writer (of any
  process, on any host the root is shared with): True if it did. Read-modify-write
  callers (merging counters, saving a resize) loop on it.
* ``where(name)`` names the file (path or URL of its current version), for messages.
* ``lock(name, shared)`` holds a lock across processes of this host until the context
  exits (exclusive unless ``shared``); the holder's death releases it. It orders this
  host's processes only: on a root shared by hosts, ``replace_if`` orders the rest.
* ``topic_names()`` lists the topics (those whose commit log has begun), sorted;
  ``is_topic(name)`` says whether one is.
* ``topic_log(name)`` is the :class:`~tier_store.logstore.LogStore` of a topic's commit log;
  ``new_topic_log(name, incarnation)`` prepares a new topic's place first (durably), so that
  entry 0 can be published into it, and returns its log with the incarnation it belongs
  to (another one when a creation that crashed before entry 0 left its place: entry 0
  then names that one).
* ``delete_topic_log(name, incarnation)`` deletes the topic's commit log: from its first
  step the topic does not exist (handles on it fail with TopicDeleted).
  ``reclaim_deleted()`` reclaims what deletions left.
* ``partitions_dir(name, incarnation)`` is the local directory of the topic's partition
  pointers and locks on this host (made if missing).
* ``shared``: whether other hosts write the root too (an object store): a lost ``create``
  of ``_store.json`` is then another host's store, not a file written by hand.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from ..errors import ConfigError, CorruptState, InvalidArgument
from ..layout import (
    DELETED_DIR,
    bury,
    check_topic_name,
    create_exclusive,
    file_lock,
    is_topic,
    log_dir,
    makedirs_durable,
    open_regular,
    partitions_dir,
    topic_dir,
    topic_names,
    write_atomic,
)
from ..logstore import LogStore, PosixLogStore


class RootFiles(ABC):
    """A store root's own files and locks (see the module docstring for the contract)."""

    root: str
    shared: bool = False

    @abstractmethod
    def read(self, name: str) -> bytes | None:
        """The content of file ``name``; None if there is none. Anything but a regular file
        in its place (a directory, a FIFO, a link) is :class:`CorruptState` naming it."""

    @abstractmethod
    def create(self, name: str, data: bytes) -> bool: ...

    @abstractmethod
    def replace(self, name: str, data: bytes) -> None: ...

    @abstractmethod
    def replace_if(self, name: str, data: bytes, stamp: Hashable | None) -> bool: ...

    @abstractmethod
    def stamp(self, name: str) -> Hashable | None: ...

    @abstractmethod
    def where(self, name: str) -> str: ...

    @abstractmethod
    def lock(self, name: str, shared: bool = False) -> contextlib.AbstractContextManager[None]:
        ...

    @abstractmethod
    def topic_names(self) -> list[str]: ...

    @abstractmethod
    def is_topic(self, name: str) -> bool: ...

    @abstractmethod
    def topic_log(self, name: str) -> LogStore: ...

    @abstractmethod
    def new_topic_log(self, name: str, incarnation: str) -> tuple[LogStore, str]: ...

    @abstractmethod
    def delete_topic_log(self, name: str, incarnation: str) -> None: ...

    @abstractmethod
    def reclaim_deleted(self) -> None: ...

    @abstractmethod
    def partitions_dir(self, name: str, incarnation: str) -> str: ...

    @abstractmethod
    def incarnation(self, name: str) -> str | None:
        """The incarnation the root names for topic ``name`` now ("" where the root does not
        track them), None if there is none."""

    @abstractmethod
    def make_root(self) -> None:
        """Create the root if missing (durably)."""


class PosixRootFiles(RootFiles):
    """A root directory on a local (POSIX) filesystem: ``link()`` for create, rename for
    replace, ``flock`` for locks."""

    def __init__(self, root: str):
        self.root = root

    def _path(self, name: str) -> str:
        if os.sep in name or name in ("", ".", ".."):
            raise ValueError(f"not a file name of a store root: {name!r}")
        return os.path.join(self.root, name)

    def read(self, name: str) -> bytes | None:
        path = self._path(name)
        try:
            fd = open_regular(path, CorruptState, follow=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            raise CorruptState(f"{path} is a symbolic link, not a regular file: the store "
                               "never reads its own files through links; put the file "
                               "itself there") from None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def create(self, name: str, data: bytes) -> bool:
        return create_exclusive(self._path(name), data)

    def replace(self, name: str, data: bytes) -> None:
        write_atomic(self._path(name), data)

    def replace_if(self, name: str, data: bytes, stamp: Hashable | None) -> bool:
        # A lock of its own: callers may hold the store's locks already (a second flock of
        # the same file from this process would wait for itself).
        with file_lock(self._path(name) + ".lock"):
            if self.stamp(name) != stamp:
                return False
            if stamp is None:
                return self.create(name, data)
            self.replace(name, data)
            return True

    def where(self, name: str) -> str:
        return self._path(name)

    def stamp(self, name: str) -> Hashable | None:
        try:
            st = os.stat(self._path(name))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size

    @contextlib.contextmanager
    def lock(self, name: str, shared: bool = False) -> Iterator[None]:
        with file_lock(self._path(name), shared=shared):
            yield

    def topic_names(self) -> list[str]:
        # A directory whose name no topic can have (made by hand) is not one of them.
        return [n for n in topic_names(self.root) if valid_topic_name(n)]

    def is_topic(self, name: str) -> bool:
        return is_topic(self.root, name)

    def topic_log(self, name: str) -> LogStore:
        return PosixLogStore(log_dir(self.root, name), name)

    def new_topic_log(self, name: str, incarnation: str) -> tuple[LogStore, str]:
        # <topic>/ in the root and _log/, _partitions/ in <topic>/: all durable before the
        # create entry can be.
        makedirs_durable(log_dir(self.root, name))
        makedirs_durable(partitions_dir(self.root, name))
        return self.topic_log(name), incarnation

    def delete_topic_log(self, name: str, incarnation: str) -> None:
        # One rename: from then on the name leads nowhere (handles see another inode).
        bury(topic_dir(self.root, name), os.path.join(self.root, DELETED_DIR),
             f"{name}.{incarnation or uuid.uuid4().hex}")

    def reclaim_deleted(self) -> None:
        graves = os.path.join(self.root, DELETED_DIR)
        if os.path.isdir(graves):
            for g in os.listdir(graves):
                shutil.rmtree(os.path.join(graves, g), ignore_errors=True)

    def partitions_dir(self, name: str, incarnation: str) -> str:
        return partitions_dir(self.root, name)

    def incarnation(self, name: str) -> str | None:
        return "" if self.is_topic(name) else None

    def make_root(self) -> None:
        makedirs_durable(self.root)


def valid_topic_name(name: str) -> bool:
    try:
        check_topic_name(name)
    except InvalidArgument:
        return False
    return True


def update(files: RootFiles, name: str, change: Callable[[bytes | None], bytes],
           attempts: int = 100) -> bytes:
    """Replace file ``name`` by ``change(its content)``, optimistically: read, change, and
    :meth:`RootFiles.replace_if` the content read is still current; else read again and
    change that. Returns what was written."""
    for _ in range(attempts):
        stamp = files.stamp(name)  # before the read: a newer content then fails the put
        data = change(files.read(name))
        if files.replace_if(name, data, stamp):
            return data
    raise ConfigError(f"{files.where(name)}: {attempts} other writers replaced it first in a "
                      "row; giving up")


def read_json_object(files: RootFiles, name: str, fix: str) -> dict[str, Any]:
    """File ``name`` of the root as a JSON object ({} if there is none); a damaged one is
    :class:`CorruptState` naming it and ``fix``."""
    raw = files.read(name)
    return {} if raw is None else json_object(raw, files.where(name), fix)


def json_object(raw: bytes, where: str, fix: str) -> dict[str, Any]:
    """``raw`` (the content of ``where``) as a JSON object; :class:`CorruptState` naming
    ``where`` and ``fix`` if it is not one."""
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise CorruptState(f"{where} is not JSON ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise CorruptState(f"{where} holds {type(data).__name__}, not an object; {fix}")
    return data


__all__ = ["PosixRootFiles", "RootFiles", "json_object", "read_json_object", "update",
           "valid_topic_name"]
