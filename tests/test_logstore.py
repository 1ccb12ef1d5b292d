"""The LogStore contract (tier_store/logstore/base.py), checked for every implementation.

An implementation joins by adding a param to the ``impl`` fixture: an :class:`Impl` that
opens handles on one fresh log, deletes that log, and makes a process die mid-write.
Everything runs on real storage (files in ``tmp_path`` for POSIX, a prefix of a bucket on
the test radosgw for S3), with real threads and real forked processes.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

from tier_store.commit_log import CommitLog
from tier_store.entries import ConfigEntry, CreateEntry
from tier_store.errors import CorruptLog, TopicDeleted
from tier_store.layout import TMP_PREFIX, checkpoint_name, entry_name
from tier_store.logstore import LogFile, LogStore, ObjectLogStore, PosixLogStore
from tier_store.objects import ObjectStore
from tier_store.schemas import schema_to_text

from .conftest import SCHEMA

FORK = multiprocessing.get_context("fork")


@dataclass
class Impl:
    """One implementation under test, on one fresh log."""

    open: Callable[[], LogStore]  # a new handle on the log
    destroy: Callable[[bool], None]  # delete the log if there, create it again if True
    die_mid_write: Callable[[], None]  # arm: this process dies halfway through its next write
    staged: Callable[[], list[int]]  # sizes of what writers staged and never published
    handles: list[LogStore] = field(default_factory=list)

    def store(self) -> LogStore:
        s = self.open()
        self.handles.append(s)
        return s


def _posix(tmp_path) -> Impl:
    path = str(tmp_path / "t" / "_log")
    os.makedirs(path)

    def destroy(recreate: bool) -> None:
        shutil.rmtree(path, ignore_errors=True)
        if recreate:
            os.makedirs(path)

    def die_mid_write() -> None:
        def half(fd: int, data) -> int:
            written = real(fd, bytes(memoryview(data)[: max(1, len(data) // 2)]))
            os.kill(os.getpid(), signal.SIGKILL)
            return written
        real = os.write
        os.write = half  # only ever in a forked child, which dies on it

    def staged() -> list[int]:
        return [os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)
                if n.startswith(TMP_PREFIX)]

    return Impl(lambda: PosixLogStore(path, "t"), destroy, die_mid_write, staged)


class TopicMarker:
    """The incarnation check an object root gives a topic's log, for a log at a fixed prefix:
    ``<topic>/_topic.json`` names the incarnation, pinned on first sight."""

    def __init__(self, topic: ObjectStore):
        self.topic = topic
        self.pinned: str | None = None

    def __call__(self) -> bool:
        data = self.topic.get("_topic.json")
        now = json.loads(data)["incarnation"] if data is not None else None
        if self.pinned is None:
            self.pinned = now
            return now is not None
        if now != self.pinned:
            again = " and created again" if now is not None else ""
            raise TopicDeleted(f"topic 't' was deleted{again} since this handle opened it: "
                               "open the topic again")
        return True


def _s3(url: str) -> Impl:
    """A topic ``t`` under ``url``: ``t/_topic.json`` and the log under ``t/_log/``."""
    topic = ObjectStore.open(url).child("t")
    log_url = topic.child("_log").url

    def destroy(recreate: bool) -> None:
        topic.delete(["_topic.json"])  # first: from here on the topic is gone
        topic.delete([o.key for o in topic.list()], ordered=False)
        if recreate:
            topic.put_if_absent("_topic.json",
                                json.dumps({"incarnation": uuid.uuid4().hex}).encode())

    def die_mid_write() -> None:
        def half(sock: socket.socket, data, *args) -> None:
            if len(data) >= 50_000:  # the body of a put: send half of it, then die
                real(sock, bytes(memoryview(data)[: len(data) // 2]))
                os.kill(os.getpid(), signal.SIGKILL)
            real(sock, data, *args)
        real = socket.socket.sendall
        socket.socket.sendall = half  # type: ignore[method-assign]  # forked child only

    def open_() -> LogStore:
        # Checked on every call (recheck_seconds=0): the contract tests delete and expect
        # the very next check to notice.
        return ObjectLogStore(ObjectStore.open(log_url), "t", TopicMarker(topic),
                              recheck_seconds=0)

    destroy(True)
    return Impl(open_, destroy, die_mid_write, lambda: [])  # nothing is ever staged


@pytest.fixture(params=["posix", "s3"])
def impl(request, tmp_path):
    made = _s3(request.getfixturevalue("s3_root")) if request.param == "s3" \
        else _posix(tmp_path)
    yield made
    for s in made.handles:
        s.close()


@pytest.fixture
def store(impl) -> LogStore:
    return impl.store()


def _in_child(target: Callable[[], int]) -> int:
    """Run ``target`` in a forked process; its exit code (negative: killed by a signal)."""
    def main() -> None:
        sys.exit(target())
    p = FORK.Process(target=main)
    p.start()
    p.join(60)
    assert p.exitcode is not None, "child hung"
    return p.exitcode


# -- entries ----------------------------------------------------------------------------------

def test_put_if_absent_twice_keeps_the_first(store):
    assert store.put_if_absent(0, b"first") is True
    assert store.put_if_absent(0, b"second, longer than the first") is False
    assert store.read(0) == b"first"
    assert store.contains(0) and store.versions() == [0]


def test_a_missing_version_reads_as_none(store):
    assert store.read(7) is None and not store.contains(7)
    store.put_if_absent(0, b"x")
    assert store.read(1) is None and store.read_checkpoint(0) is None
    assert store.last_checkpoint_hint() is None and store.checkpoints() == []


def test_entries_are_seen_by_every_handle(impl):
    a, b = impl.store(), impl.store()
    assert a.put_if_absent(0, b"from a")
    assert b.read(0) == b"from a" and not b.put_if_absent(0, b"from b")


def test_versions_are_listed_in_order_and_incrementally(store):
    for v in (3, 0, 11, 2, 1, 10):  # the order of puts does not matter
        assert store.put_if_absent(v, f"e{v}".encode())
    assert store.versions() == [0, 1, 2, 3, 10, 11]
    assert store.versions(3) == [3, 10, 11] and store.versions(4) == [10, 11]
    assert store.versions(12) == []
    store.put_if_absent(12, b"e12")
    assert store.versions(12) == [12]


def test_listings_of_a_log_that_does_not_exist_are_empty(impl):
    s = impl.store()
    impl.destroy(False)
    assert not s.exists()
    assert s.versions() == [] and s.checkpoints() == [] and s.listing() == []
    assert s.read(0) is None and s.last_checkpoint_hint() is None


@pytest.mark.parametrize("shared", [True, False], ids=["one-handle", "handle-each"])
def test_concurrent_puts_from_threads_have_one_winner(impl, shared):
    n, rounds = 12, 5
    handles = [impl.store()] * n if shared else [impl.store() for _ in range(n)]
    for v in range(rounds):
        barrier = threading.Barrier(n)
        won: list[int] = []

        def put(i: int, v: int = v, barrier: threading.Barrier = barrier,
                won: list[int] = won) -> None:
            barrier.wait()
            if handles[i].put_if_absent(v, f"writer {i}".encode()):
                won.append(i)
        threads = [threading.Thread(target=put, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, won
        assert handles[0].read(v) == f"writer {won[0]}".encode()
    assert handles[0].versions() == list(range(rounds))


def test_concurrent_puts_from_processes_have_one_winner(impl):
    n, rounds = 6, 4
    store = impl.store()
    for v in range(rounds):
        barrier = FORK.Barrier(n)

        def put(i: int, v: int = v, barrier=barrier) -> None:
            s = impl.open()  # each process its own handle, as separate committers have
            barrier.wait(30)
            sys.exit(0 if s.put_if_absent(v, f"writer {i}".encode()) else 1)
        procs = [FORK.Process(target=put, args=(i,)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        codes = [p.exitcode for p in procs]
        assert sorted(codes) == [0] + [1] * (n - 1), codes
        assert store.read(v) == f"writer {codes.index(0)}".encode()


def test_a_writer_dying_mid_put_leaves_nothing_visible(impl, store):
    store.put_if_absent(0, b"zero")
    data = b"x" * 100_000

    def put() -> int:
        impl.die_mid_write()
        impl.open().put_if_absent(1, data)
        return 0
    assert _in_child(put) == -signal.SIGKILL
    assert all(0 < n < len(data) for n in impl.staged())  # really cut off in the middle
    assert store.read(1) is None and not store.contains(1) and store.versions() == [0]
    assert store.listing() == [LogFile(0, False, store.listing()[0].mtime)]
    assert store.put_if_absent(1, b"one") and store.read(1) == b"one"
    store.discard_temporaries(time.time() + 1)
    assert impl.staged() == [] and store.versions() == [0, 1]


def test_a_writer_dying_mid_checkpoint_leaves_nothing_visible(impl, store):
    def write() -> int:
        impl.die_mid_write()
        impl.open().write_checkpoint(4, b"c" * 100_000)
        return 0
    assert _in_child(write) == -signal.SIGKILL
    assert all(0 < n < 100_000 for n in impl.staged())
    assert store.read_checkpoint(4) is None and store.checkpoints() == []
    assert store.write_checkpoint(4, b"whole")
    assert bytes(store.read_checkpoint(4)) == b"whole"


# -- checkpoints and the hint -------------------------------------------------------------------

def test_checkpoints_are_written_once_and_listed_in_order(store):
    assert store.write_checkpoint(10, b"ten")
    assert store.write_checkpoint(5, pa.py_buffer(b"five"))  # any bytes-like object
    assert store.write_checkpoint(10, b"another ten") is False
    assert bytes(store.read_checkpoint(10)) == b"ten"
    assert bytes(store.read_checkpoint(5)) == b"five"
    assert store.checkpoints() == [5, 10] and store.versions() == []
    assert store.last_checkpoint_hint() is None  # writing a checkpoint does not move it


def test_the_hint_only_moves_forward(impl):
    a, b = impl.store(), impl.store()
    assert a.advance_checkpoint_hint(5) is None
    assert b.last_checkpoint_hint() == 5
    assert b.advance_checkpoint_hint(3) == 5 and a.last_checkpoint_hint() == 5
    assert b.advance_checkpoint_hint(5) == 5
    assert a.advance_checkpoint_hint(8) == 5 and b.last_checkpoint_hint() == 8


def test_concurrent_hint_moves_end_at_the_highest(impl):
    handles = [impl.store() for _ in range(8)]
    barrier = threading.Barrier(len(handles))
    went_back: list[tuple[int, int | None]] = []

    def move(i: int) -> None:
        barrier.wait()
        for v in range(i, 80, len(handles)):
            handles[i].advance_checkpoint_hint(v)
            now = handles[i].last_checkpoint_hint()
            if now is None or now < v:
                went_back.append((v, now))
    threads = [threading.Thread(target=move, args=(i,)) for i in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert went_back == [] and handles[0].last_checkpoint_hint() == 79


# -- through the commit log -------------------------------------------------------------------

def _commit_log_with_history(store: LogStore, n: int) -> CommitLog:
    """A commit log on ``store``: a create entry, then ``n`` config entries, a checkpoint
    every 2 versions (cleanup with no grace)."""
    clog = CommitLog.on(store)
    assert clog.publish(0, CreateEntry(1, schema_to_text(SCHEMA), 1, {}, "id"))
    _extend(clog, 1, n)
    return clog


def _extend(clog: CommitLog, first: int, last: int) -> None:
    """Publish config entries ``first..last``, checkpointing every 2 versions."""
    st = clog.load()
    for v in range(first, last + 1):
        assert clog.publish(v, ConfigEntry(1 + v, {"k": v}))
        st = clog.refresh(st)
        if v % 2 == 0:
            clog.write_checkpoint(st, 0)


def test_a_stale_or_missing_hint_falls_back_to_the_listing(impl, store):
    _commit_log_with_history(store, 9)
    assert store.checkpoints() == [6, 8] and store.last_checkpoint_hint() == 8
    assert store.versions() == [6, 7, 8, 9]  # cleaned up behind checkpoint 6
    for hint in (2, None, 99):  # names a deleted checkpoint; is missing; is ahead
        reader = impl.store()
        reader.last_checkpoint_hint = lambda hint=hint: hint  # type: ignore[method-assign]
        st = CommitLog.on(reader).load()
        assert st.version == 9 and st.config["k"] == 9, hint


def test_a_stale_reader_refreshes_past_cleanup(impl, store):
    clog = _commit_log_with_history(store, 1)
    old = CommitLog.on(impl.store()).load()
    assert old.version == 1
    _extend(clog, 2, 11)
    assert not store.contains(1)
    st = CommitLog.on(impl.store()).refresh(old)
    assert st.version == 11 and st.config["k"] == 11


def test_a_malformed_entry_or_checkpoint_raises_corrupt_log_naming_it(store):
    clog = _commit_log_with_history(store, 2)
    assert store.put_if_absent(3, b"{not json")
    with pytest.raises(CorruptLog, match=r"entry .*" + store.entry_location(3)):
        clog.load()
    assert store.write_checkpoint(4, b"not an arrow file")
    store.advance_checkpoint_hint(4)
    with pytest.raises(CorruptLog, match="checkpoint " + store.checkpoint_location(4)):
        CommitLog.on(store).load()


# -- cleanup ------------------------------------------------------------------------------------

def test_listing_and_delete(store):
    for v in range(6):
        store.put_if_absent(v, b"e")
    store.write_checkpoint(2, b"c")
    store.write_checkpoint(4, b"c")
    before = time.time()
    old = store.listing(below=4)
    assert [(f.version, f.checkpoint) for f in old] == \
        [(0, False), (1, False), (2, True), (2, False), (3, False)]
    assert all(abs(f.mtime - before) < 60 for f in old)
    assert len(store.listing()) == 8
    assert store.delete(old[:3]) == 3
    assert store.versions() == [2, 3, 4, 5] and store.checkpoints() == [4]
    assert store.read(0) is None and store.read_checkpoint(2) is None
    assert store.delete(old) == 2  # those already gone are skipped
    assert store.versions() == [4, 5]
    assert store.delete([LogFile(99, False, 0.0)]) == 0


def test_cleanup_keeps_what_is_within_its_grace(store):
    clog = CommitLog.on(store)
    for v in range(5):
        store.put_if_absent(v, b"e")
    assert clog.cleanup(3, grace_ms=3_600_000) == 0
    assert clog.cleanup(3, grace_ms=0) == 3
    assert store.versions() == [3, 4]


# -- index pieces -------------------------------------------------------------------------------

def test_pieces_are_put_once_read_listed_by_folder_and_deleted_by_folder(store):
    store.put_if_absent(0, b"e")
    assert store.read_piece("_index/0-1@1", "00aa-1.idx") is None
    assert store.piece_folders() == []
    store.put_piece("_index/0-1@1", "00aa-1.idx", b"piece one")
    store.put_piece("_index/0-1@1", "00aa-1.idx", b"piece one")  # again: the same bytes
    store.put_piece("_index/0-1@1", "00bb-2.idx", b"piece two")
    store.put_piece("_index/2-7@2", "00cc-1.idx", b"other")
    assert bytes(store.read_piece("_index/0-1@1", "00aa-1.idx")) == b"piece one"
    assert [f for f, _ in store.piece_folders()] == ["0-1@1", "2-7@2"]
    assert all(abs(t - time.time()) < 60 for _, t in store.piece_folders())
    # Pieces are no entries or checkpoints: listings and cleanup never see them.
    assert store.versions() == [0] and store.checkpoints() == []
    assert [f.version for f in store.listing()] == [0]
    assert store.delete_piece_folder("_index/0-1@1") == 2
    assert store.read_piece("_index/0-1@1", "00aa-1.idx") is None
    assert [f for f, _ in store.piece_folders()] == ["2-7@2"]
    assert store.delete_piece_folder("_index/0-1@1") == 0


# -- incarnations -------------------------------------------------------------------------------

@pytest.mark.parametrize("recreate", [False, True], ids=["deleted", "recreated"])
def test_a_deleted_log_is_noticed(impl, recreate):
    s = impl.store()
    assert s.put_if_absent(0, b"old")
    impl.destroy(recreate)
    said = "was deleted and created again" if recreate else "was deleted since"
    with pytest.raises(TopicDeleted, match=said):
        s.check_incarnation()
    with pytest.raises(TopicDeleted):
        s.put_if_absent(1, b"into the old one")
    fresh = impl.store()
    fresh.check_incarnation()
    assert fresh.read(1) is None
    if recreate:
        assert fresh.read(0) is None and fresh.put_if_absent(0, b"new")


def test_a_log_created_after_the_handle_is_pinned_on_first_sight(impl):
    impl.destroy(False)
    s = impl.store()
    s.check_incarnation()  # nothing there yet: nothing to compare with
    assert not s.exists()
    impl.destroy(True)
    assert s.exists() and s.put_if_absent(0, b"first")
    impl.destroy(True)
    with pytest.raises(TopicDeleted, match="was deleted and created again"):
        s.check_incarnation()


# -- POSIX specifics ----------------------------------------------------------------------------

@pytest.fixture
def posix(tmp_path) -> PosixLogStore:
    path = str(tmp_path / "_log")
    os.makedirs(path)
    s = PosixLogStore(path, "t")
    yield s
    s.close()


def test_posix_files_keep_their_names(posix):
    posix.put_if_absent(42, b"{}")
    posix.write_checkpoint(40, b"c")
    posix.advance_checkpoint_hint(40)
    assert sorted(os.listdir(posix.path)) == \
        sorted([entry_name(42), checkpoint_name(40), "_last_checkpoint",
                "_last_checkpoint.lock"])
    with open(os.path.join(posix.path, "_last_checkpoint"), "rb") as f:
        assert f.read() == b"40"
    assert posix.entry_location(42) == os.path.join(posix.path, "00000000000000000042.json")


def test_posix_a_leftover_temp_file_is_no_entry_and_is_discarded(posix):
    tmp = os.path.join(posix.path, f"{TMP_PREFIX}123-abc")
    with open(tmp, "wb") as f:
        f.write(b'{"kind": "crea')  # half an entry, as a crashed writer leaves it
    assert posix.versions() == [] and posix.listing() == [] and posix.read(0) is None
    assert posix.discard_temporaries(time.time() - 3600) == 0  # still within the grace
    assert posix.discard_temporaries(time.time() + 1) == 1
    assert os.listdir(posix.path) == []


def test_posix_put_fsyncs_the_entry_then_the_directory(posix, monkeypatch):
    posix.check_incarnation()
    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    assert posix.put_if_absent(0, b"{}")
    assert len(synced) == 2
    # A file with no name yet (O_TMPFILE: "<dir>/#<inode> (deleted)"), linked as the entry.
    assert synced[0].startswith(os.path.realpath(posix.path) + "/#")
    assert synced[1] == os.path.realpath(posix.path)
    # Where O_TMPFILE is missing: a named temporary file, linked, then removed.
    monkeypatch.delattr(os, "O_TMPFILE")
    synced.clear()
    assert posix.put_if_absent(1, b"{}") and not posix.put_if_absent(1, b"[]")
    assert os.path.basename(synced[0]).startswith(TMP_PREFIX)
    assert posix.read(1) == b"{}"
    assert not [n for n in os.listdir(posix.path) if n.startswith(TMP_PREFIX)]


def test_posix_put_makes_no_named_temporary_file(posix, monkeypatch):
    # Each name made and removed stays in the kernel's dentry cache (a negative entry) until
    # memory runs short: one per commit made every path lookup slower as a log grew old.
    from tier_store.logstore import posix as module
    posix.check_incarnation()

    def refused(*args, **kwargs):
        raise AssertionError("a named temporary file was made")
    monkeypatch.setattr(module, "write_temp", refused)
    for v in range(5):
        assert posix.put_if_absent(v, b"{}")
    assert not posix.put_if_absent(2, b"[]") and posix.read(2) == b"{}"


def test_posix_reads_and_puts_never_list_the_directory(posix, monkeypatch):
    clog = CommitLog.on(posix)
    clog.publish(0, CreateEntry(1, schema_to_text(SCHEMA), 1, {}, "id"))
    st = clog.load()

    def refused(*args):
        raise AssertionError("listed on a hot path")
    monkeypatch.setattr(os, "listdir", refused)
    monkeypatch.setattr(os, "scandir", refused)
    for v in range(1, 5):
        assert clog.publish(v, ConfigEntry(1 + v, {"k": v}))
        st = clog.refresh(st)
    assert st.version == 4


def test_commit_log_keeps_its_constructor(tmp_path):
    path = str(tmp_path / "_log")
    os.makedirs(path)
    clog = CommitLog(path, "t")
    assert isinstance(clog.store, PosixLogStore) and clog.path == path
    assert clog.publish(0, CreateEntry(1, schema_to_text(SCHEMA), 1, {}, "id"))
    assert clog.load().version == 0
    clog.close()
