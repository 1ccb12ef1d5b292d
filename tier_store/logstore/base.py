"""The storage under a topic's commit log: the :class:`LogStore` contract.

A commit log is a sequence of numbered, immutable *entries* (version 0, 1, 2, ...), with
*checkpoints* (the whole topic state at a version) and a *hint* naming the newest checkpoint.
:class:`~tier_store.commit_log.CommitLog` encodes, decodes and replays them; a ``LogStore``
only keeps bytes under numbers. Each implementation (a POSIX directory,
:class:`~tier_store.logstore.posix.PosixLogStore`; a prefix of an S3 bucket written with
conditional puts, :class:`~tier_store.logstore.objects.ObjectLogStore`) must keep the
contract stated on each method here; ``tests/test_logstore.py`` checks it for every
implementation. Where an object store keeps a weaker form, the method says so.

Errors, for every method:

* "Not found" is never an exception: reads return ``None``, :meth:`LogStore.contains`
  returns False, listings return what is there (``[]`` for a log that does not exist).
* :class:`~tier_store.errors.TopicDeleted`: the log this store first looked at was deleted
  (and perhaps created again under its name); raised by :meth:`LogStore.check_incarnation`
  and :meth:`LogStore.put_if_absent`. Reads do not check: call ``check_incarnation`` first.
* :class:`~tier_store.errors.StoreFull`: the storage holding the log is full (ENOSPC,
  EDQUOT, a quota), raised by :meth:`LogStore.put_if_absent`, :meth:`LogStore.write_checkpoint`
  and :meth:`LogStore.advance_checkpoint_hint`, naming the log and its filesystem. The write
  did not happen (the entry is not published, the checkpoint or hint not written) and
  nothing it staged is left behind; it may succeed once space returns.
* :class:`OSError`: the storage failed otherwise (I/O error, permission; for an object
  store :class:`~tier_store.errors.StoreUnavailable`, an ``OSError``, once its retries are
  spent, naming the bucket and key). After a failed write the outcome is unknown unless the
  method says otherwise: read to find out.
* Bytes are returned as stored; deciding that they are malformed
  (:class:`~tier_store.errors.CorruptLog`) is the caller's job. But an entry, checkpoint or
  hint that is not a regular file (a directory, a FIFO, a device in its place: a POSIX
  store) is :class:`~tier_store.errors.CorruptLog` naming it, raised by the read without
  reading it: it is damage, never "not found", and a FIFO's read would never end.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import NamedTuple

import pyarrow as pa

#: What reads return: ``bytes``, or a zero-copy view (a memory map) valid while referenced.
Blob = bytes | pa.Buffer


class LogFile(NamedTuple):
    """An entry or checkpoint as listed for cleanup."""

    version: int
    checkpoint: bool  # False: the entry
    mtime: float  # when it was written (seconds since the epoch)


class LogStore(abc.ABC):
    """Numbered entries, checkpoints and a checkpoint hint of one topic's commit log.

    Guarantees every implementation gives:

    * **Put-if-absent.** :meth:`put_if_absent` publishes version N only if no entry N exists;
      of concurrent puts of N (threads, processes, machines) exactly one returns True.
    * **Atomic visibility.** A reader sees a whole entry or checkpoint or none: never a
      partial one, whatever the writer's fate (a crash mid-write leaves nothing visible).
    * **Durability.** A put or checkpoint write that returned has survived a crash of the
      machine (for an object store: the server acknowledged it, and keeps it as durably as
      it keeps anything); so has the hint once :meth:`advance_checkpoint_hint` returned.
    * **Immutability.** Entries and checkpoints are never rewritten, only deleted (by
      :meth:`delete`, oldest first).
    * **Listings** are sorted ascending. They may miss what is published concurrently and
      may name what is being deleted concurrently (reading it then returns ``None``).

    A store is safe to share between threads.
    """

    #: Name of the topic, for messages.
    topic: str
    #: Where the log lives (a path or URL), for messages.
    location: str

    # -- the log as a whole ---------------------------------------------------------------
    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the log is there at all (it may still hold no entry)."""

    @abc.abstractmethod
    def check_incarnation(self) -> None:
        """Raise :class:`~tier_store.errors.TopicDeleted` if the log at :attr:`location` is
        no longer the one this store first saw there (deleted, perhaps created again). The
        first call with the log present pins the incarnation. Cheap: called before reads.

        Object store: one request, so a pass is reused for up to ``recheck_seconds`` (1 s):
        a read within that time of a deletion may still see the old log (as a read just
        before the deletion would). A deletion, once seen, is raised from then on."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the store holds (handles, connections). Idempotent."""

    def entry_location(self, version: int) -> str:
        """The name of entry ``version`` (path or URL), for messages."""
        return f"{self.location}/entry {version}"

    def checkpoint_location(self, version: int) -> str:
        """The name of checkpoint ``version`` (path or URL), for messages."""
        return f"{self.location}/checkpoint {version}"

    # -- entries --------------------------------------------------------------------------
    @abc.abstractmethod
    def put_if_absent(self, version: int, data: bytes) -> bool:
        """Publish ``data`` as entry ``version`` iff that number is free: True once it is
        durable and visible; False if the number is taken (the existing entry is kept,
        byte for byte). Never publishes a partial entry. Raises
        :class:`~tier_store.errors.TopicDeleted` if the log was deleted before or during
        the put (an entry put into a deleted log is visible nowhere). An implementation
        retries transient conflicts (e.g. HTTP 409) itself, for the same number.

        Object store: the incarnation is checked before the put, never from a cached pass;
        a put racing with the deletion may return True, its entry left under the deleted
        incarnation's prefix, which nothing reads (visible nowhere, as above)."""

    @abc.abstractmethod
    def read(self, version: int) -> bytes | None:
        """The bytes of entry ``version``; None if there is no such entry."""

    @abc.abstractmethod
    def contains(self, version: int) -> bool:
        """Whether entry ``version`` exists (without reading it)."""

    @abc.abstractmethod
    def versions(self, from_version: int = 0) -> list[int]:
        """The versions of the entries present, ``>= from_version``, ascending."""

    # -- checkpoints ----------------------------------------------------------------------
    @abc.abstractmethod
    def write_checkpoint(self, version: int, data: Blob) -> bool:
        """Publish ``data`` as checkpoint ``version``, atomically and durably: True if
        written, False if that checkpoint exists already (it is kept: a version's state is
        the same whoever writes it). Does not move the hint."""

    @abc.abstractmethod
    def read_checkpoint(self, version: int) -> Blob | None:
        """The bytes of checkpoint ``version``; None if there is none. An error reading a
        checkpoint that exists is an :class:`OSError`."""

    @abc.abstractmethod
    def checkpoints(self) -> list[int]:
        """The versions of the checkpoints present, ascending."""

    @abc.abstractmethod
    def last_checkpoint_hint(self) -> int | None:
        """The version the hint names; None if there is no hint (or it is unreadable). Only
        a hint: it may lag, or name a checkpoint since deleted; :meth:`checkpoints` is the
        truth. (Object store: a listing of the hint's markers, not a read of one object.)"""

    @abc.abstractmethod
    def advance_checkpoint_hint(self, version: int) -> int | None:
        """Point the hint at ``version`` unless it names ``version`` or newer already, as
        one atomic step against concurrent callers: the hint never moves back. Returns the
        hint as it was (the hint moved iff that is None or less than ``version``).

        Object store: concurrent advances may each return the hint as it was before any of
        them (as if each ran first); the hint still ends at the highest and never moves
        back."""

    # -- cleanup --------------------------------------------------------------------------
    @abc.abstractmethod
    def listing(self, below: int | None = None) -> list[LogFile]:
        """Entries and checkpoints with versions ``< below`` (all if None), ascending by
        version, a version's checkpoint before its entry. Object store: ``mtime`` is by the
        server's clock, compared with this host's by the cleanup grace."""

    def expired(self, below: int, older_than: float, aligned: int = 0) -> list[LogFile]:
        """The entries and checkpoints with versions ``< below`` that a cleanup deletes now,
        ascending (a version's checkpoint before its entry): those written before
        ``older_than`` (seconds since the epoch), up to the first one written since. This
        default lists the log; a store that can probe names cheaply needs no listing.
        Checkpoints are mostly at multiples of ``aligned`` (the topic's checkpoint interval;
        0 if unknown): a store that probes names looks there and where it knows of one."""
        old = self.listing(below=below)
        return old[:next((i for i, f in enumerate(old) if f.mtime >= older_than), len(old))]

    @abc.abstractmethod
    def delete(self, files: Iterable[LogFile]) -> int:
        """Delete ``files`` in the order given (callers pass them oldest first), skipping
        those already gone; returns how many this call deleted. Deletions need not be
        durable: after a crash one may reappear, and is deleted again later."""

    @abc.abstractmethod
    def discard_temporaries(self, older_than: float) -> int:
        """Delete what writers staged and never published (left by a crash) if written
        before ``older_than`` (seconds since the epoch); returns how many. A store that
        stages nothing returns 0."""

    # -- index pieces ---------------------------------------------------------------------
    # Immutable files named by their content, in folders of one segment each
    # (:mod:`tier_store.index_pieces`). ``folder`` and ``name`` are made by that module from
    # validated integers and a digest; a store does not check them again.
    @abc.abstractmethod
    def put_piece(self, folder: str, name: str, data: bytes) -> None:
        """Store ``data`` as piece ``name`` of ``folder``, durably, unless it is there
        already (then the bytes there are the same: the name is their digest)."""

    @abc.abstractmethod
    def read_piece(self, folder: str, name: str) -> Blob | None:
        """The bytes of piece ``name`` of ``folder``; None if it is not there."""

    @abc.abstractmethod
    def piece_folders(self) -> list[tuple[str, float]]:
        """Every piece folder (its name within the index directory) and when it last
        changed (seconds since the epoch): one listing of the index directory."""

    @abc.abstractmethod
    def delete_piece_folder(self, folder: str) -> int:
        """Delete ``folder`` and its pieces; returns how many pieces went."""

