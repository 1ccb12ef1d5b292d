import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter

import pytest

from tier_store import Store, StoreUnavailable, check_topic
from tier_store.layout import log_dir

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all, settle
from .support import log_versions
from .support import record_fsyncs as _record_fsyncs


def _store(store_root):
    s = store_root.open({"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(30):
        t.append(make_batch(i * 300, 300), key="key")
    return s, t


def test_check_of_a_healthy_topic_verifies_every_chunk(store_root):
    s, t = _store(store_root)
    r = check_topic(t)
    assert r.ok, r.problems
    assert r.chunks == 60 and r.segments == len(t.segments())
    assert r.bytes_verified == sum(seg.bytes for seg in t.segments())


def test_check_reports_a_flipped_byte_with_file_and_offsets(store_root):
    s, t = _store(store_root)
    seg = t.segments()[1]
    with open(seg.path, "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 0xFF]))
    r = check_topic(Store.open(store_root.url).topic("t"))
    assert len(r.problems) == 1
    assert seg.path in r.problems[0] and "does not match its checksum" in r.problems[0]


def test_check_reports_a_missing_segment_file(store_root):
    s, t = _store(store_root)
    seg = t.segments()[0]
    os.unlink(seg.path)
    r = check_topic(Store.open(store_root.url).topic("t"))
    assert any("is missing" in p and seg.id in p for p in r.problems)


# -- the checkpoint pointer -----------------------------------------------------------------

_STALLED_COMMITTER = """
import os, signal, sys, threading
import tier_store.commit_log as commit_log
from tier_store import Store
from tests.conftest import make_batch

real = commit_log.crash_point


def stall(name):
    # Stop here, between linking the checkpoint and moving the pointer, until SIGCONT. The
    # checkpoint is written on a thread of its own: the stop is sent to it, as a signal to
    # the process would let it run on until another thread took the stop.
    if name == "checkpoint.pointer":
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    real(name)


commit_log.crash_point = stall
t = Store.open(sys.argv[1]).topic("t")
t.append(make_batch(10, 10), partition=0)  # version 2: writes checkpoint 2, then stalls
print("committed")
"""


def _hint(topic) -> int | None:
    """The checkpoint ``topic``'s log points at (a file on a local root, markers on S3)."""
    return topic.log.commit_log.store.last_checkpoint_hint()


def _point_hint_at(topic, version: int) -> None:
    """Make ``topic``'s checkpoint hint name ``version``, as an older release's stalled
    committer could leave it: the pointer file written, or the only marker on S3."""
    from tier_store.logstore.objects import ObjectLogStore, hint_marker
    store = topic.log.commit_log.store
    if isinstance(store, ObjectLogStore):
        store.objects.delete([i.key for i in store.objects.list("_last_checkpoint")])
        store.objects.put(hint_marker(version), b"")
    else:
        with open(os.path.join(store.path, "_last_checkpoint"), "w") as f:
            f.write(str(version))
    assert _hint(topic) == version


def test_a_stalled_committer_never_moves_the_checkpoint_pointer_back(store_root):
    root = store_root.url
    s = store_root.open({"log.checkpoint.interval": 2, "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)  # version 1
    child = subprocess.Popen([PYTHON, "-c", _STALLED_COMMITTER, root], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), child.stderr.read()[-2000:]
    try:
        # Meanwhile this process commits on: checkpoints 4 and 6, and the cleanup behind 4
        # deletes checkpoint 2 with the entries before it.
        for i in range(4):
            t.append(make_batch(20 + i * 10, 10), partition=0)
            settle()
        assert 2 not in log_versions(t)[1]
    finally:
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and "committed" in out, err[-2000:]
    assert _hint(t) == 6
    again = Store.open(root).topic("t")
    assert again.version == 6 and read_all(again, 0) == list(range(60))


def test_a_pointer_naming_a_deleted_checkpoint_falls_back_to_the_newest_present(store_root):
    root = store_root.url
    s = store_root.open({"log.checkpoint.interval": 2, "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA, partitions=1)
    stale = Store.open(root).topic("t")  # a handle at version 0, left behind by cleanup
    for i in range(7):
        t.append(make_batch(i * 10, 10), partition=0)
        settle()
    assert log_versions(t)[1] == [4, 6]
    _point_hint_at(t, 2)  # as an older release's stalled committer could leave it
    again = Store.open(root).topic("t")
    assert again.version == 7 and read_all(again, 0) == list(range(70))
    assert stale.latest_offsets() == {0: 70} and read_all(stale, 0) == list(range(70))


# -- directories (local root only: fsyncs of the root's directories) ---------------------

def test_a_new_topic_directory_is_durable_in_the_root_before_the_create_entry(tmp_path,
                                                                              monkeypatch):
    s = Store.open(tmp_path / "s")
    calls = _record_fsyncs(monkeypatch)
    s.create_topic("t", SCHEMA)
    synced = [path for _, path in calls]
    tdir, ldir = os.path.join(s.root, "t"), log_dir(s.root, "t")
    publication = min(i for i, path in enumerate(synced) if path.startswith(ldir))
    for d in (s.root, tdir):  # hold the new t/, and t/_log/ and t/_partitions/
        assert d in synced[:publication], (d, synced)
    calls.clear()
    s.create_topic("u", SCHEMA)  # existing directories are not fsynced again
    assert tdir not in [path for _, path in calls]


# -- housekeeping after a commit -------------------------------------------------------------
# (local root: a directory where the pointer goes; on S3 the server's outage while a checkpoint
# is written is a case of test_a_gateway_stopped_at_a_step_of_a_commit)

def test_a_checkpoint_failing_after_a_published_commit_is_logged_not_raised(tmp_path, caplog):
    s = Store.open(tmp_path / "s", {"log.checkpoint.interval": 2})
    t = s.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)  # version 1
    # A directory where the checkpoint pointer goes: writing the checkpoint fails, as on a
    # broken or full file system.
    pointer = os.path.join(log_dir(s.root, "t"), "_last_checkpoint")
    os.makedirs(os.path.join(pointer, "obstacle"))
    with caplog.at_level(logging.WARNING, logger="tier_store.maintenance.housekeeping"):
        results = t.append(make_batch(10, 10), partition=0)  # version 2, then the checkpoint
    assert [(r.partition, r.base_offset, r.records, r.version) for r in results] == \
        [(0, 10, 10, 2)]
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "topic t: writing the checkpoint at version 2" in warning.getMessage()
    assert f"CorruptLog: checkpoint pointer {pointer} is a directory" in warning.getMessage()
    t.append(make_batch(20, 10), partition=0)  # the topic goes on
    shutil.rmtree(pointer)
    again = Store.open(tmp_path / "s").topic("t")
    assert read_all(again, 0) == list(range(30))


# -- outages of the S3 server -------------------------------------------------------------------

def _outage_store(root: str, tmp_path, **retry):
    """A store at s3 ``root`` whose requests give up after ``retry`` (small budgets: an
    outage fails in seconds)."""
    options = {"endpoint_url": os.environ["AWS_ENDPOINT_URL"], **retry}
    return Store.open(root, {"storage.tiers.first.paths": str(tmp_path / "tier-1"),
                             "storage.root.options": json.dumps(options),
                             "log.checkpoint.interval": 4, "log.cleanup.grace.ms": 0})


def _keys_once(topic) -> Counter:
    counts: Counter[int] = Counter()
    for p in range(topic.partitions):
        for b in topic.read(p, 0):
            counts.update(b.column("key").to_pylist())
    assert not [k for k, n in counts.items() if n > 1], "records appended twice"
    return counts


def test_a_gateway_outage_mid_commit_fails_naming_bucket_and_key_and_commits_once_or_not(
        s3_own_server, s3_own_root, tmp_path):
    bucket = s3_own_root[len("s3://"):].split("/")[0]
    store = _outage_store(s3_own_root, tmp_path, retry_attempts=3, retry_max_seconds=2)
    topic = store.create_topic("t", SCHEMA, partitions=2)
    acked: list[int] = []
    failed: list[tuple[int, BaseException]] = []
    enough = threading.Event()

    def committer():
        for i in range(10_000):  # until the outage stops it
            first = i * 100
            try:
                topic.append(make_batch(first, 100), key="key")
            except Exception as e:  # the outage's error: checked below
                failed.append((first, e))
                return
            acked.append(first)
            if len(acked) == 10:
                enough.set()

    th = threading.Thread(target=committer)
    th.start()
    assert enough.wait(120)
    s3_own_server.stop_gateway()  # while commits run: mid-request, or between them
    th.join(120)
    assert not th.is_alive()
    (first, error), = failed
    assert isinstance(error, StoreUnavailable), repr(error)
    message = str(error)
    assert f"s3://{bucket}/" in message and "failed after" in message, message
    s3_own_server.start_gateway()
    again = Store.open(s3_own_root, create=False)
    t = again.topic("t")
    counts = _keys_once(t)
    # Every acknowledged commit is there; the one the outage interrupted is all there or
    # not at all; nothing else.
    firsts = {k // 100 * 100 for k in counts}
    assert set(acked) <= firsts <= set(acked) | {first}
    assert all(counts[k] == 1 for f in firsts for k in range(f, f + 100))
    assert t.version == len(firsts) and sum(t.latest_offsets().values()) == len(counts)
    assert check_topic(t).ok
    # The store works on: the next commit lands once.
    t.append(make_batch(10**6, 100), key="key")
    assert sum(_keys_once(Store.open(s3_own_root).topic("t")).values()) == len(counts) + 100
    again.close()


def test_a_commit_outlasts_an_outage_shorter_than_its_retry_budget_and_lands_once(
        s3_own_server, s3_own_root, tmp_path):
    store = _outage_store(s3_own_root, tmp_path, retry_attempts=30, retry_max_seconds=90)
    topic = store.create_topic("t", SCHEMA, partitions=2)
    topic.append(make_batch(0, 100), key="key")
    s3_own_server.stop_gateway()
    result: list[object] = []
    th = threading.Thread(target=lambda: result.append(topic.append(make_batch(100, 100),
                                                                    key="key")))
    began = time.monotonic()
    th.start()
    time.sleep(2)  # the commit is retrying against a closed port
    assert th.is_alive() and not result
    s3_own_server.start_gateway()
    th.join(120)
    assert not th.is_alive() and result, "the commit did not finish after the outage"
    assert {r.version for r in result[0]} == {2} and sum(r.records for r in result[0]) == 100
    logging.getLogger(__name__).warning("commit across a gateway restart took %.1f s",
                                        time.monotonic() - began)
    t = Store.open(s3_own_root, create=False).topic("t")
    assert t.version == 2 and sorted(_keys_once(t)) == list(range(200))
    assert check_topic(t).ok


@pytest.mark.parametrize("point", ["log.publish.tmp", "log.publish.linked", "checkpoint.write"])
def test_a_gateway_stopped_at_a_step_of_a_commit(s3_own_server, s3_own_root, tmp_path,
                                                 monkeypatch, caplog, point):
    """The gateway dies just before the entry's PUT (the commit fails naming the entry's key
    and is not made; committing its chunks again later lands them once), just after it (the
    commit stands), or before the checkpoint's PUT (logged; the commit stands)."""
    import tier_store.logstore.objects as objects_log
    bucket = s3_own_root[len("s3://"):].split("/")[0]
    store = _outage_store(s3_own_root, tmp_path, retry_attempts=3, retry_max_seconds=2)
    topic = store.create_topic("t", SCHEMA, partitions=2)
    for i in range(3):
        topic.append(make_batch(i * 100, 100), key="key")  # versions 1-3
    real = objects_log.crash_point

    def stop_here(name):
        if name == point:
            s3_own_server.stop_gateway()
        real(name)

    monkeypatch.setattr(objects_log, "crash_point", stop_here)
    refs = topic.write_chunks(make_batch(300, 100), key="key")
    if point == "log.publish.tmp":
        with pytest.raises(StoreUnavailable) as e:
            topic.commit(refs)
        assert f"s3://{bucket}/" in str(e.value) and "_log/00000000000000000004.json" in \
            str(e.value) and "PUT failed" in str(e.value), str(e.value)
        made = 0
    else:
        with caplog.at_level(logging.WARNING):
            assert sum(r.records for r in topic.commit(refs)) == 100  # version 4
            settle()  # the checkpoint is written after the commit returns
        if point == "checkpoint.write":
            assert "writing the checkpoint at version 4" in caplog.text
            assert "StoreUnavailable" in caplog.text
        made = 100
    monkeypatch.setattr(objects_log, "crash_point", real)
    s3_own_server.start_gateway()
    t = Store.open(s3_own_root, create=False).topic("t")
    assert t.version == 3 + made // 100 and sum(_keys_once(t).values()) == 300 + made
    # The chunks written before the outage are committed once, whatever happened before.
    again = topic.commit(refs)
    assert sum(r.records for r in again) == 100 - made
    t = Store.open(s3_own_root, create=False).topic("t")
    assert sorted(_keys_once(t)) == list(range(400)) and check_topic(t).ok
