"""The store: the composition root that wires topics, tiers, placement, locks and
maintenance (as Kafka's LogManager does), over a root directory of topics' commit logs.

``Store.open(root, config)`` saves the layout (tiers, paths, segment size) in
``<root>/_store.json`` on first open; every later open — executors, the CLI, notebooks —
reads it, and a given layout key that differs is a :class:`ConfigError` naming both values.
What the store owns and how (claims on tiers outside the root, relocation, the relocation
fence) lives in :mod:`tier_store.ownership`; topics see the store through
:class:`~tier_store.host.TopicHost` only.

Thread-safety: a store may be shared by threads; topic handles are cached per store. A
store dropped without :meth:`Store.close` releases its topics' writers (descriptors, PMEM
mappings) once the cycle collector frees it and its handles.

Integrity (``docs/integrity.md``): reads verify each chunk's checksum before Arrow sees its
bytes, and any damage is :class:`CorruptSegment` naming the file. The store never
truncates, shrinks or reuses a file a reader has pinned. A segment truncated from outside
the store is :class:`CorruptSegment` when a read maps it, or reuses its cached mapping.
Truncating a mapped file under a running read can still kill the reader (SIGBUS): no size
check closes that race.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from . import locks, reading, views
from .commit_log import CommitLog
from .config import StoreConfig, load_config
from .errors import (
    InvalidArgument,
    TopicDeleted,
    TopicExists,
    TopicNotFound,
)
from .layout import MIGRATION_FILE, check_topic_name
from .maintenance import deletion, eviction, garbage, housekeeping, pieces
from .maintenance.bundles import reclaim_bundles
from .maintenance.check import CheckReport, check_named, readable_states
from .maintenance.eviction import Evicted
from .maintenance.moves import MoveResult, compactable_ids, move_segment
from .ownership import (
    RelocationFence,
    RootFiles,
    claim_of,
    claim_tier,
    create_entry,
    open_root,
    read_json_object,
    resize_tier,
)
from .ownership.opening import is_shared
from .ownership.rootfiles import json_object, update
from .ownership.roots import root_files, root_location, store_exists, store_identity
from .ownership.saved import resolve_path
from .pins import MAPS
from .placement import Placement
from .sharing import SharedTier
from .state import TopicState
from .tiers import SegmentWriter, Tier
from .topic import Topic

log = logging.getLogger(__name__)
_FRESH_TOTALS = "delete it to start the counters afresh"

def _close(t: Topic, name: str) -> None:
    try:
        t.close()
    except OSError as e:
        log.warning("topic %s: closing its writers failed: %s", name, e)


class Store:
    """A tier store rooted at a directory or an ``s3://`` URL. Use :meth:`open`."""

    def __init__(self, files: RootFiles, config: StoreConfig, tiers: list[Tier],
                 store_id: str, relocations: list[int]):
        self.root = files.root
        self.files = files
        self.config = config
        self.tiers = tiers
        self.id = store_id
        self._topics: dict[str, Topic] = {}
        self._lock = threading.RLock()
        self._fence = RelocationFence(files, relocations)
        self.is_shared = is_shared(self.root, [t.spec for t in tiers])
        self._placement = Placement(self.root, tiers, self.used_bytes, not self.is_shared)
        self._given: dict[str, Any] = {}  # the settings open() was given (for reopen)
        self._shared: SharedTier | None = None

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | os.PathLike[str],
             config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
             create: bool = True) -> Store:
        """Open the store at ``root``, creating it unless ``create=False``.

        ``config`` is a dict of keys or the path of a ``.properties`` file; see
        :mod:`tier_store.config`. Readers pass ``create=False``: a mistyped root is then
        :class:`StoreNotFound`. ``log.reader.map.bytes`` applies to the whole process.

        ``root`` is a directory, or ``s3://bucket/prefix``, shared by every process and
        host that opens it (:mod:`tier_store.ownership.objectroot`): its tiers' paths must
        then be given when it is created, its endpoint comes from ``storage.root.options``
        or the AWS environment, and this host's locks and pointers go to
        ``storage.host.dir``. Any other URL scheme is :class:`ConfigError`.
        """
        root = root_location(root)  # a directory, or s3:// (any other scheme: ConfigError)
        # Tier paths given relative: to the working directory (the saved ones: to the root).
        given = {k: resolve_path(os.getcwd(), k, v) for k, v in load_config(config).items()}
        files = root_files(root, given)
        opened = open_root(files, given, create)
        store = cls(files, opened.config, opened.tiers, opened.store_id, opened.relocations)
        MAPS.max_bytes, store._given = opened.config["log.reader.map.bytes"], given
        return store

    @staticmethod
    def exists(root: str | os.PathLike[str]) -> bool:
        """Whether a store was created at ``root``."""
        return store_exists(root_location(root))

    @staticmethod
    def identity(root: str | os.PathLike[str]) -> Hashable | None:
        """What tells this store apart from one deleted and created again at ``root``
        (None if there is none): a cached handle is reused only while it is the same."""
        return store_identity(root_location(root))

    def migration_totals(self) -> dict[str, Any]:
        """The migration service's counters since the store was made ({} before a run)."""
        return read_json_object(self.files, MIGRATION_FILE, _FRESH_TOTALS)

    def save_migration_totals(self, totals: Mapping[str, Any]) -> None:
        """Replace the migration service's counters (one writer: the service)."""
        self.files.replace(MIGRATION_FILE, json.dumps(dict(totals), indent=1).encode())

    def update_migration_totals(self, change: Callable[[dict[str, Any]], Mapping[str, Any]]
                                ) -> dict[str, Any]:
        """Replace the counters by ``change(counters)`` against concurrent writers (the
        services of several hosts): called again on the newer counters when another
        saved first. Returns what was saved."""
        return _update_totals(self.files, change)

    def relocated(self) -> bool:
        """Whether a tier was relocated since this handle opened the store (its commits and
        moves of data written there are refused; :meth:`reopen` opens the new places)."""
        return self._fence.relocated()

    def reopen(self) -> Store:
        """A new handle on this store, opened with the settings this one was given."""
        return Store.open(self.root, dict(self._given))

    def __repr__(self) -> str:
        return f"Store({self.root!r}, tiers={self.tiers})"

    def tier(self, number: int) -> Tier:
        """Tier ``number`` (1 = fastest)."""
        if not 1 <= number <= len(self.tiers):
            raise InvalidArgument(f"store {self.root} has no tier {number}: it has tiers "
                                  f"1..{len(self.tiers)}")
        return self.tiers[number - 1]

    # -- topics -----------------------------------------------------------------------------
    def create_topic(self, name: str, schema: pa.Schema, partitions: int | None = None,
                     config: Mapping[str, Any] | None = None) -> Topic:
        """Create a topic with an Arrow schema; :class:`TopicExists` if it is there."""
        entry = create_entry(name, schema, self.config["num.partitions"] if partitions is None
                             else partitions, config)
        logs, incarnation = self.files.new_topic_log(name, entry.id)
        if incarnation != entry.id:  # finishing a creation that died before its entry 0
            entry = dataclasses.replace(entry, id=incarnation)
        if not CommitLog.on(logs).publish(0, entry):
            raise TopicExists(f"topic {name!r} already exists in {self.root}")
        log.info("created topic %s with %d partitions", name, entry.partitions)
        return self.topic(name)

    def topic(self, name: str) -> Topic:
        """The handle of an existing topic; :class:`TopicNotFound` lists the topics."""
        check_topic_name(name)
        with self._lock:
            t = self._topics.get(name)
            if t is not None:
                try:
                    return t.refresh()
                except TopicDeleted:
                    # Deleted (and perhaps created again) since: a handle on what is there now.
                    self._topics.pop(name, None)
                    _close(t, name)
            if not self.files.is_topic(name):
                known = self.topics()
                raise TopicNotFound(f"topic {name!r} does not exist in {self.root}; topics: "
                                    f"{', '.join(known) if known else '(none)'}")
            clog = CommitLog.on(self.files.topic_log(name))
            t = Topic(self, name, clog.load(), clog)
            # This host's pointer directory, made durable now: a deferred write never waits.
            self.pointer_dir(name, t.id)
            self._topics[name] = t
            return t

    def delete_topic(self, name: str) -> int:
        """Delete topic ``name``: its files on every tier are reclaimed (once no reader pins
        them), and a topic created under its name later is a new incarnation with another
        id. Returns how many of its files readers still pin (reclaimed by the migration
        service's next run). See :mod:`tier_store.maintenance.deletion`."""
        return deletion.delete_topic(self, name)

    def reclaim_deleted(self) -> int:
        """Reclaim what deleted topics left no reader pins; returns how many are pinned."""
        return deletion.reclaim_deleted(self)

    def forget_topic(self, name: str, incarnation: str = "") -> None:
        """Close this handle's cached handle on topic ``name`` and its cached lock files (the
        topic, incarnation ``incarnation``, is being deleted)."""
        with self._lock:
            t = self._topics.pop(name, None)
        if t is not None:
            _close(t, name)
        locks.forget(self.pointer_dir(name, incarnation or (t.id if t else None)) + os.sep)

    def pointer_dir(self, topic: str, incarnation: str | None = None) -> str:
        """The local directory of topic ``topic``'s partition pointers and locks on this
        host: in the root, or for an object root in this host's directory, per incarnation
        (default: the one this store's handle on the topic has, else the current one)."""
        if incarnation is None and self.files.shared:
            with self._lock:
                t = self._topics.get(topic)
            incarnation = t.id if t is not None else self.files.incarnation(topic) or ""
        return self.files.partitions_dir(topic, incarnation or "")

    def topics(self) -> list[str]:
        """Names of the topics in the store, sorted."""
        return self.files.topic_names()

    def has_topic(self, name: str) -> bool:
        return name in self.topics()

    @property
    def shared(self) -> SharedTier | None:
        """On a store shared by many hosts (an ``s3://`` root with a REMOTE tier), its shared
        tier and this host's number, given on first use (:mod:`tier_store.sharing`)."""
        if self.is_shared and self._shared is None:
            with self._lock:
                self._shared = self._shared or SharedTier.of(self.files, self.tiers)
        return self._shared

    # -- tiers --------------------------------------------------------------------------------
    def _states(self) -> list[TopicState]:
        return readable_states(self)  # a topic whose log is damaged is logged, left out

    def used_bytes(self) -> dict[int, int]:
        """Committed bytes per tier, accounted from every topic's state."""
        shared = self.shared
        return views.used_bytes(self.tiers, self._states(), shared and shared.host)

    def tier_usage(self) -> list[dict[str, Any]]:
        """Per tier: number, type, path, capacity, used bytes, segments (and free pool files)."""
        shared = self.shared
        return views.tier_usage(self.tiers, self._states(), shared and shared.host)

    def place_segment(self, topic: str, partition: int, seq: int, need: int,
                      durable: bool = True) -> tuple[Tier, SegmentWriter]:
        """Create segment ``seq`` by the placement rule (:mod:`tier_store.placement`): on
        the first local tier with room whose filesystem is not out of space; see
        :meth:`Tier.create_segment` for ``durable``."""
        return self._placement.place(topic, partition, seq, need, durable)

    def mark_out_of_space(self, tier: Tier, error: OSError) -> None:
        """Record that ``tier``'s filesystem answered ENOSPC: new segments skip it until
        its filesystem has room for a segment again."""
        self._placement.mark_out_of_space(tier, error)

    @contextlib.contextmanager
    def partition_lock(self, topic: str, partition: int, blocking: bool = True,
                       kind: str = "lock") -> Iterator[bool]:
        """Hold partition ``partition``'s append lock (``kind="lock"``), or its lock on
        remote-tier names (``kind=REMOTE_LOCK``): a thread lock and ``flock`` on its lock
        file. With ``blocking=False`` yields False instead of waiting."""
        path = os.path.join(self.pointer_dir(topic), f"{partition}.{kind}")
        with locks.held(path, blocking) as held:
            yield held

    def check(self, topics: list[str] | None = None, verify: bool = True,
              progress: Any = None) -> list[CheckReport]:
        """Check topics against their commit logs (see :mod:`tier_store.maintenance.check`)."""
        return [check_named(self, n, verify, progress) for n in (topics or self.topics())]

    def move_segment(self, segment_id: str, tier: int, merge_with: Sequence[str] = (),
                     topic: str | None = None,
                     throttle: Callable[[int], None] | None = None) -> MoveResult:
        """Move a sealed segment (``"<topic>/<partition>-<seq>"``, or its id with ``topic=``)
        to tier ``tier``, merging the adjacent sealed segments ``merge_with`` into it: copy,
        verify, commit a ``move`` entry; the old files go after the grace period."""
        if topic is None:
            if "/" not in segment_id:
                raise InvalidArgument(f"segment {segment_id!r}: name it as "
                                      "'<topic>/<partition>-<seq>' or pass topic=")
            topic, segment_id = segment_id.split("/", 1)
        ids = [segment_id, *[m.split("/", 1)[-1] for m in merge_with]]
        return move_segment(self.topic(topic), ids, tier, throttle)

    def resize_tier(self, number: int, size: int | str,
                    progress: Callable[[int], None] | None = None) -> int:
        """Change tier ``number``'s capacity to ``size`` (bytes, or text such as ``"2g"``) and
        save it in ``_store.json``; later opens use it, and one naming another size fails.

        A PMEM tier's pool follows: free pool files are deleted, or new ones pre-allocated
        (``progress`` is called with 1 per file). Shrinking below what the tier's segments
        need fails before anything changes (:class:`StoreFull`); a file tier shrunk below
        its use is drained by the migration service. Processes that have the store open keep
        the old size until they open it again. Returns the change in pool files (0 for tiers
        without a pool)."""
        key, new, changed = resize_tier(self.files, self.tier(number), size, progress)
        self.config = self.config.with_overrides({key: new})
        return changed

    def publishing(self, tiers: Iterable[tuple[int, int]] = ()
                   ) -> contextlib.AbstractContextManager[None]:
        """Hold the relocation fence while publishing a commit-log entry naming data
        written to ``tiers`` ((tier number, the tier's relocation count it was written
        under)): :class:`TierRelocated` if one was relocated since (see
        :mod:`tier_store.ownership.fence`)."""
        return self._fence.publishing(tiers)

    def relocation(self, number: int) -> int:
        """How often tier ``number`` was relocated when this handle opened the store."""
        return self._fence.relocation(number)

    def claim_remote(self, tier: Tier) -> None:
        """Make sure remote ``tier`` is this store's before writing or deleting files there
        (:class:`ConfigError` if another store's claim is on it). Read every time, one
        request: another host may have taken the tier over since."""
        if tier.is_remote:
            claim_tier(self.root, self.id, tier.number, claim_of(tier.number, tier.path))

    def collect_garbage(self, topic: Topic, bundles: bool = False,
                        tier: int | None = None) -> int:
        """Reclaim ``topic``'s unreferenced files, index pieces and ``bundles``."""
        if tier is not None:  # only its segment files there: a move's source, freed at once
            return garbage.collect_garbage(topic, tiers=[self.tier(tier)])
        n = garbage.collect_garbage(topic) + pieces.collect_pieces(topic)
        return n + (reclaim_bundles(topic) if bundles else 0)

    def compactable(self, topic: str) -> set[str]:
        """On a shared store, the ids of ``topic``'s segments on some host's tier 1 that a
        compaction may copy to the shared tier now (see ``compactable_ids``)."""
        t = self.topic(topic)
        return compactable_ids(t, t.state())

    def evict_local(self, now: float | None = None, every: float = 0.0) -> Evicted | None:
        """On a shared store, free this host's tier 1 (:mod:`tier_store.maintenance.eviction`)
        unless this process did less than ``every`` seconds ago (then None)."""
        return eviction.evict_local(self, now, every)

    def after_commit(self, topic: Topic) -> None:
        """Housekeeping after ``topic`` published a commit: checkpoint, garbage, retention
        (see :mod:`tier_store.maintenance.housekeeping`). Failures are logged, not raised."""
        housekeeping.after_commit(topic)

    def close(self) -> None:
        with self._lock:
            for t in self._topics.values():
                t.close()
            self._topics.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _update_totals(files: RootFiles, change: Callable[[dict[str, Any]], Mapping[str, Any]]
                   ) -> dict[str, Any]:
    def changed(raw: bytes | None) -> bytes:
        now = {} if raw is None else json_object(raw, files.where(MIGRATION_FILE),
                                                 _FRESH_TOTALS)
        return json.dumps(dict(change(now)), indent=1).encode()
    return json.loads(update(files, MIGRATION_FILE, changed))


def _open_topic(root: str, name: str) -> Topic:
    return Store.open(root, create=False).topic(name)


# Reads re-plan through the store, which the reader does not import.
reading.use_topic_opener(_open_topic)
