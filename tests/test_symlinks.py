"""Symbolic links on tiers: the store never writes, renames or deletes through one
(issue #20, point 6). Reads already refuse links (tests/test_pins.py)."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil

import pytest

from tier_store import CorruptSegment, Store
from tier_store.maintenance.garbage import collect_garbage

from .conftest import SCHEMA, make_batch, read_all
from .support import pmem_hdd_config


def _digest(d: str) -> dict[str, str]:
    """Path -> md5 of every regular file under ``d``."""
    out = {}
    for dp, _dirs, files in os.walk(d):
        for f in files:
            p = os.path.join(dp, f)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as fh:
                    out[p] = hashlib.md5(fh.read()).hexdigest()
    return out


def _conf(kind: str, shm_dir: str) -> dict:
    if kind == "pmem":
        return pmem_hdd_config(shm_dir, **{"log.cleanup.grace.ms": 0})
    return {"log.segment.bytes": "64k", "log.cleanup.grace.ms": 0}


def _topic_with_a_segment(tmp_path, shm_dir, kind):
    store = Store.open(tmp_path / "store", _conf(kind, shm_dir))
    t = store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)
    seq, tier = t.active_segment(0)
    path = store.tier(tier).segment_path("t", 0, seq)
    store.close()
    return path


@pytest.mark.parametrize("kind", ["file", "pmem"])
def test_a_link_in_place_of_the_active_segment_is_never_written_through(kind, tmp_path,
                                                                          shm_dir):
    # Before: five appends succeeded, written into another store's live segment.
    other = Store.open(tmp_path / "other", {"log.segment.bytes": "64k"})
    ot = other.create_topic("t", SCHEMA, partitions=1)
    ot.append(make_batch(0, 50), partition=0)
    victim = other.tier(1).segment_path("t", 0, ot.active_segment(0)[0])
    before = _digest(str(tmp_path / "other"))
    path = _topic_with_a_segment(tmp_path, shm_dir, kind)
    os.unlink(path)
    os.symlink(victim, path)
    t = Store.open(tmp_path / "store", _conf(kind, shm_dir)).topic("t")
    for i in range(5):
        with pytest.raises(CorruptSegment, match=f"{path} is a symbolic link"):
            t.append(make_batch(100 + i, 1), partition=0)
    assert _digest(str(tmp_path / "other")) == before
    assert os.readlink(path) == victim
    assert read_all(ot, 0) == list(range(50))


@pytest.mark.parametrize("kind", ["file", "pmem"])
@pytest.mark.parametrize("level", ["topic", "partition"])
def test_a_linked_topic_or_partition_directory_on_a_tier_is_refused(kind, level, tmp_path,
                                                                    shm_dir):
    # O_NOFOLLOW guards only the last component: each directory is opened on its own.
    path = _topic_with_a_segment(tmp_path, shm_dir, kind)
    pdir = os.path.dirname(path)
    linked = os.path.dirname(pdir) if level == "topic" else pdir
    outside = str(tmp_path / "outside")
    shutil.move(linked, outside)
    os.symlink(outside, linked)
    before = _digest(outside)
    t = Store.open(tmp_path / "store", _conf(kind, shm_dir)).topic("t")
    for i in range(5):
        with pytest.raises(CorruptSegment, match=f"{linked} is a symbolic link"):
            t.append(make_batch(100 + i, 1), partition=0)
    assert _digest(outside) == before


def test_garbage_collection_leaves_a_link_at_a_moved_segments_name_alone(tmp_path, shm_dir,
                                                                        caplog):
    # Before: the link was renamed into _pool/, and a later segment overwrote its target.
    store = Store.open(tmp_path / "store", _conf("pmem", shm_dir))
    t = store.create_topic("t", SCHEMA, partitions=1)
    for i in range(12):
        t.append(make_batch(i * 1000, 1000), partition=0)
    first = t.segments()[0]
    store.move_segment(first.id, 2, topic="t")
    if os.path.lexists(first.path):
        os.unlink(first.path)
    precious = str(tmp_path / "precious.seg")
    with open(precious, "wb") as f:
        f.write(os.urandom(64 * 1024))
    before = _digest(precious)
    os.symlink(precious, first.path)
    with caplog.at_level(logging.WARNING):
        collect_garbage(t)
    assert os.readlink(first.path) == precious
    assert f"not releasing {first.path}" in caplog.text
    pool = os.path.join(shm_dir, "_pool")
    assert not any(os.path.islink(os.path.join(pool, n)) for n in os.listdir(pool))
    for i in range(40):  # takes every pool file there is
        t.append(make_batch(10**6 + i * 1000, 1000), partition=0)
    assert _digest(precious) == before


def test_releasing_to_the_pool_refuses_a_link_and_taking_skips_one_in_the_pool(tmp_path,
                                                                               shm_dir, caplog):
    store = Store.open(tmp_path / "store", _conf("pmem", shm_dir))
    tier = store.tier(1)
    target = str(tmp_path / "outside.pool")
    with open(target, "wb") as f:
        f.write(b"\0" * tier.segment_bytes)
    link = tier.segment_path("t", 0, 7)
    os.makedirs(os.path.dirname(link))
    os.symlink(target, link)
    with pytest.raises(CorruptSegment, match=f"{link} is a symbolic link"):
        tier.release_segment(link)
    assert os.readlink(link) == target
    # A link already in the pool (left there by an older release) is never taken.
    pool = os.path.join(shm_dir, "_pool")
    for name in os.listdir(pool):
        if name.endswith(".pool"):
            os.unlink(os.path.join(pool, name))
    os.symlink(target, os.path.join(pool, "000000.pool"))
    before = _digest(target)
    with caplog.at_level(logging.WARNING):
        assert tier.take_pool_file(tier.segment_path("t", 0, 8)) is None
    assert "is a symbolic link: left alone" in caplog.text
    assert os.path.islink(os.path.join(pool, "000000.pool"))
    assert _digest(target) == before


def test_garbage_collection_never_deletes_through_a_linked_topic_directory(tmp_path):
    # The link leads to another store's segments, which this topic's log does not name.
    other = Store.open(tmp_path / "other", {"log.segment.bytes": "64k"})
    ot = other.create_topic("t", SCHEMA, partitions=1)
    for i in range(40):
        ot.append(make_batch(i * 100, 100), partition=0)
    before = _digest(str(tmp_path / "other"))
    store = Store.open(tmp_path / "store", _conf("file", ""))
    t = store.create_topic("t", SCHEMA, partitions=1)
    tdir = os.path.join(store.tier(1).path, "t")
    os.symlink(os.path.join(other.tier(1).path, "t"), tdir)
    collect_garbage(t)
    after = _digest(str(tmp_path / "other"))
    assert {p: h for p, h in after.items() if p.endswith(".seg")} == \
        {p: h for p, h in before.items() if p.endswith(".seg")}
    assert read_all(ot, 0) == list(range(4000))


def test_a_linked_pool_directory_is_refused(tmp_path, shm_dir):
    Store.open(tmp_path / "store", _conf("pmem", shm_dir)).close()
    pool = os.path.join(shm_dir, "_pool")
    outside = str(tmp_path / "pool")
    shutil.move(pool, outside)
    os.symlink(outside, pool)
    before = _digest(outside)
    with pytest.raises(CorruptSegment, match=f"{pool} is a symbolic link"):
        Store.open(tmp_path / "store", _conf("pmem", shm_dir))
    assert _digest(outside) == before


def test_an_active_pointer_that_is_a_link_is_replaced_not_followed(tmp_path, caplog):
    store = Store.open(tmp_path / "store", _conf("file", ""))
    t = store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)
    ptr = os.path.join(store.root, "t", "_partitions", "0.active")
    target = str(tmp_path / "pointer.json")
    shutil.copy(ptr, target)
    os.unlink(ptr)
    os.symlink(target, ptr)
    before = _digest(target)
    store.close()
    t = Store.open(tmp_path / "store").topic("t")
    with caplog.at_level(logging.WARNING):
        t.append(make_batch(10, 10), partition=0)
    assert "is a symbolic link, not followed" in caplog.text
    assert not os.path.islink(ptr) and _digest(target) == before
    assert read_all(t, 0) == list(range(20))


def test_a_move_never_writes_through_a_linked_partition_directory_on_its_target(
        tmp_path, shm_dir):
    """A move's copy is created inside the target tier, never through a link leading out."""
    outside = tmp_path / "outside"
    outside.mkdir()
    store = Store.open(tmp_path / "store", pmem_hdd_config(shm_dir))
    t = store.create_topic("t", SCHEMA, partitions=1)
    n = 0
    while len(t.segments()) < 2:
        t.append(make_batch(n * 100, 100), partition=0)
        n += 1
    sealed = [s for s in t.segments() if s.sealed]
    tdir = os.path.join(store.tier(2).path, "t")
    os.makedirs(tdir, exist_ok=True)
    os.symlink(str(outside), os.path.join(tdir, "0"))
    with pytest.raises(CorruptSegment, match="link"):
        store.move_segment(sealed[0].id, 2, topic="t")
    assert os.listdir(outside) == []
    assert read_all(t, 0) == list(range(n * 100))
    store.close()
