"""Several real processes (and threads) writing one store at once, on a local root and on an
``s3://`` root (the commit log on the S3 server; tests/test_shared_log.py races 16)."""

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


def _on(kinds, s3_kinds):
    """(kind, root kind) cases: every kind on a local root, ``s3_kinds`` on S3 too."""
    return [pytest.param(k, "local", id=f"{k}-local") for k in kinds] + \
        [pytest.param(k, "s3", id=f"{k}-s3") for k in s3_kinds]


def _appends(store_root, n: int) -> int:
    """``n`` appends per process, fewer on S3 (a commit there is a few requests, and
    tests/test_shared_log.py races more processes)."""
    return n // 3 if store_root.is_s3 else n


def _procs(root, specs):
    ps = [subprocess.Popen([PYTHON, "-c", WRITER, str(root), str(s), str(n), mode], cwd=ROOT,
                           stderr=subprocess.PIPE, text=True) for s, n, mode in specs]
    for p in ps:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]


@pytest.mark.parametrize("kind,store_root", _on(["file", "file-direct", "pmem"], ["file"]),
                         indirect=["store_root"])
def test_two_processes_appending_to_one_partition_end_exactly_once_and_gapless(
        store_root, shm_dir, kind):
    conf = {"log.segment.bytes": "64k", "log.checkpoint.interval": 20}
    if kind == "file-direct":  # chunks that cross a block boundary are written with O_DIRECT
        conf["log.file.direct.bytes"] = "1k"
    if kind == "pmem":
        conf.update({"log.channel.type": "pmem", "storage.tiers.first.paths": shm_dir,
                     "storage.tiers.first.sizes": "16m", "log.pmem.pool.ratio": 1.0})
    n = _appends(store_root, 200)
    s = store_root.open(conf)
    s.create_topic("t", SCHEMA, partitions=1)
    _procs(store_root.url, [(0, n, "same"), (10**6, n, "same")])
    t = Store.open(store_root.url).topic("t")
    keys = read_all(t, 0)
    assert t.latest_offsets() == {0: 200 * n} and len(keys) == 200 * n
    assert sorted(keys) == list(range(100 * n)) + list(range(10**6, 10**6 + 100 * n))
    # Each process's records keep their order within the partition.
    mine = [k for k in keys if k < 10**6]
    assert mine == sorted(mine)
    assert len(t.segments()) > n // 20 and check_topic(t).ok


def test_two_processes_committing_to_different_partitions(store_root):
    n = _appends(store_root, 150)
    store_root.open({"log.segment.bytes": "64k"}).create_topic("t", SCHEMA, partitions=2)
    _procs(store_root.url, [(0, n, "split"), (10**6, n, "split")])
    t = Store.open(store_root.url).topic("t")
    assert read_all(t, 0) == list(range(100 * n))
    assert read_all(t, 1) == list(range(10**6, 10**6 + 100 * n))


def test_racing_replays_of_one_writer_append_each_batch_once(store_root):
    store_root.open({"log.segment.bytes": "64k"}).create_topic("t", SCHEMA, partitions=1)
    _procs(store_root.url, [(0, 100, "replay"), (0, 100, "replay"), (0, 100, "replay")])
    t = Store.open(store_root.url).topic("t")
    assert read_all(t, 0) == list(range(10_000))
    assert t.state().writers == {"w": 99}


@pytest.mark.parametrize("direct,store_root", _on(["0", "1k"], ["0"]), indirect=["store_root"])
def test_a_reader_thread_sees_a_growing_prefix_while_a_writer_appends(store_root, direct):
    s = store_root.open({"log.segment.bytes": "64k", "log.file.direct.bytes": direct})
    t = s.create_topic("t", SCHEMA)
    n = _appends(store_root, 300)  # on S3 the reader polls the server without a pause
    done = threading.Event()
    errors = []

    def reader():
        r = Store.open(store_root.url).topic("t")
        pos = 0
        try:
            while not done.is_set() or pos < n * 100:
                for b in r.read(0, pos):
                    keys = b.column("key").to_pylist()
                    if keys != list(range(pos, pos + len(keys))):
                        errors.append((pos, keys[:3]))
                    pos += len(keys)
        except Exception as e:  # surfaced below
            errors.append(repr(e))

    th = threading.Thread(target=reader)
    th.start()
    for i in range(n):
        t.append(make_batch(i * 100, 100))
    done.set()
    th.join(60)
    assert not errors and not th.is_alive()


def test_concurrent_topic_creation_has_one_winner(store_root):
    # Four processes create the store and the topic at once: one store, one topic.
    code = ("import json, sys; from tier_store import Store, TopicExists; from tests.conftest "
            "import SCHEMA\ntry:\n    Store.open(sys.argv[1], json.loads(sys.argv[2]))"
            ".create_topic('t', SCHEMA)\n    print('created')\nexcept TopicExists:\n"
            "    print('exists')")
    ps = [subprocess.Popen([PYTHON, "-c", code, store_root.url, json.dumps(store_root.config())],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=60)[0].strip() for p in ps]
    assert sorted(outs) == ["created", "exists", "exists", "exists"]
    store = Store.open(store_root.url, create=False)
    assert store.topics() == ["t"] and store.id
    if not store_root.is_s3:
        with open(f"{store_root.url}/_store.json") as f:
            assert json.load(f)["format"] == 1
