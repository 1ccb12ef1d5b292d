"""Several real processes (and threads) writing one store at once."""

import json
import subprocess
import threading

import pytest

from tier_store import Store, check_topic

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all

WRITER = """
import sys
from tier_store import Store
from tests.conftest import make_batch
root, start, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t = Store.open(root).topic("t")
for i in range(n):
    b = make_batch(start + i * 100, 100)
    if mode == "same":
        t.append(b, partition=0)
    elif mode == "split":
        t.append(b, partition=start // 10**6)
    else:  # exactly once: every process replays the same batch ids under one writer id
        t.commit(t.write_chunks(make_batch(i * 100, 100), partition=0), writer_id="w",
                 batch_id=i)
"""


def _procs(root, specs):
    ps = [subprocess.Popen([PYTHON, "-c", WRITER, str(root), str(s), str(n), mode], cwd=ROOT,
                           stderr=subprocess.PIPE, text=True) for s, n, mode in specs]
    for p in ps:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]


@pytest.mark.parametrize("kind", ["file", "file-direct", "pmem"])
def test_two_processes_appending_to_one_partition_end_exactly_once_and_gapless(
        tmp_path, shm_dir, kind):
    conf = {"log.segment.bytes": "64k", "log.checkpoint.interval": 20}
    if kind == "file-direct":  # chunks that cross a block boundary are written with O_DIRECT
        conf["log.file.direct.bytes"] = "1k"
    if kind == "pmem":
        conf.update({"log.channel.type": "pmem", "storage.tiers.first.paths": shm_dir,
                     "storage.tiers.first.sizes": "16m", "log.pmem.pool.ratio": 1.0})
    s = Store.open(tmp_path, conf)
    s.create_topic("t", SCHEMA, partitions=1)
    _procs(tmp_path, [(0, 200, "same"), (10**6, 200, "same")])
    t = Store.open(tmp_path).topic("t")
    keys = read_all(t, 0)
    assert t.latest_offsets() == {0: 40_000} and len(keys) == 40_000
    assert sorted(keys) == list(range(20_000)) + list(range(10**6, 10**6 + 20_000))
    # Each process's records keep their order within the partition.
    mine = [k for k in keys if k < 10**6]
    assert mine == sorted(mine)
    assert len(t.segments()) > 10 and check_topic(t).ok


def test_two_processes_committing_to_different_partitions(tmp_path):
    Store.open(tmp_path, {"log.segment.bytes": "64k"}).create_topic("t", SCHEMA, partitions=2)
    _procs(tmp_path, [(0, 150, "split"), (10**6, 150, "split")])
    t = Store.open(tmp_path).topic("t")
    assert read_all(t, 0) == list(range(15_000))
    assert read_all(t, 1) == list(range(10**6, 10**6 + 15_000))


def test_racing_replays_of_one_writer_append_each_batch_once(tmp_path):
    Store.open(tmp_path, {"log.segment.bytes": "64k"}).create_topic("t", SCHEMA, partitions=1)
    _procs(tmp_path, [(0, 100, "replay"), (0, 100, "replay"), (0, 100, "replay")])
    t = Store.open(tmp_path).topic("t")
    assert read_all(t, 0) == list(range(10_000))
    assert t.state().writers == {"w": 99}


@pytest.mark.parametrize("direct", ["0", "1k"])
def test_a_reader_thread_sees_a_growing_prefix_while_a_writer_appends(tmp_path, direct):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k", "log.file.direct.bytes": direct})
    t = s.create_topic("t", SCHEMA)
    done = threading.Event()
    errors = []

    def reader():
        r = Store.open(tmp_path).topic("t")
        pos = 0
        try:
            while not done.is_set() or pos < 30_000:
                for b in r.read(0, pos):
                    keys = b.column("key").to_pylist()
                    if keys != list(range(pos, pos + len(keys))):
                        errors.append((pos, keys[:3]))
                    pos += len(keys)
        except Exception as e:  # surfaced below
            errors.append(repr(e))

    th = threading.Thread(target=reader)
    th.start()
    for i in range(300):
        t.append(make_batch(i * 100, 100))
    done.set()
    th.join(60)
    assert not errors and not th.is_alive()


def test_concurrent_topic_creation_has_one_winner(tmp_path):
    code = ("import sys; from tier_store import Store, TopicExists; from tests.conftest import "
            "SCHEMA\ntry:\n    Store.open(sys.argv[1]).create_topic('t', SCHEMA)\n"
            "    print('created')\nexcept TopicExists:\n    print('exists')")
    ps = [subprocess.Popen([PYTHON, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                           text=True) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in ps]
    assert sorted(outs) == ["created", "exists", "exists", "exists"]
    assert json.loads((tmp_path / "_store.json").read_text())["format"] == 1
