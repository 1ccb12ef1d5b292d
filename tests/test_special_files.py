"""A directory, FIFO or device in place of a file the store reads (issue #20): the store
raises a :class:`~tier_store.PafkaError` naming the file and what it is, and never blocks.

A template store (as tests/test_log_damage.py's: topic ``t``, one partition, keys 0..299 in
six appends, a checkpoint at version 4, entries 5 and 6 after it; here each append has a
16 KiB segment of its own, on one file tier) is copied per case, and one of its files is
replaced by a directory, a FIFO or a character device (/dev/null's numbers). A child process
then opens the store and the topic, appends to the partition and reads it, and reports the
first error; the parent kills it if it does not finish in time (a read of a FIFO blocks until
a writer comes: forever)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from tier_store import CorruptLog, CorruptState, Store

from .conftest import PYTHON, SCHEMA, make_batch, read_all, settle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD_TIMEOUT_S = 60
RECORDS, PER = 300, 50
NEWEST, CHECKPOINT = 6, 4

#: The files replaced, and the error each must give.
TARGETS: dict[str, str] = {
    "newest entry": "CorruptLog",
    "older entry": "CorruptLog",
    "checkpoint": "CorruptLog",
    "_last_checkpoint": "CorruptLog",
    "_store.json": "CorruptState",
    "active pointer": "CorruptState",
    "sealed segment": "CorruptSegment",
    "active segment": "CorruptSegment",
}
#: The words each kind of file is named with in the error.
KINDS = {"directory": "a directory", "fifo": "a FIFO", "device": "a character device"}


def target_path(root: str, target: str) -> str:
    """Where ``target`` lives in the template store at ``root``."""
    log = os.path.join(root, "t", "_log")
    if target == "newest entry":
        return os.path.join(log, f"{NEWEST:020d}.json")
    if target == "older entry":  # after the checkpoint: read by every open
        return os.path.join(log, f"{NEWEST - 1:020d}.json")
    if target == "checkpoint":
        return os.path.join(log, f"{CHECKPOINT:020d}.checkpoint")
    if target == "_last_checkpoint":
        return os.path.join(log, "_last_checkpoint")
    if target == "_store.json":
        return os.path.join(root, "_store.json")
    if target == "active pointer":
        return os.path.join(root, "t", "_partitions", "0.active")
    with Store.open(root, create=False) as s:
        t = s.topic("t")
        seq, tier = t.active_segment(0)
        if target == "sealed segment":
            seq = 0
        return s.tier(tier).segment_path("t", 0, seq)


def replace_with(path: str, kind: str) -> None:
    """Replace the file ``path`` by a ``kind`` of file (see :data:`KINDS`)."""
    os.unlink(path)
    if kind == "directory":
        os.mkdir(path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        os.mknod(path, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)


def child(root: str) -> None:
    """Open the store at ``root``, its topic ``t``, append to partition 0 and read it;
    print the outcome as JSON (the step that failed, the error's class, whether it is a
    PafkaError, its message), and how checking the store and listing its tier usage ended
    (in a fresh store: "ok", or the error's class)."""
    import logging  # noqa: PLC0415
    logging.disable(logging.CRITICAL)
    from tier_store import PafkaError  # noqa: PLC0415
    step = "open store"
    out: dict[str, Any] = {"step": "done"}
    try:
        with Store.open(root, create=False) as s:
            step = "open topic"
            t = s.topic("t")
            step = "append"  # first: the active segment's file is opened for writing
            t.append(make_batch(RECORDS, 5), partition=0)
            step = "read"
            assert read_all(t, 0) == list(range(RECORDS + 5))
    except Exception as e:  # noqa: BLE001 (what is reported)
        out = {"step": step, "error": type(e).__name__, "pafka": isinstance(e, PafkaError),
               "message": str(e)}
    for what, op in [("check", lambda s: s.check(verify=True)),
                     ("usage", lambda s: s.tier_usage())]:
        try:
            with Store.open(root, create=False) as s:
                op(s)
            out[what] = "ok"
        except Exception as e:  # noqa: BLE001
            out[what] = ("" if isinstance(e, PafkaError) else "bare ") + type(e).__name__
    print(json.dumps(out))


def run_child(root: str) -> dict[str, Any]:
    code = "import sys; from tests.test_special_files import child; child(sys.argv[1])"
    try:
        p = subprocess.run([PYTHON, "-c", code, root], cwd=REPO, capture_output=True,
                           text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the store blocked for {CHILD_TIMEOUT_S} s on {root}")
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def build_template(root: str) -> None:
    """The store each case damages a copy of (see the module docstring)."""
    with Store.open(root, {"log.checkpoint.interval": CHECKPOINT,
                           "log.segment.bytes": "16k"}) as s:
        t = s.create_topic("t", SCHEMA, partitions=1)
        for i in range(RECORDS // PER):
            b = make_batch(i * PER, PER)
            # 10 KB of values: two appends do not fit a segment, so each one rolls.
            t.append(b.set_column(2, "value", pa.array(["x" * 200] * PER)), partition=0)
        settle()
        assert t.version == NEWEST and t.checkpointed_version == CHECKPOINT
        assert t.active_segment(0)[0] == RECORDS // PER - 1


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("special") / "template")
    build_template(root)
    return root


@pytest.fixture
def copy(template, tmp_path) -> str:
    root = str(tmp_path / "store")
    shutil.copytree(template, root)
    return root


def _can_make_devices(tmp: str) -> bool:
    probe = os.path.join(tmp, "probe-device")
    try:
        os.mknod(probe, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    except OSError:
        return False
    os.unlink(probe)
    return True


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("target", list(TARGETS))
def test_a_special_file_in_place_of_a_store_file_is_an_error_naming_it(target, kind, copy,
                                                                       tmp_path):
    if kind == "device" and not _can_make_devices(str(tmp_path)):
        pytest.skip("cannot make device files here (mknod needs CAP_MKNOD)")
    path = target_path(copy, target)
    replace_with(path, kind)
    got = run_child(copy)
    assert got["step"] != "done", f"{kind} in place of {path} went unnoticed"
    assert got["pafka"], got
    assert got["error"] == TARGETS[target], got
    assert path in got["message"], got
    assert KINDS[kind] in got["message"] and "regular file" in got["message"], got
    # Checking the store reads every file named here (segment headers too): never bare.
    assert not got["check"].startswith("bare") and not got["usage"].startswith("bare"), got


def test_a_directory_in_place_of_the_newest_entry_is_not_taken_for_its_absence(copy):
    """Probing the log stops at the first number with no file: a directory there is no
    "no entry", and neither is it once the store is open (a handle refreshing)."""
    s = Store.open(copy, create=False)
    t = s.topic("t")
    assert t.version == NEWEST
    path = os.path.join(copy, "t", "_log", f"{NEWEST + 1:020d}.json")
    os.mkdir(path)
    with pytest.raises(CorruptLog, match=f"{path} is a directory"):
        t.latest_offsets()  # refreshes: probes NEWEST + 1
    with pytest.raises(CorruptLog, match=f"{path} is a directory"):
        s.topic("t")
    with pytest.raises(CorruptLog, match=f"{path} is a directory"):
        t.append(make_batch(RECORDS, 5), partition=0)
    s.close()


def test_a_link_in_place_of_store_json_is_an_error_naming_it(copy, tmp_path):
    """The root's own files are never read through a link (they never were: now the
    refusal names the file rather than being a bare ELOOP)."""
    path = os.path.join(copy, "_store.json")
    elsewhere = str(tmp_path / "elsewhere.json")
    shutil.move(path, elsewhere)
    os.symlink(elsewhere, path)
    with pytest.raises(CorruptState, match=f"{path} is a symbolic link"):
        Store.open(copy, create=False)


if __name__ == "__main__":
    child(sys.argv[1])
