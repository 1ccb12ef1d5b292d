"""The store: a root directory holding topics, their commit logs, and the configured tiers.

``Store.open(root, config)`` saves the layout (tiers, paths, segment size) in
``<root>/_store.json`` on first open; every later open — executors, the CLI, notebooks —
reads it, and a given layout key that differs is a :class:`ConfigError` naming both values.

A store can be moved or copied as a directory: tier paths inside the root are saved relative
to it. A tier outside the root is claimed by a ``_pafka_store`` file in its directory (see
:mod:`tier_store.claims`), so that a copy of the root, or a second store given the same tier
directory, fails to open instead of writing segments over the owner's; a tier directory that
moved is recorded with :func:`tier_store.relocate_tier`.

Thread-safety: a store may be shared by threads; topic handles are cached per store.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from .claims import (
    LocalClaim,
    check_apart,
    claim_data,
    claim_local_tiers,
    claim_of,
    claim_tier,
    outside_root,
)
from .commit_log import CommitLog
from .config import (
    LAYOUT_KEYS,
    StoreConfig,
    TierSpec,
    canonical_key,
    load_config,
    parse_config,
    render_value,
    tier_key,
)
from .entries import CreateEntry, schema_to_text
from .errors import (
    ConfigError,
    CorruptState,
    PafkaError,
    StoreFull,
    StoreNotFound,
    TierRelocated,
    TopicDeleted,
    TopicExists,
    TopicNotFound,
)
from .garbage import collect_garbage
from .layout import (
    MIGRATION_FILE,
    STORE_FILE,
    STORE_LOCK,
    TIER_OWNER,
    TIERS_LOCK,
    check_topic_name,
    file_lock,
    fsync_dir,
    is_topic,
    is_url,
    log_dir,
    makedirs_durable,
    partitions_dir,
    topic_names,
    write_atomic,
    write_temp,
)
from .moves import MoveResult, move_segment
from .recovery import CheckReport, check_topic
from .saved import (
    FORMAT,
    inside,
    jsonable,
    portable,
    read_saved,
    relocations,
    resolve_path,
    tier_overlap,
)
from .state import TopicState
from .tiers import NO_SPACE, SegmentWriter, Tier, make_tier
from .topic import Topic

log = logging.getLogger(__name__)

_locks_guard = threading.Lock()
_thread_locks: dict[str, threading.Lock] = {}
_lock_fds: dict[str, int] = {}


def _forget_locks_after_fork() -> None:
    # A forked child shares the parent's open file descriptions, and with them any flock the
    # parent holds: it must open its own.
    _thread_locks.clear()
    _lock_fds.clear()


os.register_at_fork(after_in_child=_forget_locks_after_fork)


class Store:
    """A tier store rooted at a directory. Use :meth:`open`."""

    def __init__(self, root: str, config: StoreConfig, tiers: list[Tier],
                 store_id: str | None = None):
        self.root = root
        self.config = config
        self.tiers = tiers
        self.id = store_id  # None for stores saved before stores had ids
        self._topics: dict[str, Topic] = {}
        self._lock = threading.RLock()
        # Each tier's relocation count when this handle was opened (set by open()).
        self._relocations = [0] * len(tiers)
        self._given: dict[str, Any] = {}  # the settings open() was given (for reopen)
        # (inode, mtime, ctime, size) of _store.json when _saved was read from it.
        self._saved_stamp: tuple[int, int, int, int] | None = None
        self._saved: list[tuple[int, str]] | None = None
        # Tiers whose filesystem answered ENOSPC, skipped by placement until space returns.
        self._no_space: set[int] = set()

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | os.PathLike[str],
             config: Mapping[str, Any] | str | os.PathLike[str] | None = None,
             create: bool = True) -> Store:
        """Open the store at ``root``, creating it unless ``create=False``.

        ``config`` is a dict of keys or the path of a ``.properties`` file; see
        :mod:`tier_store.config`. Readers, tools and notebooks pass ``create=False``: a
        mistyped root is then :class:`StoreNotFound` instead of a new empty store.
        """
        root = os.path.abspath(os.fspath(root))
        # Relative tier paths given now are relative to the working directory, as in any
        # command; the saved ones are relative to the root.
        given = {k: resolve_path(os.getcwd(), k, v) for k, v in load_config(config).items()}
        if not create and not cls.exists(root):
            why = "" if os.path.isdir(root) else (
                ": the directory does not exist" if not os.path.lexists(root) else
                ": it is not a directory")
            raise StoreNotFound(f"no pafka store at {root} (no {STORE_FILE}{why}); check the "
                                "path, or create the store by writing to it")
        makedirs_durable(root)
        lock = os.path.join(root, STORE_LOCK)
        # Shared against a resize, which saves a new size and changes the pool under the
        # exclusive lock: an open never completes a pool to a size read before that.
        with file_lock(lock, shared=True):
            saved = read_saved(root)
            if saved is not None and saved.get("id") is not None:
                return cls(root, *_open_saved(root, saved, given))._opened(saved, given)
        # Made (or, made by a release without ids, given one) under the exclusive lock: two
        # processes creating one store must not claim its tiers against each other.
        with file_lock(lock):
            saved = read_saved(root)
            if saved is None:
                _create(root, StoreConfig(given))
            elif saved.get("id") is None:
                _give_id(root, saved)
        with file_lock(lock, shared=True):
            saved = read_saved(root)
            if saved is None:
                raise ConfigError(f"{root}/{STORE_FILE} vanished while the store was opened")
            return cls(root, *_open_saved(root, saved, given))._opened(saved, given)

    @staticmethod
    def exists(root: str | os.PathLike[str]) -> bool:
        """Whether a store was created at ``root``."""
        return os.path.isfile(os.path.join(os.path.abspath(os.fspath(root)), STORE_FILE))

    @staticmethod
    def identity(root: str | os.PathLike[str]) -> tuple[int, int] | None:
        """What tells this store apart from one deleted and created again at ``root``
        (None if there is none): a cached handle is reused only while it is the same."""
        try:
            st = os.stat(os.path.join(os.path.abspath(os.fspath(root)), STORE_FILE))
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def migration_totals(self) -> dict[str, Any]:
        """The migration service's counters since the store was made ({} before its first
        run)."""
        try:
            with open(os.path.join(self.root, MIGRATION_FILE), "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except ValueError as e:
            raise CorruptState(f"{os.path.join(self.root, MIGRATION_FILE)} is not JSON ({e}); "
                               "delete it to start the counters afresh") from None
        if not isinstance(data, dict):
            raise CorruptState(f"{os.path.join(self.root, MIGRATION_FILE)} holds "
                               f"{type(data).__name__}, not an object; delete it to start the "
                               "counters afresh")
        return data

    def save_migration_totals(self, totals: Mapping[str, Any]) -> None:
        """Replace the migration service's counters (one writer: the service)."""
        write_atomic(os.path.join(self.root, MIGRATION_FILE),
                     json.dumps(dict(totals), indent=1).encode())

    def _opened(self, saved: dict[str, Any], given: dict[str, Any]) -> Store:
        self._relocations = relocations(saved)
        self._given = given
        return self

    def relocated(self) -> bool:
        """Whether a tier was relocated since this handle opened the store: its commits and
        moves of data written to that tier are then refused; :meth:`reopen` gives a handle
        on the tiers' new places."""
        return [n for n, _ in self._saved_relocations()] != self._relocations

    def reopen(self) -> Store:
        """A new handle on this store, opened with the settings this one was given."""
        return Store.open(self.root, dict(self._given))

    def __repr__(self) -> str:
        return f"Store({self.root!r}, tiers={self.tiers})"

    def tier(self, number: int) -> Tier:
        """Tier ``number`` (1 = fastest)."""
        if not 1 <= number <= len(self.tiers):
            raise PafkaError(f"store {self.root} has no tier {number}: it has tiers "
                             f"1..{len(self.tiers)}")
        return self.tiers[number - 1]

    # -- topics -----------------------------------------------------------------------------
    def create_topic(self, name: str, schema: pa.Schema, partitions: int | None = None,
                     config: Mapping[str, Any] | None = None) -> Topic:
        """Create a topic with an Arrow schema; :class:`TopicExists` if it is there."""
        check_topic_name(name)
        if not isinstance(schema, pa.Schema):
            raise PafkaError(f"schema of topic {name!r} must be a pyarrow.Schema, "
                             f"got {type(schema).__name__}")
        if len(schema) == 0:
            raise PafkaError(f"schema of topic {name!r} has no columns")
        if partitions is None:
            partitions = self.config["num.partitions"]
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise PafkaError(f"partitions of topic {name!r} must be a positive integer, "
                             f"got {partitions!r}")
        topic_conf = parse_config(config)
        fixed = [k for k in topic_conf if k in LAYOUT_KEYS]
        if fixed:
            raise ConfigError(f"{', '.join(fixed)} cannot be set per topic: it is part of the "
                              "store's layout")
        ldir = log_dir(self.root, name)
        # <topic>/ in the root and _log/, _partitions/ in <topic>/: all durable before the
        # create entry can be.
        makedirs_durable(ldir)
        makedirs_durable(partitions_dir(self.root, name))
        entry = CreateEntry(int(time.time() * 1000), schema_to_text(schema), partitions,
                            {k: jsonable(v) for k, v in topic_conf.items()},
                            uuid.uuid4().hex)
        if not CommitLog(ldir, name).publish(0, entry):
            raise TopicExists(f"topic {name!r} already exists in {self.root}")
        log.info("created topic %s with %d partitions", name, partitions)
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
                    try:
                        t.close()
                    except OSError as e:
                        log.warning("topic %s: closing a deleted topic's writers failed: %s",
                                    name, e)
            if not is_topic(self.root, name):
                known = self.topics()
                raise TopicNotFound(f"topic {name!r} does not exist in {self.root}; topics: "
                                    f"{', '.join(known) if known else '(none)'}")
            clog = CommitLog(log_dir(self.root, name), name)
            t = Topic(self, name, clog.load(), clog)
            self._topics[name] = t
            return t

    def delete_topic(self, name: str) -> int:
        """Delete topic ``name``: its files on every tier are reclaimed (once no reader pins
        them), and a topic created under its name later is a new incarnation with another
        id. Returns how many of its files readers still pin (reclaimed by the migration
        service's next run). See :mod:`tier_store.deletion`."""
        from .deletion import delete_topic
        return delete_topic(self, name)

    def reclaim_deleted(self) -> int:
        """Reclaim what deleted topics left that no reader pins any more; returns how many
        files are still pinned."""
        from .deletion import reclaim_deleted
        return reclaim_deleted(self)

    def forget_topic(self, name: str) -> None:
        """Close this handle's cached handle on topic ``name`` and its cached lock files (the
        topic is being deleted)."""
        with self._lock:
            t = self._topics.pop(name, None)
        if t is not None:
            try:
                t.close()
            except OSError as e:
                log.warning("topic %s: closing its writers failed: %s", name, e)
        prefix = partitions_dir(self.root, name) + os.sep
        with _locks_guard:
            paths = [p for p in _lock_fds if p.startswith(prefix)]
        for path in paths:
            # Under the path's thread lock: a thread of this process may hold the flock.
            with _locks_guard:
                tl = _thread_locks.setdefault(path, threading.Lock())
            with tl:
                fd = _lock_fds.pop(path, None)
                if fd is not None:
                    os.close(fd)

    def topics(self) -> list[str]:
        """Names of the topics in the store, sorted."""
        return topic_names(self.root)

    def has_topic(self, name: str) -> bool:
        return name in self.topics()

    # -- tiers --------------------------------------------------------------------------------
    def _states(self) -> list[TopicState]:
        return [self.topic(name).state() for name in self.topics()]

    def used_bytes(self) -> dict[int, int]:
        """Committed bytes per tier, accounted from every topic's state."""
        used = {t.number: 0 for t in self.tiers}
        for st in self._states():
            for s in st.segments.values():
                used[s.tier] = used.get(s.tier, 0) + s.extent
        return used

    def tier_usage(self) -> list[dict[str, Any]]:
        """Per tier: number, type, path, capacity, used bytes, segments (and free pool files)."""
        used = {t.number: 0 for t in self.tiers}
        segs = {t.number: 0 for t in self.tiers}
        for st in self._states():
            for s in st.segments.values():
                used[s.tier] += s.extent
                segs[s.tier] += 1
        out = []
        for t in self.tiers:
            row: dict[str, Any] = {"tier": t.number, "type": t.type, "path": t.path,
                                   "capacity": t.capacity, "used": used[t.number],
                                   "segments": segs[t.number]}
            if t.has_pool:
                row["pool_files"] = t.pool_size
                row["pool_free"] = t.free_pool_files()
            out.append(row)
        return out

    def place_segment(self, topic: str, partition: int, seq: int, need: int,
                      durable: bool = True) -> tuple[Tier, SegmentWriter]:
        """Create segment ``seq`` by the placement rule: on the first local tier with room
        (a free pool file, or bytes under its capacity) whose filesystem is not out of
        space. A remote tier never takes appends. See :meth:`Tier.create_segment` for
        ``durable``; :class:`StoreFull` naming every tier when none has room."""
        used = self.used_bytes()
        for t in self.tiers:
            if not t.local or self._out_of_space(t, need):
                continue
            if not t.has_room(used.get(t.number, 0), need):
                continue
            try:
                w = t.create_segment(topic, partition, seq, need, durable)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                self.mark_out_of_space(t, e)
                continue
            if w is not None:
                return t, w
        usage = "; ".join(self._tier_line(t, used.get(t.number, 0)) for t in self.tiers)
        raise StoreFull(
            f"no local tier has room for a new segment of topic {topic!r} partition "
            f"{partition} ({need} bytes): {usage}. Run the migration service (pafka migrate "
            f"{self.root} --follow, or pafka_source.start_migration) or speed it up "
            "(storage.migrate.threads, storage.migrate.bytes.per.second), lower "
            "log.retention.bytes/ms, or resize a tier (pafka resize)")

    def _tier_line(self, t: Tier, used: int) -> str:
        free_fs = t.free_bytes()
        line = (f"tier {t.number} ({t.type}, {t.path}): {used} of "
                f"{t.capacity or 'unbounded'} bytes used")
        pool = t.free_pool_files()
        if pool is not None:
            line += f", {pool} free pool files"
        if not t.local:
            line += ", remote (takes sealed segments from the migration service only)"
        elif t.number in self._no_space:
            line += f", its filesystem is full ({free_fs} bytes free)"
        return line

    def mark_out_of_space(self, tier: Tier, error: OSError) -> None:
        """Record that ``tier``'s filesystem answered ENOSPC: new segments skip it until
        its filesystem has room for a segment again."""
        if tier.number not in self._no_space:
            log.warning("tier %d (%s) is out of space (%s): new segments go to the next "
                        "local tier with room until space returns", tier.number, tier.path,
                        error)
        self._no_space.add(tier.number)

    def _out_of_space(self, tier: Tier, need: int) -> bool:
        if tier.number not in self._no_space:
            return False
        free = tier.free_bytes()
        if free is not None and free >= 2 * max(need, tier.segment_bytes):
            self._no_space.discard(tier.number)
            log.info("tier %d (%s) has room again (%d bytes free)", tier.number, tier.path,
                     free)
            return False
        return True

    @contextlib.contextmanager
    def partition_lock(self, topic: str, partition: int, blocking: bool = True,
                       kind: str = "lock") -> Iterator[bool]:
        """Hold partition ``partition``'s append lock (``kind="lock"``), or its lock on
        remote-tier names (``kind=REMOTE_LOCK``): a thread lock and ``flock`` on its lock
        file. With ``blocking=False`` yields False instead of waiting."""
        path = os.path.join(partitions_dir(self.root, topic), f"{partition}.{kind}")
        with _locks_guard:
            tl = _thread_locks.setdefault(path, threading.Lock())
        if not tl.acquire(blocking):
            yield False
            return
        try:
            fd = _lock_file(path, blocking)
            if fd < 0:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            tl.release()

    def check(self, topics: list[str] | None = None, verify: bool = True,
              progress: Any = None) -> list[CheckReport]:
        """Check topics against their commit logs (see :mod:`tier_store.recovery`)."""
        return [check_topic(self.topic(n), verify, progress) for n in (topics or self.topics())]

    def move_segment(self, segment_id: str, tier: int, merge_with: Sequence[str] = (),
                     topic: str | None = None,
                     throttle: Callable[[int], None] | None = None) -> MoveResult:
        """Move a sealed segment (``"<topic>/<partition>-<seq>"``, or its id with ``topic=``)
        to tier ``tier``, merging the adjacent sealed segments ``merge_with`` into it: copy,
        verify, commit a ``move`` entry; the old files go after the grace period."""
        if topic is None:
            if "/" not in segment_id:
                raise PafkaError(f"segment {segment_id!r}: name it as '<topic>/<partition>-<seq>'"
                                 " or pass topic=")
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
        tier = self.tier(number)
        key = canonical_key(f"storage.tiers.{number}.sizes")
        new = parse_config({key: size})[key]
        if tier.type == "REMOTE" and new:
            raise ConfigError(f"{key}={size}: tier {number} is REMOTE, which has no capacity "
                              "(0, unbounded)")
        with file_lock(os.path.join(self.root, STORE_LOCK)):
            saved = read_saved(self.root)
            if saved is None:
                raise ConfigError(f"{self.root}/{STORE_FILE} is gone")
            saved["config"][key] = new

            def save() -> None:
                write_atomic(os.path.join(self.root, STORE_FILE),
                             json.dumps(portable(self.root, saved), indent=1).encode())

            changed = tier.resize(new, save, progress)
            self.config = self.config.with_overrides({key: new})
        log.info("store %s: tier %d resized to %d bytes", self.root, number, new)
        return changed

    @contextlib.contextmanager
    def publishing(self, tiers: Iterable[tuple[int, int | None]] = ()) -> Iterator[None]:
        """Publish a commit-log entry: hold ``_tiers.lock`` shared, and refuse
        (:class:`ConfigError`) when data the entry names was written to a tier that the store
        has relocated since. ``tiers``: (tier number, the tier's relocation count the data
        was written under, None if unknown), one pair per tier the entry's data is on.

        A relocation counts and saves a tier's new path under the exclusive lock, so an entry
        is published either before it starts (and its check sees the entry) or after it ends
        (and this check refuses it): data written to a tier's old place never becomes
        visible in the store that now looks elsewhere, whichever process commits it."""
        with file_lock(os.path.join(self.root, TIERS_LOCK), shared=True):
            for number, written in tiers:
                now, path = self._saved_relocations()[number - 1]
                if written != now and (written is not None or now):
                    raise TierRelocated(
                        f"tier {number} of the store at {self.root} was relocated (to {path}) "
                        "after data was written to it" + (
                            "" if written is not None else " by a release that does not "
                            "record relocations") + ": open the store again and write again "
                        "(that data stays invisible)")
            yield

    def relocation(self, number: int) -> int:
        """How many times tier ``number`` had been relocated when this handle opened the
        store: what its writes record."""
        return self._relocations[number - 1]

    def _saved_relocations(self) -> list[tuple[int, str]]:
        """(relocation count, path) per tier as ``_store.json`` has them now, read again only
        when the file changed."""
        path = os.path.join(self.root, STORE_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        stamp = None if st is None else (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if stamp is None or stamp != self._saved_stamp or self._saved is None:
            saved = read_saved(self.root) if stamp is not None else None
            if saved is None:
                raise ConfigError(f"{path} is gone: the store at {self.root} was deleted while "
                                  "this process had it open")
            self._saved = list(zip(relocations(saved), saved["layout"]["tier.paths"],
                                   strict=True))
            self._saved_stamp = stamp
        return self._saved

    def claim_remote(self, tier: Tier) -> None:
        """Make sure remote ``tier`` is this store's before writing or deleting files there
        (:class:`ConfigError` if another store's claim is on it). Read every time, one
        request: another host may have taken the tier over since."""
        if not tier.local:
            claim_tier(self.root, self.id, tier.number, claim_of(tier.number, tier.path))

    def collect_garbage(self, topic: Topic) -> int:
        """Reclaim unreferenced segment files of ``topic`` past the grace period."""
        return collect_garbage(self, topic)

    def close(self) -> None:
        with self._lock:
            for t in self._topics.values():
                t.close()
            self._topics.clear()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _lock_file(path: str, blocking: bool) -> int:
    """Take the ``flock`` of lock file ``path`` (opened once per process and kept): its
    descriptor, or -1 when it is busy (non-blocking). A descriptor that no longer is the
    file at ``path`` (its topic was deleted, and perhaps created again) is replaced, so
    this process never locks a file other processes no longer use. Caller holds the
    path's thread lock."""
    while True:
        fd = _lock_fds.get(path)
        if fd is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            _lock_fds[path] = fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return -1
        held = os.fstat(fd)
        try:
            named = os.stat(path)
        except FileNotFoundError:
            named = None
        if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd
        del _lock_fds[path]
        os.close(fd)  # drops the lock on the old file


def _open_saved(root: str, saved: dict[str, Any], given: Mapping[str, Any]
                ) -> tuple[StoreConfig, list[Tier], str | None]:
    """Check ``given`` against the store's saved configuration and its tiers, claim and
    prepare them: (configuration in effect, tiers, store id). Under the shared lock."""
    store_id = saved.get("id")
    base = StoreConfig(parse_config(saved["config"]))
    _check_layout(root, base, given, saved["layout"])
    effective = base.with_overrides(given)
    specs = effective.tiers(root)
    _check_tier_dirs(root, store_id, specs)
    claim_local_tiers(root, store_id, specs)
    tiers = [make_tier(spec, effective) for spec in specs]
    for t in tiers:
        t.prepare()
        # On every open, not only the first: a crash while pre-allocating (or a tier on RAM
        # that lost its files) must not leave a pool short for good. Cheap once complete.
        t.ensure_pool()
    return effective, tiers, store_id


def _create(root: str, config: StoreConfig) -> None:
    """Create the store at ``root``: make and claim its tiers, then save ``_store.json``."""
    specs = config.tiers(root)
    _check_distinct_tiers(root, specs)
    store_id = uuid.uuid4().hex
    check_apart(root, store_id, specs)
    # Made and claimed before _store.json exists: from then on, a missing or unclaimed one
    # has moved or is lost, and a store refused a tier is not left behind.
    for spec in specs:
        if not is_url(spec.path):
            makedirs_durable(spec.path)
    claim_local_tiers(root, store_id, specs, creating=True)
    if not _save(root, config, config.layout(root), store_id):
        raise ConfigError(f"{root}/{STORE_FILE} appeared while the store was being created "
                          "under its lock: was it written by hand?")


def _give_id(root: str, saved: dict[str, Any]) -> None:
    """Give a store made by a release without ids one; saved portable (tier paths in the
    root relative), so it can move from now on. Its claims follow on this open (a claim
    without an id is this store's by its root); a tier outside the root that a release
    without claims left unclaimed is claimed now, if it is there."""
    specs = StoreConfig(parse_config(saved["config"])).tiers(root)
    _check_tier_dirs(root, None, specs)
    for spec in outside_root(root, specs):
        claim = LocalClaim(spec.number, spec.path)
        if claim.read() is None:
            claim.create(claim_data(root, None))
    saved["id"] = uuid.uuid4().hex
    write_atomic(os.path.join(root, STORE_FILE),
                 json.dumps(portable(root, saved), indent=1).encode())
    log.info("store %s: given the id %s", root, saved["id"])


def _check_distinct_tiers(root: str, specs: list[TierSpec]) -> None:
    """A new store's tiers are each a place of their own, apart from the root's own files."""
    real_root = os.path.realpath(root)
    for i, spec in enumerate(specs):
        if not is_url(spec.path) and inside(os.path.realpath(spec.path), real_root):
            raise ConfigError(f"storage.tiers.{spec.number}.paths={spec.path} is the store's "
                              f"root {root} or holds it; a tier needs a directory of its own")
        for other in specs[:i]:
            if tier_overlap(spec.path, other.path):
                raise ConfigError(
                    f"storage.tiers.{other.number}.paths={other.path} and storage.tiers."
                    f"{spec.number}.paths={spec.path} overlap; each tier needs a place of its "
                    "own")


def _check_tier_dirs(root: str, store_id: str | None, specs: list[TierSpec]) -> None:
    """An existing store's local tier directories are the ones it was made with: made (and
    claimed, outside the root) before its _store.json was saved, a missing or unclaimed
    one was moved, lost or is an unmounted mount point. Writing there would put new
    segments where none of the old ones are, and split the tier. A missing one in the root
    that no segment is on (a release that saved _store.json first) is made."""
    real_root = os.path.realpath(root)
    for spec in specs:
        if is_url(spec.path):
            continue
        outside = not inside(real_root, os.path.realpath(spec.path))
        hint = f"`pafka relocate {root} {spec.number} DIR`"
        if os.path.isdir(spec.path):
            if not outside or store_id is None or \
                    os.path.lexists(os.path.join(spec.path, TIER_OWNER)):
                continue
            what = (f"has no {TIER_OWNER}: it is not the directory the tier was made in (an "
                    "unmounted mount point, or a directory made anew). If it is, record it "
                    f"with {hint} naming it")
        elif not outside and not _has_segments(root, spec.number):
            makedirs_durable(spec.path)
            continue
        else:
            what = "is missing"
        lost = (f"create the directory with an empty {TIER_OWNER} file in it" if outside else
                "create the empty directory")
        raise ConfigError(
            f"tier {spec.number} directory {spec.path} of the store at {root} {what}. If the "
            f"tier moved, record where with {hint}; if its data is lost (e.g. a RAM tier "
            f"after a reboot), {lost} to open the store without it (reads of its segments "
            "then fail as data loss)")


def _has_segments(root: str, number: int) -> bool:
    """Whether a committed segment of any topic is on tier ``number``."""
    return any(s.tier == number for name in topic_names(root)
               for s in CommitLog(log_dir(root, name), name).load().segments.values())


def _save(root: str, config: StoreConfig, layout: dict[str, Any], store_id: str) -> bool:
    """Write ``_store.json`` exclusively; False if another process saved one first."""
    body = portable(root, {"format": FORMAT, "id": store_id, "config": config.explicit(),
                            "layout": layout})
    path = os.path.join(root, STORE_FILE)
    tmp = write_temp(root, json.dumps(body, indent=1).encode())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    fsync_dir(root)
    return True


def _check_layout(root: str, saved: StoreConfig, given: Mapping[str, Any],
                  saved_layout: dict[str, Any]) -> None:
    for key, value in given.items():
        if key in LAYOUT_KEYS and value != saved[key] and tier_key(key) is None:
            raise ConfigError(
                f"{key}={render_value(value)} conflicts with the store at {root}, created with "
                f"{key}={render_value(saved[key])}; layout keys cannot change")
    now_conf = saved.with_overrides(given)
    now = now_conf.layout(root)
    for n, (a, b) in enumerate(zip(now["tier.paths"], saved_layout["tier.paths"], strict=False),
                               1):
        if a != b:
            raise ConfigError(f"storage.tiers.{n}.paths={a} conflicts with the store at {root}, "
                              f"created with {b}; if tier {n}'s directory has moved there, "
                              f"record it with `pafka relocate {root} {n} {a}` "
                              "(tier_store.relocate_tier)")
    for a, b in zip(now_conf.tiers(root), saved.tiers(root), strict=False):
        if a.size != b.size:
            raise ConfigError(
                f"storage.tiers.{a.number}.sizes={a.size} conflicts with the store at {root}, "
                f"whose tier {a.number} has a capacity of {b.size} bytes; a tier's size "
                f"changes with `pafka resize {root} {a.number} SIZE` (Store.resize_tier), for "
                "every process at once")
