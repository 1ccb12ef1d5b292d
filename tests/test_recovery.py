import logging
import os
import shutil
import signal
import subprocess

from tier_store import Store, check_topic
from tier_store.commit_log import CommitLog
from tier_store.layout import checkpoint_name, log_dir

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import record_fsyncs as _record_fsyncs


def _store(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(30):
        t.append(make_batch(i * 300, 300), key="key")
    return s, t


def test_check_of_a_healthy_topic_verifies_every_chunk(tmp_path):
    s, t = _store(tmp_path)
    r = check_topic(t)
    assert r.ok, r.problems
    assert r.chunks == 60 and r.segments == len(t.segments())
    assert r.bytes_verified == sum(seg.bytes for seg in t.segments())


def test_check_reports_a_flipped_byte_with_file_and_offsets(tmp_path):
    s, t = _store(tmp_path)
    seg = t.segments()[1]
    with open(seg.path, "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 0xFF]))
    r = check_topic(Store.open(tmp_path).topic("t"))
    assert len(r.problems) == 1
    assert seg.path in r.problems[0] and "does not match its checksum" in r.problems[0]


def test_check_reports_a_missing_segment_file(tmp_path):
    s, t = _store(tmp_path)
    seg = t.segments()[0]
    os.unlink(seg.path)
    r = check_topic(Store.open(tmp_path).topic("t"))
    assert any("is missing" in p and seg.id in p for p in r.problems)


# -- the checkpoint pointer -----------------------------------------------------------------

_STALLED_COMMITTER = """
import os, signal, sys
import tier_store.commit_log as commit_log
from tier_store import Store
from tests.conftest import make_batch

real = commit_log.crash_point


def stall(name):
    # Stop here, between linking the checkpoint and moving the pointer, until SIGCONT.
    if name == "checkpoint.pointer":
        os.kill(os.getpid(), signal.SIGSTOP)
    real(name)


commit_log.crash_point = stall
t = Store.open(sys.argv[1]).topic("t")
t.append(make_batch(10, 10), partition=0)  # version 2: writes checkpoint 2, then stalls
print("committed")
"""


def test_a_stalled_committer_never_moves_the_checkpoint_pointer_back(tmp_path):
    root = str(tmp_path / "s")
    s = Store.open(root, {"log.checkpoint.interval": 2, "log.cleanup.grace.ms": 0})
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
        ldir = log_dir(root, "t")
        assert not os.path.exists(os.path.join(ldir, checkpoint_name(2)))
    finally:
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0 and "committed" in out, err[-2000:]
    with open(os.path.join(ldir, "_last_checkpoint")) as f:
        assert f.read() == "6"
    again = Store.open(root).topic("t")
    assert again.version == 6 and read_all(again, 0) == list(range(60))


def test_a_pointer_naming_a_deleted_checkpoint_falls_back_to_the_newest_present(tmp_path):
    root = str(tmp_path / "s")
    s = Store.open(root, {"log.checkpoint.interval": 2, "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA, partitions=1)
    stale = Store.open(root).topic("t")  # a handle at version 0, left behind by cleanup
    for i in range(7):
        t.append(make_batch(i * 10, 10), partition=0)
    ldir = log_dir(root, "t")
    assert sorted(v for v in CommitLog(ldir, "t").checkpoint_versions()) == [4, 6]
    # As an older release's stalled committer could leave it: pointing at a deleted one.
    with open(os.path.join(ldir, "_last_checkpoint"), "w") as f:
        f.write("2")
    again = Store.open(root).topic("t")
    assert again.version == 7 and read_all(again, 0) == list(range(70))
    assert stale.latest_offsets() == {0: 70} and read_all(stale, 0) == list(range(70))


# -- directories ----------------------------------------------------------------------------

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


# -- housekeeping after a commit --------------------------------------------------------------

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
    assert "IsADirectoryError" in warning.getMessage()
    t.append(make_batch(20, 10), partition=0)  # the topic goes on
    shutil.rmtree(pointer)
    again = Store.open(tmp_path / "s").topic("t")
    assert read_all(again, 0) == list(range(30))
