"""Names and paths of everything the store keeps on disk.

Under the store root::

    _store.json                         saved configuration (tiers, segment size)
    _store.lock                         flock: shared by opens, exclusive while the store is
                                        created or a tier is resized or relocated
    _tiers.lock                         flock: shared while a commit-log entry is published,
                                        exclusive while a tier is relocated
    <topic>/_log/<20-digit>.json        commit-log entries, one per version
    <topic>/_log/<20-digit>.checkpoint  topic state at that version (Arrow IPC file)
    <topic>/_log/_last_checkpoint       version of the newest checkpoint
    <topic>/_log/_last_checkpoint.lock  flock held while moving that pointer forward
    <topic>/_partitions/<p>.lock        flock held while appending a chunk to partition p
    <topic>/_partitions/<p>.remote.lock flock held while a move writes partition p's segment
                                        to a remote tier, or garbage collection deletes one
    <topic>/_partitions/<p>.active      JSON naming partition p's active segment
    _deleted/<topic>.<id>/              a deleted topic's directory, removed right after

Under an object-store root (``s3://bucket/prefix``), shared by every host::

    _store/<20-digit>.json              versions of _store.json; the highest is current
    _migration/<20-digit>.json          versions of _migration.json
    <topic>/_topic.json                 {"incarnation": "<32 hex>"}, created if absent; the
                                        topic exists iff it and its log's entry 0 exist
    <topic>/<incarnation>/_log/...      the commit log, named as in a local root

and in each host's own directory (``storage.host.dir``, default ``<tier 1>/_host``)::

    _store.lock, _tiers.lock            as in a local root, for this host's processes
    <topic>.<incarnation>/_partitions/  partition pointers and locks, as in a local root

Under each tier directory::

    <topic>/<p>/<20-digit seq>.seg      a segment of partition p
    _pool/<6-digit slot>.pool           a free, pre-sized segment file (pmem tiers)
    _pool/_complete                     pool size and file size of a complete pool
    _pool/_lock                         flock held while completing the pool
    _pafka_store                        the store that owns a tier outside its root
    _deleted/<topic>.<id>/<p>/...       a deleted topic's segments, reclaimed once unpinned

Numbers are zero-padded to 20 digits so that ``ls`` sorts them numerically.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from collections.abc import Iterator

from .errors import InvalidArgument, PafkaError
from .ids import SegmentId

STORE_FILE = "_store.json"
MIGRATION_FILE = "_migration.json"
STORE_LOCK = "_store.lock"
TIERS_LOCK = "_tiers.lock"
REMOTE_LOCK = "remote.lock"
TIER_OWNER = "_pafka_store"
LOG_DIR = "_log"
PARTITIONS_DIR = "_partitions"
POOL_DIR = "_pool"
DELETED_DIR = "_deleted"
HOST_DIR = "_host"
TOPIC_FILE = "_topic.json"
#: The only URL scheme a store root may have: its conditional puts are atomic.
ROOT_SCHEMES = ("s3",)
ENTRY_SUFFIX = ".json"
CHECKPOINT_SUFFIX = ".checkpoint"
LAST_CHECKPOINT = "_last_checkpoint"
CHECKPOINT_LOCK = "_last_checkpoint.lock"
POOL_COMPLETE = "_complete"
POOL_LOCK = "_lock"
SEGMENT_SUFFIX = ".seg"
POOL_SUFFIX = ".pool"
TMP_PREFIX = ".tmp-"

_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def check_topic_name(name: object) -> str:
    """Validate a topic name by Kafka's rule; raise naming the rule otherwise."""
    if not isinstance(name, str) or not _TOPIC_RE.match(name) or name in (".", ".."):
        raise InvalidArgument(
            f"invalid topic name {name!r}: use 1 to 249 characters from [a-zA-Z0-9._-], "
            "not '.' or '..'"
        )
    if name.startswith("_"):
        raise InvalidArgument(f"invalid topic name {name!r}: names starting with '_' are "
                              "reserved")
    return name


def entry_name(version: int) -> str:
    return f"{version:020d}{ENTRY_SUFFIX}"


def checkpoint_name(version: int) -> str:
    return f"{version:020d}{CHECKPOINT_SUFFIX}"


def parse_log_name(name: str) -> tuple[int, str] | None:
    """``00000000000000000042.json`` -> (42, '.json'); None for other files."""
    for suffix in (ENTRY_SUFFIX, CHECKPOINT_SUFFIX):
        if name.endswith(suffix):
            stem = name[: -len(suffix)]
            if len(stem) == 20 and stem.isdigit():
                return int(stem), suffix
    return None


def is_url(path: str) -> bool:
    """Whether a tier path or store root is a filesystem URL (``s3://...``, ``file://...``)
    rather than a local directory."""
    return "://" in path


def segment_id(partition: int, seq: int) -> str:
    """A segment's id within its topic, as text (see :class:`~tier_store.ids.SegmentId`)."""
    return str(SegmentId(partition, seq))


def parse_segment_id(sid: str) -> tuple[int, int]:
    """(partition, seq) of a segment id's text; :class:`InvalidArgument` if malformed."""
    parsed = SegmentId.parse(sid)
    return parsed.partition, parsed.seq


def segment_relpath(topic: str, partition: int, seq: int) -> str:
    """Path of a segment relative to its tier directory."""
    return os.path.join(topic, str(partition), f"{seq:020d}{SEGMENT_SUFFIX}")


def topic_dir(root: str, topic: str) -> str:
    return os.path.join(root, topic)


