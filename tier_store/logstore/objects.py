"""A commit log under a prefix of an object store (S3), published with conditional puts.

Layout under the log's prefix (names from :mod:`tier_store.layout`)::

    <20-digit>.json                     entry, one per version
    <20-digit>.checkpoint               checkpoint (an Arrow IPC file)
    _last_checkpoint/<20-digit>         the hint: one empty marker per advance; the highest
                                        names the newest checkpoint

Put-if-absent is :meth:`~tier_store.objects.ObjectStore.put_if_absent` (``If-None-Match:
*``): the server creates a key at most once, with the whole body or nothing, and a PUT that
returned is durable. Nothing is staged, so a writer killed mid-upload leaves nothing behind.

The hint is a set of markers rather than one object rewritten in place: a marker is created
with put-if-absent and the hint is the highest one listed, so concurrent advances never move
it back (an S3 PUT cannot compare-and-swap portably). Old markers are deleted behind the new
one; the highest is never deleted, as every deleter keeps one at least as high.

Incarnation: the log belongs to one incarnation of its topic. The store is given a callable
(``incarnation_check``) that reads the topic's marker (``<topic>/_topic.json``) and raises
:class:`~tier_store.errors.TopicDeleted` once it no longer names this incarnation; it
returns False while no topic of that name exists yet, anything else when it is there.
:meth:`check_incarnation` and :meth:`put_if_absent` reuse a pass for up to
``recheck_seconds``: a read or a put within that second could as well have happened just
before the deletion. Such a put, or one racing with the deletion, lands in the old
incarnation's prefix, which nobody reads; it saves a request on every commit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from ..crash import crash_point
from ..errors import StoreFull, TopicDeleted
from ..index_pieces import INDEX_DIR
from ..layout import (
    CHECKPOINT_SUFFIX,
    LAST_CHECKPOINT,
    checkpoint_name,
    entry_name,
    parse_log_name,
)
from ..objects import ObjectInfo, ObjectStore
from .base import Blob, LogFile, LogStore

#: How many hint markers an advance leaves below the new one (the rest are deleted).
_KEEP_MARKERS = 2


def hint_marker(version: int) -> str:
    """The key of the hint marker naming checkpoint ``version``."""
    return f"{LAST_CHECKPOINT}/{version:020d}"


class ObjectLogStore(LogStore):
    """The commit log of one topic incarnation under ``objects`` (already the log's
    prefix); see the module for its keys and the incarnation check."""

    def __init__(self, objects: ObjectStore, topic: str,
                 incarnation_check: Callable[[], bool | None] | None = None,
                 recheck_seconds: float = 1.0):
        self.objects = objects
        self.location = objects.url
        self.topic = topic
        self._check = incarnation_check
        self._recheck = recheck_seconds
        self._checked_at = -float("inf")  # monotonic time of the last passed check
        self._deleted: TopicDeleted | None = None  # once deleted, always deleted
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ObjectLogStore({self.location!r}, {self.topic!r})"

    # -- the log as a whole ---------------------------------------------------------------
    def exists(self) -> bool:
        if self._check is None:
            return bool(self.objects.list()[:1])
        try:
            return self._run_check() is not False
        except TopicDeleted:
            return False

    def check_incarnation(self) -> None:
        if self._deleted is not None:
            raise self._deleted
        if time.monotonic() - self._checked_at >= self._recheck:
            self._run_check()

    def _run_check(self) -> bool | None:
        """Ask the incarnation check (always); remember a pass, and a deletion for good."""
        if self._check is None:
            return None
        if self._deleted is not None:
            raise self._deleted
        started = time.monotonic()
        try:
            present = self._check()
        except TopicDeleted as e:
            with self._lock:
                self._deleted = e
            raise
        if present is not False:  # nothing there yet proves nothing: ask again next time
            with self._lock:
                self._checked_at = max(self._checked_at, started)
        return present

    def close(self) -> None:
        pass  # connections are shared per process (see tier_store.objects)

    def entry_location(self, version: int) -> str:
        return self.objects.where(entry_name(version))

    def checkpoint_location(self, version: int) -> str:
        return self.objects.where(checkpoint_name(version))

    # -- entries --------------------------------------------------------------------------
    def put_if_absent(self, version: int, data: bytes) -> bool:
        self.check_incarnation()  # at most recheck_seconds old: see the module docstring
        crash_point("log.publish.tmp")
        try:
            created = self.objects.put_if_absent(entry_name(version), data)
        except StoreFull as e:
            raise StoreFull(f"topic {self.topic!r}: entry {version} was not published: "
                            f"{e}") from None
        if created:
            crash_point("log.publish.linked")
        return created

    def read(self, version: int) -> bytes | None:
        return self.objects.get(entry_name(version))

    def contains(self, version: int) -> bool:
        return self.objects.exists(entry_name(version))

    def versions(self, from_version: int = 0) -> list[int]:
        return [v for v, cp, _ in self._files(from_version) if not cp]

    def _files(self, from_version: int = 0) -> list[tuple[int, bool, ObjectInfo]]:
        """Entries and checkpoints listed, ``>= from_version``, by version (a version's
        checkpoint first)."""
        # Keys sort by their 20 digits; "<N>" sorts before "<N>.checkpoint" and "<N>.json".
        start = f"{from_version - 1:020d}~" if from_version > 0 else None
        found = []
        for info in self.objects.list(start_after=start):
            parsed = parse_log_name(info.key)
            if parsed is not None and parsed[0] >= from_version:
                found.append((parsed[0], parsed[1] == CHECKPOINT_SUFFIX, info))
        return sorted(found, key=lambda f: (f[0], not f[1]))

    # -- checkpoints ----------------------------------------------------------------------
    def write_checkpoint(self, version: int, data: Blob) -> bool:
        crash_point("checkpoint.write")  # nothing is staged: dying here leaves nothing
        try:
            return self.objects.put_if_absent(checkpoint_name(version), bytes(data))
        except StoreFull as e:
            raise StoreFull(f"topic {self.topic!r}: checkpoint {version} was not written: "
                            f"{e}") from None

    def read_checkpoint(self, version: int) -> Blob | None:
        return self.objects.get(checkpoint_name(version))

    def checkpoints(self) -> list[int]:
        return [v for v, cp, _ in self._files() if cp]

    def last_checkpoint_hint(self) -> int | None:
        markers = self._markers()
        return markers[-1] if markers else None

    def _markers(self) -> list[int]:
        found = []
        for info in self.objects.list(LAST_CHECKPOINT):
            digits = info.key.rsplit("/", 1)[-1]
            if len(digits) == 20 and digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def advance_checkpoint_hint(self, version: int) -> int | None:
        markers = self._markers()
        previous = markers[-1] if markers else None
        if previous is not None and previous >= version:
            return previous
        try:
            self.objects.put_if_absent(hint_marker(version), b"")
        except StoreFull as e:
            raise StoreFull(f"topic {self.topic!r}: the checkpoint hint was not moved to "
                            f"{version}: {e}") from None
        # Behind the new marker: a marker always stays that is >= every one deleted here.
        stale = markers[:-_KEEP_MARKERS] if len(markers) > _KEEP_MARKERS else []
        self.objects.delete(hint_marker(v) for v in stale)
        return previous

    # -- cleanup --------------------------------------------------------------------------
    def listing(self, below: int | None = None) -> list[LogFile]:
        return [LogFile(v, cp, info.mtime) for v, cp, info in self._files()
                if below is None or v < below]

    def delete(self, files: Iterable[LogFile]) -> int:
        files = list(files)
        if not files:
            return 0
        # S3 does not say whether a deleted key existed: look first (one listing).
        lowest = min(f.version for f in files)
        start = f"{lowest - 1:020d}~" if lowest > 0 else None
        present = {info.key for info in self.objects.list(start_after=start)}
        keys = [k for f in files
                if (k := checkpoint_name(f.version) if f.checkpoint
                    else entry_name(f.version)) in present]
        return self.objects.delete(keys)  # in the order given: oldest first

    def discard_temporaries(self, older_than: float) -> int:
        return 0  # nothing is staged: a PUT is whole or absent

    # -- index pieces ---------------------------------------------------------------------
    def put_piece(self, folder: str, name: str, data: bytes) -> None:
        try:
            self.objects.put_if_absent(f"{folder}/{name}", data)  # False: already there
        except StoreFull as e:
            raise StoreFull(f"topic {self.topic!r}: index piece {folder}/{name} was not "
                            f"written: {e}") from None

    def read_piece(self, folder: str, name: str) -> Blob | None:
        return self.objects.get(f"{folder}/{name}")

    def piece_folders(self) -> list[tuple[str, float]]:
        # One listing of the index's keys: a folder's time is its newest piece's.
        newest: dict[str, float] = {}
        for info in self.objects.list(INDEX_DIR):
            parts = info.key.split("/")
            if len(parts) == 3:
                newest[parts[1]] = max(newest.get(parts[1], 0.0), info.mtime)
        return sorted(newest.items())

    def delete_piece_folder(self, folder: str) -> int:
        keys = [info.key for info in self.objects.list(folder)]
        return self.objects.delete(keys) if keys else 0

