"""Topic deletion: files reclaimed on every tier once no reader pins them, and each
incarnation of a name with its own id, so nothing of a deleted topic reaches a new one.
Each runs on a local root and on an ``s3://`` root."""

import json
import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

from migration import MigrationService
from tier_store import CommitConflict, Store, TopicDeleted, TopicNotFound

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import fill, pmem_hdd_config
from .support import no_cached_maps as no_cached_maps
from .support import pafka as _pafka


def _store(store_root, shm_dir):
    """A PMEM + disk store (see :func:`pmem_hdd_config`) at ``store_root``."""
    return store_root.open(pmem_hdd_config(shm_dir))


def _fill(s, name="t", n=30):
    return fill(s, n, name=name, partitions=2)


def test_deleting_a_topic_reclaims_its_files_on_every_tier_and_the_pool(store_root, shm_dir):
    s = _store(store_root, shm_dir)
    t = _fill(s)
    s.move_segment("t/0-0", 2)
    s.create_topic("other", SCHEMA).append(make_batch(0, 10))
    pool = s.tier(1).pool_size
    assert s.tier(1).free_pool_files() < pool - 1
    r = _pafka("delete-topic", str(s.root), "t", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["topic"] == "t" and report["records"] == 6000 and report["pinned_files"] == 0
    assert report["id"] == t.id != ""
    s2 = Store.open(s.root)
    assert s2.topics() == ["other"]
    with pytest.raises(TopicNotFound, match="topics: other"):
        s2.topic("t")
    # Nothing of it is left on either tier; its pool files are back in the pool.
    for tier in s2.tiers:
        assert not os.path.exists(os.path.join(tier.path, "t"))
        graves = os.path.join(tier.path, "_deleted")
        assert not os.path.isdir(graves) or not any(
            files for _, _, files in os.walk(graves))
    assert s2.tier(1).free_pool_files() == pool - 1  # "other" holds one
    assert read_all(s2.topic("other"), 0) == list(range(10))


def test_a_topic_created_again_under_its_name_is_a_new_incarnation(store_root, shm_dir):
    s = _store(store_root, shm_dir)
    old = _fill(s)
    written = old.write_chunks(make_batch(10**6, 10), partition=0)  # not committed yet
    Store.open(s.root).delete_topic("t")
    new = Store.open(s.root).create_topic("t", SCHEMA, partitions=2)
    assert new.id and new.id != old.id
    new.append(make_batch(0, 5), partition=0)
    again = "deleted and created again"
    if store_root.is_s3:  # a handle's reads may trust its look at _topic.json for a second
        time.sleep(1.2)
        again = r"was deleted and created again: .*/t/_topic.json names incarnation"
    # The old handle can neither read the new topic's log nor publish into it.
    with pytest.raises(TopicDeleted, match=again):
        old.refresh()
    with pytest.raises(TopicDeleted):
        old.append(make_batch(0, 1), partition=0)
    # Chunks written to the old incarnation never become records of the new one.
    fresh = Store.open(s.root).topic("t")
    with pytest.raises(CommitConflict, match="deleted"):
        fresh.commit(written)
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(5))
    # A store handle that cached the old topic hands out the new one.
    assert s.topic("t").id == new.id


def test_a_plan_of_a_deleted_topic_never_reads_the_new_one(store_root, shm_dir):
    from tier_store import execute
    s = _store(store_root, shm_dir)
    t = _fill(s)
    plan = t.plan_read(0, 0)
    s.delete_topic("t")
    again = Store.open(s.root).create_topic("t", SCHEMA, partitions=2)
    for i in range(30):  # same name, same offsets and files, other records
        again.append(make_batch(10**6 + i * 200, 200), partition=i % 2)
    # Its segment files have the old paths: a chunk that does not match where the plan put
    # it makes the read plan again, and the new incarnation is refused.
    with pytest.raises(TopicDeleted, match="deleted and created again"):
        list(execute(plan))
    # Trusting the bytes, the plan would read the new records: that is what verify=False
    # risks (documented), never the default.
    # Files gone since the plan: it is planned again, and the new incarnation is refused.
    s.delete_topic("t")
    Store.open(s.root).create_topic("t", SCHEMA, partitions=2).append(make_batch(0, 1),
                                                                      partition=1)
    with pytest.raises(TopicDeleted, match="deleted and created again"):
        list(execute(plan))


READER = textwrap.dedent("""
    import sys, time
    from tier_store import MAPS, Store
    MAPS.copy_bytes = 0  # a mapping (a pin) however small the read
    held = list(Store.open(sys.argv[1]).topic("t").read(0, 0))
    print("mapped", flush=True)
    time.sleep(600)
""")


def test_files_a_reader_pins_are_reclaimed_by_the_service_once_it_lets_go(store_root, shm_dir):
    s = _store(store_root, shm_dir)
    _fill(s)
    pool = s.tier(1).pool_size
    reader = subprocess.Popen([PYTHON, "-c", READER, str(s.root)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "mapped"
        pinned = s.delete_topic("t")
        assert pinned > 0
        assert s.tier(1).free_pool_files() < pool
        os.kill(reader.pid, signal.SIGKILL)
        reader.wait(30)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(30)
    MigrationService(s).run_once()
    assert s.tier(1).free_pool_files() == pool
    assert s.reclaim_deleted() == 0


def test_idle_topic_retention_runs_through_pafka_migrate_once(store_root):
    s = store_root.open({"log.segment.bytes": "64k"})
    # Retention must not start while the appends run: a commit on S3 takes tens of ms, and
    # on a loaded machine 30 of them took over a second.
    retention = 3.0 if store_root.is_s3 else 1.0
    t = s.create_topic("t", SCHEMA, partitions=1,
                       config={"log.retention.ms": int(retention * 1000)})
    for i in range(10):
        t.append(make_batch(i * 600, 600))
    assert len(t.segments()) > 2 and t.earliest_offsets() == {0: 0}
    time.sleep(retention + 0.2)  # everything expires; nothing is committed from here on
    r = _pafka("migrate", str(s.root))
    assert r.returncode == 0, r.stderr
    assert re.search(r"retention deleted \d+ segments", r.stdout), r.stdout
    after = Store.open(s.root).topic("t")
    assert after.earliest_offsets()[0] > 0
    assert len(after.segments()) == 1  # the newest is kept (it may be the active one)