def log_dir(root: str, topic: str) -> str:
    return os.path.join(root, topic, LOG_DIR)


def is_topic(root: str, name: str) -> bool:
    """Whether ``root/name`` is a topic: its commit log has entry 0 or a checkpoint."""
    d = log_dir(root, name)
    return os.path.exists(os.path.join(d, entry_name(0))) or \
        os.path.exists(os.path.join(d, LAST_CHECKPOINT))


def topic_names(root: str) -> list[str]:
    """The topics of the store at ``root``, sorted."""
    return [n for n in sorted(os.listdir(root)) if is_topic(root, n)]


def partitions_dir(root: str, topic: str) -> str:
    return os.path.join(root, topic, PARTITIONS_DIR)


def bury(path: str, graves: str, name: str) -> str:
    """Rename ``path`` to ``graves/name`` (a fresh name if that one is taken), durably;
    returns where it went."""
    makedirs_durable(graves)
    target = os.path.join(graves, name)
    while os.path.lexists(target):
        target = os.path.join(graves, f"{name}.{os.urandom(4).hex()}")
    os.rename(path, target)
    fsync_dir(os.path.dirname(path))
    fsync_dir(graves)
    return target


def fsync_dir(path: str) -> None:
    """Make a directory's entries (created, linked, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_unlinked(fd: int) -> bool:
    """Whether the file open as ``fd`` (-1: none) was removed from every directory."""
    try:
        return fd >= 0 and os.fstat(fd).st_nlink == 0
    except OSError:
        return True


@contextlib.contextmanager
def file_lock(path: str, shared: bool = False) -> Iterator[None]:
    """Hold an exclusive (or ``shared``) ``flock`` on ``path`` (created if missing). Each call
    opens its own file description, so it orders threads as well as processes; the kernel
    drops it if the process dies, so a crash leaves no lock behind."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            # Unlocked before the close: a child forked meanwhile shares the descriptor, and
            # the lock would live on until it exits.
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def makedirs_durable(path: str, durable: bool = True) -> list[str]:
    """Create ``path`` and its missing parents so that they survive a crash of the machine:
    the parent of each new directory is fsynced (a directory's own fsync does not cover its
    entry in its parent). Returns those parents; with ``durable=False`` their fsyncs are left
    to the caller (e.g. :meth:`SegmentWriter.defer_entry`). When ``path`` exists: no fsync,
    returns ``[]``."""
    if os.path.isdir(path):
        return []
    missing: list[str] = []
    d = os.path.abspath(path)
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    parents: dict[str, None] = {}
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
            # Made by another process a moment ago, which may not have fsynced its parent
            # yet: do it too rather than rely on it.
        parents[os.path.dirname(d)] = None
    if durable:
        for d in parents:
            fsync_dir(d)
    return list(parents)


def write_temp(directory: str, data: bytes | memoryview, durable: bool = True) -> str:
    """Write ``data`` to a new temporary file in ``directory`` (fsynced if ``durable``);
    return its path. A failed write (a full filesystem) leaves no temporary file behind."""
    tmp = os.path.join(directory, f"{TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def create_exclusive(path: str, data: bytes) -> bool:
    """Create file ``path`` holding ``data`` iff it does not exist, atomically (a temporary
    file linked to the name) and durably; False if it existed."""
    directory = os.path.dirname(path)
    tmp = write_temp(directory, data)
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    fsync_dir(directory)
    return True


def write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync of the directory.
    Without ``durable`` the fsyncs are left to the caller (:func:`fsync_file`, then
    :func:`fsync_dir`); until then a crash of the machine may leave the old contents, the
    new ones, or an empty file."""
    d = os.path.dirname(path)
    os.replace(write_temp(d, data, durable), path)
    if durable:
        fsync_dir(d)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, for messages: "a directory", "a FIFO", ..."""
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "a regular file" if stat.S_ISREG(mode) else f"a file of type {stat.S_IFMT(mode):o}"


def open_regular(path: str, error: type[PafkaError], what: str = "",
                 follow: bool = True) -> int:
    """Open ``path`` read-only, as ``os.open`` would, if it is a regular file; return the
    descriptor (the caller closes it). Anything else (a directory, a FIFO, a device, a
    socket) is ``error`` naming ``what``, ``path`` and what it is, raised without reading
    it: a FIFO's read would wait for a writer forever, a device's may never end.
    ``follow=False`` opens with ``O_NOFOLLOW``: a symbolic link is OSError ELOOP, as from
    ``os.open``. A missing file is FileNotFoundError."""
    st = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISLNK(st.st_mode):
        raise not_regular(error, what, path, st.st_mode)
    # O_NONBLOCK: what the name leads to may have changed since the stat, and the open of a
    # FIFO must not wait for a writer; it changes nothing for a regular file.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(path, flags if follow else flags | os.O_NOFOLLOW)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(error, what, path, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, error: type[PafkaError], what: str = "",
                 follow: bool = True) -> bytes | None:
    """The whole content of the regular file ``path``; None if it is missing. Anything but a
    regular file is ``error`` (see :func:`open_regular`)."""
    try:
        fd = open_regular(path, error, what, follow)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def not_regular(error: type[PafkaError], what: str, path: str, mode: int) -> PafkaError:
    """``error`` saying that ``path`` (a ``what``) is not a regular file but ``mode``'s kind."""
    return error(f"{what + ' ' if what else ''}{path} is {file_kind(mode)}, not a regular "
                 "file: the store reads only regular files there; move it away (and put the "
                 "store's file back, if there is a copy)")


def fsync_file(path: str) -> None:
    """Make a file's contents durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
