"""A store is a directory: moved or copied with ``mv``/``cp -r``, it opens where it lands;
a copy never writes into the tier directories of the store it was copied from."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tier_store import ChunkRef, ConfigError, DataLoss, Store, TierRelocated, relocate_tier
from tier_store.commit_log import CommitLog
from tier_store.entries import PositionEntry
from tier_store.layout import log_dir

from .conftest import ROOT, SCHEMA, make_batch, read_all
from .support import pmem_hdd_config


def _fill(root, config=None, rows=(0, 10)):
    with Store.open(root, config) as s:
        t = s.topic("t") if s.has_topic("t") else s.create_topic("t", SCHEMA, partitions=2)
        t.append(make_batch(*rows), partition=0)


def test_tier_paths_inside_the_root_are_saved_relative_to_it(tmp_path):
    root = tmp_path / "store"
    _fill(root, {"storage.tiers.first.paths": str(root / "fast")})
    saved = json.loads((root / "_store.json").read_text())
    assert saved["layout"]["tier.paths"] == ["fast"]
    assert saved["config"]["storage.tiers.first.paths"] == "fast"
    assert Store.open(root).tiers[0].path == str(root / "fast")


@pytest.mark.parametrize("explicit", [False, True])
def test_a_moved_store_opens_where_it_lands(tmp_path, explicit):
    conf = {"storage.tiers.first.paths": str(tmp_path / "a" / "fast")} if explicit else None
    _fill(tmp_path / "a", conf)
    os.rename(tmp_path / "a", tmp_path / "b")
    with Store.open(tmp_path / "b") as s:
        assert s.tiers[0].path.startswith(str(tmp_path / "b"))
        assert read_all(s.topic("t"), 0) == list(range(10))
    _fill(tmp_path / "b", rows=(10, 5))
    with Store.open(tmp_path / "b") as s:
        assert read_all(s.topic("t"), 0) == list(range(15))


@pytest.mark.parametrize("explicit", [False, True])
def test_a_copied_store_is_independent_of_its_original(tmp_path, explicit):
    # Before, the copy either failed to open (default tier path, saved absolute) or, with an
    # explicit tier path inside the root, wrote its segments into the original's tier.
    conf = {"storage.tiers.first.paths": str(tmp_path / "a" / "fast")} if explicit else None
    _fill(tmp_path / "a", conf)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    before = _contents(tmp_path / "a")
    for i in range(3):
        _fill(tmp_path / "b", rows=(100 + 10 * i, 10))
    assert _contents(tmp_path / "a") == before
    with Store.open(tmp_path / "a") as a:
        assert read_all(a.topic("t"), 0) == list(range(10))
    shutil.rmtree(tmp_path / "a")
    with Store.open(tmp_path / "b") as b:
        assert read_all(b.topic("t"), 0) == list(range(10)) + list(range(100, 130))
        assert all(r.ok for r in b.check())


def _contents(root):
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            with open(os.path.join(d, f), "rb") as fh:
                out[os.path.relpath(os.path.join(d, f), root)] = fh.read()
    return out


def test_relative_tier_paths_given_are_relative_to_the_working_directory(tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fill("store", {"storage.tiers.first.paths": "elsewhere/fast"})
    saved = json.loads((tmp_path / "store" / "_store.json").read_text())
    assert saved["layout"]["tier.paths"] == [str(tmp_path / "elsewhere" / "fast")]
    monkeypatch.chdir(tmp_path / "elsewhere")  # another working directory: same store
    with Store.open(tmp_path / "store") as s:
        assert s.tiers[0].path == str(tmp_path / "elsewhere" / "fast")
        assert read_all(s.topic("t"), 0) == list(range(10))


def _outside(tmp_path, shm_dir):
    return pmem_hdd_config(shm_dir)


def test_a_copy_of_a_store_with_a_tier_outside_its_root_is_refused(tmp_path, shm_dir):
    _fill(tmp_path / "a", _outside(tmp_path, shm_dir))
    owner = json.loads(Path(shm_dir, "_pafka_store").read_text())
    assert owner["root"] == str(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    with pytest.raises(ConfigError, match=(
            f"tier 1 directory {shm_dir} belongs to the store at {tmp_path / 'a'} .* the "
            f"store at {tmp_path / 'b'} is a copy of that store")):
        Store.open(tmp_path / "b")
    # The original is untouched and still opens, through a symlink too.
    os.symlink(tmp_path / "a", tmp_path / "link")
    for root in (tmp_path / "a", tmp_path / "link"):
        with Store.open(root) as s:
            assert read_all(s.topic("t"), 0) == list(range(10))
    # Once the original is gone, the copy is the store (as after a move).
    shutil.rmtree(tmp_path / "a")
    _fill(tmp_path / "b", rows=(10, 5))
    with Store.open(tmp_path / "b") as s:
        assert read_all(s.topic("t"), 0) == list(range(15))


def test_two_stores_given_one_tier_directory_are_refused(tmp_path, shm_dir):
    conf = _outside(tmp_path, shm_dir)
    _fill(tmp_path / "a", conf)
    with pytest.raises(ConfigError, match=f"the store at {tmp_path / 'b'} is another store"):
        Store.open(tmp_path / "b", conf)
    assert not (tmp_path / "b" / "_store.json").exists()  # refused before it was saved
    # A new store made where a deleted one was: the tier still holds the old store's
    # segments (it may have been moved, not deleted), so it is refused until emptied.
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(ConfigError, match="holds segments of the store that was at .* "
                                          "move the directory aside"):
        Store.open(tmp_path / "a", conf)
    for name in os.listdir(shm_dir):
        if name not in ("_pool", "_pafka_store"):
            shutil.rmtree(os.path.join(shm_dir, name))
    _fill(tmp_path / "a", conf)
    owner = json.loads(Path(shm_dir, "_pafka_store").read_text())
    saved = json.loads((tmp_path / "a" / "_store.json").read_text())
    assert owner == {"store": saved["id"], "root": str(tmp_path / "a"),
                     "host": socket.gethostname()}


def test_a_damaged_store_file_is_named(tmp_path):
    (tmp_path / "_store.json").write_text('{"format": 1, "config": {}, "layout": {}}')
    with pytest.raises(ConfigError, match=f"{tmp_path / '_store.json'} is damaged"):
        Store.open(tmp_path)


def test_an_unreadable_tier_claim_is_written_again(tmp_path, shm_dir):
    _fill(tmp_path / "a", _outside(tmp_path, shm_dir))
    marker = Path(shm_dir, "_pafka_store")
    marker.write_text("{torn")
    with Store.open(tmp_path / "a") as s:
        assert read_all(s.topic("t"), 0) == list(range(10))
    assert json.loads(marker.read_text())["root"] == str(tmp_path / "a")


def test_a_moved_store_takes_its_outside_tier_along_and_a_new_store_cannot_take_it(
        tmp_path, shm_dir):
    conf = _outside(tmp_path, shm_dir)
    _fill(tmp_path / "a", conf)
    os.rename(tmp_path / "a", tmp_path / "b")
    # A new store at the old root, before the moved one is opened: refused (the tier holds
    # the moved store's segments), where it used to take the tier over and reuse them.
    with pytest.raises(ConfigError, match="holds segments of the store that was at"):
        Store.open(tmp_path / "a", conf)
    with Store.open(tmp_path / "b") as s:
        assert read_all(s.topic("t"), 0) == list(range(10))
    assert json.loads(Path(shm_dir, "_pafka_store").read_text())["root"] == str(tmp_path / "b")
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(ConfigError, match="is another store"):
        Store.open(tmp_path / "a", conf)


def test_a_symlinked_tier_inside_the_root_is_claimed(tmp_path, shm_dir):
    (tmp_path / "a").mkdir()
    os.symlink(shm_dir, tmp_path / "a" / "fast")
    conf = {**_outside(tmp_path, shm_dir),
            "storage.tiers.first.paths": str(tmp_path / "a" / "fast")}
    _fill(tmp_path / "a", conf)
    assert Path(shm_dir, "_pafka_store").exists()
    shutil.copytree(tmp_path / "a", tmp_path / "b", symlinks=True)  # as cp -r does
    with pytest.raises(ConfigError, match="is a copy of that store"):
        Store.open(tmp_path / "b")


# -- relocate_tier: a tier's directory moved or copied ------------------------------------------
def _pmem_at(path):
    return {**_outside(None, str(path)), "storage.tiers.first.sizes": "4m"}


def _fill_many(root, config=None, start=0, n=3000):
    """Several segments' worth (64 KiB segments) on tier 1, in partition 0."""
    with Store.open(root, config) as s:
        t = s.topic("t") if s.has_topic("t") else s.create_topic("t", SCHEMA, partitions=2)
        for i in range(start, start + n, 300):
            t.append(make_batch(i, 300), partition=0)
        return len([x for x in t.segments() if x.tier == 1])


def _pmem_store(tmp_path, shm_dir, copy_root=False):
    """A store at tmp_path/a whose pmem tier 1 lies outside it, at shm_dir/a, filled with
    3,000 records over several segments; with ``copy_root``, its root copied to tmp_path/b."""
    a_tier = Path(shm_dir, "a")
    segments = _fill_many(tmp_path / "a", _pmem_at(a_tier))
    if copy_root:
        shutil.copytree(tmp_path / "a", tmp_path / "b")
    return a_tier, segments


def test_a_copy_with_copies_of_its_outside_tiers_is_relocated_and_independent(tmp_path,
                                                                             shm_dir):
    a_tier, segments = _pmem_store(tmp_path, shm_dir, copy_root=True)
    b_tier = Path(shm_dir, "b")
    assert segments >= 2
    shutil.copytree(a_tier, b_tier)
    with pytest.raises(ConfigError, match=f"pafka relocate {tmp_path / 'b'} 1 DIR"):
        Store.open(tmp_path / "b")
    r = relocate_tier(tmp_path / "b", 1, str(b_tier))
    assert (r.tier, r.old_path, r.new_path, r.segments) == (1, str(a_tier), str(b_tier),
                                                            segments)
    assert json.loads((b_tier / "_pafka_store").read_text())["root"] == str(tmp_path / "b")
    assert json.loads((a_tier / "_pafka_store").read_text())["root"] == str(tmp_path / "a")
    saved = json.loads((tmp_path / "b" / "_store.json").read_text())
    assert saved["layout"]["tier.paths"][0] == str(b_tier)
    assert saved["config"]["storage.tiers.first.paths"] == str(b_tier)
    before = _contents(a_tier)
    _fill_many(tmp_path / "b", start=3000, n=1500)
    assert _contents(a_tier) == before
    with Store.open(tmp_path / "a") as a, Store.open(tmp_path / "b") as b:
        assert read_all(a.topic("t"), 0) == list(range(3000))
        assert read_all(b.topic("t"), 0) == list(range(4500))
        assert all(x.ok for x in a.check()) and all(x.ok for x in b.check())
        assert b.tiers[0].path == str(b_tier)


def test_a_moved_tier_directory_is_relocated_and_can_come_into_the_root(tmp_path):
    conf = {"storage.tiers.first.paths": str(tmp_path / "disk1"), "log.segment.bytes": "64k"}
    _fill_many(tmp_path / "s", conf)
    os.rename(tmp_path / "disk1", tmp_path / "disk2")
    with pytest.raises(ConfigError, match=f"pafka relocate {tmp_path / 's'} 1 "):
        Store.open(tmp_path / "s", {"storage.tiers.first.paths": str(tmp_path / "disk2")})
    relocate_tier(tmp_path / "s", 1, str(tmp_path / "disk2"))
    _fill_many(tmp_path / "s", start=3000, n=600)
    with Store.open(tmp_path / "s") as s:
        assert read_all(s.topic("t"), 0) == list(range(3600))
    # Into the root: saved relative, so the root moves with it; no claim file inside.
    os.rename(tmp_path / "disk2", tmp_path / "s" / "fast")
    r = relocate_tier(tmp_path / "s", 1, str(tmp_path / "s" / "fast"))
    assert r.old_path == str(tmp_path / "disk2")
    assert json.loads((tmp_path / "s" / "_store.json").read_text())["layout"]["tier.paths"] \
        == ["fast"]
    assert not (tmp_path / "s" / "fast" / "_pafka_store").exists()
    os.rename(tmp_path / "s", tmp_path / "moved")
    with Store.open(tmp_path / "moved") as s:
        assert read_all(s.topic("t"), 0) == list(range(3600))


def test_a_relocation_that_would_lose_data_changes_nothing(tmp_path, shm_dir):
    a_tier, _ = _pmem_store(tmp_path, shm_dir, copy_root=True)
    store_file = (tmp_path / "b" / "_store.json").read_bytes()

    def refused(tier, path, match):
        with pytest.raises(ConfigError, match=match):
            relocate_tier(tmp_path / "b", tier, str(path))
        assert (tmp_path / "b" / "_store.json").read_bytes() == store_file

    refused(1, Path(shm_dir, "nowhere"), "no such directory; move or copy tier 1's directory")
    Path(shm_dir, "empty").mkdir()
    refused(1, Path(shm_dir, "empty"), r"does not hold tier 1's segments: of \d+, \d+ missing")
    assert not Path(shm_dir, "empty", "_pafka_store").exists()
    # A copy taken while a writer was still appending: a segment shorter than its chunks.
    shutil.copytree(a_tier, Path(shm_dir, "b"))
    seg = next(Path(shm_dir, "b", "t", "0").iterdir())
    os.truncate(seg, 100)
    refused(1, Path(shm_dir, "b"), "1 shorter than their committed chunks")
    refused(3, Path(shm_dir, "b"), r"tier 3: the store at .* has tiers 1..2 \(PMEM, HDD\)")
    refused(1, "file:///x", "tier 1 is PMEM, so its path is a local directory")
    refused(1, tmp_path / "b" / "tier-2", "is the store's tier 2")
    refused(1, tmp_path / "b", "is the store's root")
    # The original's own tier directory (it holds every segment, but another store uses it).
    shutil.rmtree(Path(shm_dir, "b"))
    shutil.copytree(a_tier, Path(shm_dir, "b"))
    relocate_tier(tmp_path / "b", 1, str(Path(shm_dir, "b")))
    with pytest.raises(ConfigError, match=f"is a tier of the store at {tmp_path / 'b'}"):
        relocate_tier(tmp_path / "a", 1, str(Path(shm_dir, "b")))
    with Store.open(tmp_path / "a") as a:
        assert read_all(a.topic("t"), 0) == list(range(3000))


def test_a_remote_tier_is_relocated_to_a_copy_of_its_bucket(tmp_path):
    url = f"file://{tmp_path}/bucket"
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,REMOTE",
            "storage.tiers.first.sizes": "1m", "storage.tiers.second.paths": url,
            "log.segment.bytes": "64k"}
    with Store.open(tmp_path / "s", conf) as s:
        t = s.create_topic("t", SCHEMA)
        for i in range(0, 6000, 300):
            t.append(make_batch(i, 300))
        moved = [x for x in t.segments() if x.sealed][:3]
        for x in moved:
            s.move_segment(x.id, 2, topic="t")
    assert len(moved) >= 2
    with pytest.raises(ConfigError, match="its path is an fsspec URL"):
        relocate_tier(tmp_path / "s", 2, str(tmp_path / "bucket2"))
    with pytest.raises(ConfigError, match=f"of {len(moved)}, {len(moved)} missing"):
        relocate_tier(tmp_path / "s", 2, f"file://{tmp_path}/bucket2")
    shutil.copytree(tmp_path / "bucket", tmp_path / "bucket2")
    shutil.rmtree(tmp_path / "bucket")
    assert relocate_tier(tmp_path / "s", 2, f"file://{tmp_path}/bucket2").segments == len(moved)
    with Store.open(tmp_path / "s") as s:
        assert read_all(s.topic("t"), 0) == list(range(6000))
        assert s.tiers[1].path == f"file://{tmp_path}/bucket2"


def test_relocation_refuses_places_that_overlap_a_store(tmp_path, shm_dir, monkeypatch):
    a_tier, _ = _pmem_store(tmp_path, shm_dir, copy_root=True)
    shutil.copytree(a_tier, Path(shm_dir, "b"))
    store_file = (tmp_path / "b" / "_store.json").read_bytes()

    def refused(tier, path, match):
        with pytest.raises(ConfigError, match=match):
            relocate_tier(tmp_path / "b", tier, str(path))
        assert (tmp_path / "b" / "_store.json").read_bytes() == store_file

    # Tier 2 has no committed segments, so any directory holds them all: what guards it is
    # where the directory lies. Another store's tier in its root has no claim file.
    refused(2, tmp_path / "a" / "tier-2", f"lies in the store at {tmp_path / 'a'}")
    refused(2, tmp_path / "a" / "t", f"lies in the store at {tmp_path / 'a'}")
    (tmp_path / "b" / "t" / "x").mkdir()
    refused(2, tmp_path / "b" / "t" / "x", "lies in the directory of topic 't'")
    refused(2, tmp_path, "is the store's root or holds it")
    Path(shm_dir, "b", "sub").mkdir()
    refused(2, Path(shm_dir, "b", "sub"), f"lies in the tier directory {shm_dir}/b ")
    (tmp_path / "b" / "tier-2" / "deeper").mkdir()
    refused(1, tmp_path / "b" / "tier-2" / "deeper", "overlaps the store's tier 2")
    refused(1, f"{shm_dir}/b,2", "storage.tiers.first.paths.*comma")
    refused(1, "  ", "the new path of tier 1 is empty")
    # Through a symlink, and as a relative path (against the working directory).
    os.symlink(Path(shm_dir, "b"), tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    assert relocate_tier(tmp_path / "b", 1, "link").new_path == str(tmp_path / "link")
    with Store.open(tmp_path / "b") as b:
        assert read_all(b.topic("t"), 0) == list(range(3000))


def test_relocation_checks_each_segment_s_header_and_last_chunk(tmp_path, shm_dir):
    # A pmem segment is a pool file of full size whatever it holds, so its length says
    # nothing about a copy taken too early: its header and last chunk do.
    a_tier, _ = _pmem_store(tmp_path, shm_dir, copy_root=True)
    with Store.open(tmp_path / "a") as a:
        segs = sorted((x for x in a.topic("t").state().segments.values()
                       if x.tier == 1 and x.partition == 0), key=lambda x: x.seq)
        paths = [a.tier(1).segment_path("t", 0, x.seq) for x in segs]
    assert len(segs) >= 2
    copy = Path(shm_dir, "b")
    shutil.copytree(a_tier, copy)
    first = copy / os.path.relpath(paths[0], a_tier)
    second = copy / os.path.relpath(paths[1], a_tier)
    saved = first.read_bytes()
    with open(first, "r+b") as f:  # the last committed chunk's bytes are not all there
        f.seek(segs[0].extent - 10)
        f.write(b"\0" * 10)
    with pytest.raises(ConfigError, match="1 whose last committed chunk does not match"):
        relocate_tier(tmp_path / "b", 1, str(copy))
    first.write_bytes(saved)
    shutil.copyfile(first, second)
    with pytest.raises(ConfigError, match="1 of another segment .*its header says partition 0"):
        relocate_tier(tmp_path / "b", 1, str(copy))


def test_a_commit_during_a_relocation_waits_for_it_and_is_then_refused(tmp_path):
    conf = {"storage.tiers.first.paths": str(tmp_path / "disk1"), "log.segment.bytes": "64k"}
    _fill_many(tmp_path / "s", conf)
    writer = Store.open(tmp_path / "s").topic("t")
    writer.append(make_batch(2990, 10), partition=0)  # this handle has committed before
    before = writer.latest_offsets()
    shutil.copytree(tmp_path / "disk1", tmp_path / "disk2")  # copied with a writer running
    outcome: dict = {}

    def append():
        try:
            writer.append(make_batch(3000, 10), partition=1)  # chunk into disk1, then commit
            outcome["ok"] = True
        except TierRelocated as e:
            outcome["error"] = str(e)

    thread = threading.Thread(target=append)
    calls = []

    def progress(n):
        if not calls:
            thread.start()
            time.sleep(0.5)
            outcome["during"] = dict(outcome)  # the commit waits on _tiers.lock
        calls.append(n)

    relocate_tier(tmp_path / "s", 1, str(tmp_path / "disk2"), progress=progress)
    thread.join(30)
    assert outcome["during"] == {}
    assert "tier 1 of the store" in outcome["error"] and "was relocated (to" in outcome["error"]
    writer.set_position("g", {0: 1})  # entries that name no written data still go in
    writer.store.close()
    with Store.open(tmp_path / "s") as s:  # the refused chunk stays invisible
        t = s.topic("t")
        assert t.latest_offsets() == before
        t.append(make_batch(3000, 10), partition=1)  # reopened: written to the new place
        (seg,) = [x for x in t.segments() if x.partition == 1]
        assert seg.path.startswith(str(tmp_path / "disk2"))
        assert read_all(t, 1) == list(range(3000, 3010))


def test_chunks_written_to_the_old_place_are_refused_by_any_handle(tmp_path):
    """As in Spark: executors write chunks, the driver commits them through its own handle,
    opened after the relocation."""
    conf = {"storage.tiers.first.paths": str(tmp_path / "disk1"), "log.segment.bytes": "64k"}
    _fill_many(tmp_path / "s", conf)
    shutil.copytree(tmp_path / "disk1", tmp_path / "disk2")
    with Store.open(tmp_path / "s") as executor:  # still running after the copy
        refs = executor.topic("t").write_chunks(make_batch(3000, 10), partition=0)
    assert refs[0].relocation == 0
    relocate_tier(tmp_path / "s", 1, str(tmp_path / "disk2"))
    # The old place made to resolve to the new one: what counts is the relocation.
    os.rename(tmp_path / "disk1", tmp_path / "disk1.old")
    os.symlink(tmp_path / "disk2", tmp_path / "disk1")
    with Store.open(tmp_path / "s") as driver:
        t = driver.topic("t")
        before = t.latest_offsets()
        for stale in (refs, [replace(r, relocation=None) for r in refs]):  # None: not recorded
            with pytest.raises(TierRelocated, match=r"tier 1 of the store .* was relocated "
                                                  r"\(to .*disk2\) after data was written"):
                t.commit([ChunkRef.from_dict(r.to_dict()) for r in stale])
        assert t.latest_offsets() == before
        t.set_position("g", {0: 1})  # entries naming no written data go in
        fresh = t.write_chunks(make_batch(3000, 10), partition=0)
        assert fresh[0].relocation == 1
        t.commit(fresh)
        assert read_all(t, 0)[-10:] == list(range(3000, 3010))
    # Back to the first place: data written under either earlier count stays out.
    shutil.rmtree(tmp_path / "disk1.old")
    os.unlink(tmp_path / "disk1")
    shutil.copytree(tmp_path / "disk2", tmp_path / "disk1")
    relocate_tier(tmp_path / "s", 1, str(tmp_path / "disk1"))
    with Store.open(tmp_path / "s") as s, pytest.raises(TierRelocated, match="was relocated"):
        s.topic("t").commit(refs)


def test_a_relocation_refuses_entries_published_without_the_stores_lock(tmp_path):
    """A writer of a release that publishes without the store's lock: a commit during the
    check still makes the relocation refuse, and nothing changes."""
    conf = {"storage.tiers.first.paths": str(tmp_path / "disk1"), "log.segment.bytes": "64k"}
    _fill_many(tmp_path / "s", conf)
    shutil.copytree(tmp_path / "disk1", tmp_path / "disk2")
    store_file = (tmp_path / "s" / "_store.json").read_bytes()
    log = CommitLog(log_dir(str(tmp_path / "s"), "t"), "t")
    calls = []

    def progress(n):
        if not calls:
            st = log.load()
            assert log.publish(st.version + 1, PositionEntry(st.last_ts, "g", {"0": 0}))
        calls.append(n)

    with pytest.raises(ConfigError, match="topic 't' committed while tier 1 was being checked"):
        relocate_tier(tmp_path / "s", 1, str(tmp_path / "disk2"), progress=progress)
    assert (tmp_path / "s" / "_store.json").read_bytes() == store_file


def test_an_open_after_a_tier_moved_names_relocate_and_makes_nothing(tmp_path, shm_dir):
    a_tier, _ = _pmem_store(tmp_path, shm_dir)
    os.rename(a_tier, Path(shm_dir, "b"))
    # It used to make the directory again and append there, splitting the tier in two.
    with pytest.raises(ConfigError, match=f"tier 1 directory {a_tier} of the store at "
                                          f".* is missing.*pafka relocate"):
        Store.open(tmp_path / "a")
    assert not a_tier.exists()
    relocate_tier(tmp_path / "a", 1, str(Path(shm_dir, "b")))
    _fill_many(tmp_path / "a", start=3000, n=300)
    with Store.open(tmp_path / "a") as s:
        assert read_all(s.topic("t"), 0) == list(range(3300))


def test_a_tier_inside_another_store_is_refused_when_a_store_is_created(tmp_path):
    # Another store's default tier has no claim file: it lies in that store's root.
    _fill(tmp_path / "a")
    for path in (tmp_path / "a" / "tier-1", tmp_path / "a", tmp_path / "a" / "x" / "y"):
        with pytest.raises(ConfigError, match=f"lies in the store at {tmp_path / 'a'}"):
            Store.open(tmp_path / "b", {"storage.tiers.first.paths": str(path)})
        assert not (tmp_path / "b" / "_store.json").exists()
    with Store.open(tmp_path / "a") as a:
        assert read_all(a.topic("t"), 0) == list(range(10))


def test_tiers_that_overlap_are_refused_when_a_store_is_created(tmp_path):
    def refused(paths, match):
        conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
                "storage.tiers.first.paths": str(paths[0]),
                "storage.tiers.second.paths": str(paths[1])}
        with pytest.raises(ConfigError, match=match):
            Store.open(tmp_path / "s", conf)
        assert not (tmp_path / "s" / "_store.json").exists()

    # Nested tiers were created, and every later open refused the inner one.
    refused((tmp_path / "t" / "inner", tmp_path / "t"), "overlap; each tier needs a place")
    refused((tmp_path / "t", tmp_path / "t" / "inner"), "overlap")
    refused((tmp_path / "t", tmp_path / "t"), "overlap")
    refused((tmp_path / "s", tmp_path / "t"), "is the store's root .* or holds it")
    refused((tmp_path, tmp_path / "t"), "is the store's root .* or holds it")


def test_a_tier_directory_the_store_was_not_made_with_is_refused(tmp_path, shm_dir):
    # An unmounted mount point is an empty directory: appending there would split the tier.
    a_tier, _ = _pmem_store(tmp_path, shm_dir)
    os.rename(a_tier, Path(shm_dir, "mounted"))
    a_tier.mkdir()
    with pytest.raises(ConfigError, match=f"tier 1 directory {a_tier} .* has no _pafka_store: "
                                          "it is not the directory"):
        Store.open(tmp_path / "a")
    assert os.listdir(a_tier) == []
    # Its data declared lost: an empty claim opens the store, and reads name the loss.
    (a_tier / "_pafka_store").touch()
    with Store.open(tmp_path / "a") as s, pytest.raises(DataLoss, match="missing"):
        read_all(s.topic("t"), 0)


def test_a_store_file_without_an_id_is_refused_naming_the_file(tmp_path, shm_dir):
    a_tier, _ = _pmem_store(tmp_path, shm_dir)
    saved = json.loads((tmp_path / "a" / "_store.json").read_text())
    del saved["id"]
    (tmp_path / "a" / "_store.json").write_text(json.dumps(saved))
    with pytest.raises(ConfigError, match=f"{tmp_path / 'a' / '_store.json'} is damaged: .*"
                                          "id is missing"):
        Store.open(tmp_path / "a")


def test_processes_creating_one_store_at_once_agree(tmp_path, shm_dir):
    # Each used to claim the tier against the other: one failed, naming its own root.
    code = textwrap.dedent("""
        import sys, time
        from tier_store import Store
        root, tier, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
        time.sleep(max(0.0, start - time.time()))
        s = Store.open(root, {"storage.tiers.first.paths": tier})
        print(s.id)
    """)
    for i in range(4):
        start = time.time() + 1.5
        procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"s{i}"),
                                   os.path.join(shm_dir, f"t{i}"), str(start)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=ROOT) for _ in range(3)]
        outs = [p.communicate(timeout=60) for p in procs]
        assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
        assert len({o[0].strip() for o in outs}) == 1


def test_a_store_s_own_claim_is_kept_when_the_host_is_renamed(tmp_path, shm_dir):
    # Containers get a new host name each: a claim is this store's by its root and id.
    a_tier, _ = _pmem_store(tmp_path, shm_dir)
    marker = a_tier / "_pafka_store"
    owner = json.loads(marker.read_text())
    marker.write_text(json.dumps({**owner, "host": "old-name"}))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from tier_store import Store
        print(Store.open({str(tmp_path / 'a')!r}).topic("t").latest_offsets())
    """)], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PAFKA_HOST_ID="pod-2"))
    assert r.returncode == 0, r.stderr
    assert json.loads(marker.read_text())["host"] == "pod-2"


def test_claims_above_a_tier_block_only_while_their_store_exists(tmp_path, shm_dir):
    # A store made later with a tier holding an older store's tier must not lock it out.
    _fill(tmp_path / "c", _pmem_at(Path(shm_dir, "x", "c-tier")))
    _fill(tmp_path / "d", _pmem_at(Path(shm_dir, "x")))
    with Store.open(tmp_path / "c") as c:
        assert read_all(c.topic("t"), 0) == list(range(10))
    # A stale claim above (its store is gone) blocks no new store.
    Path(shm_dir, "y").mkdir()
    Path(shm_dir, "y", "_pafka_store").write_text(
        json.dumps({"store": "gone", "root": str(tmp_path / "gone"), "host": socket.gethostname()}))
    _fill(tmp_path / "e", _pmem_at(Path(shm_dir, "y", "e-tier")))
    # A claim above whose store exists does.
    with pytest.raises(ConfigError, match=f"lies in the tier directory {shm_dir}/x "):
        Store.open(tmp_path / "f", _pmem_at(Path(shm_dir, "x", "f-tier")))


def test_a_claim_whose_store_cannot_be_read_is_not_taken_over(tmp_path, shm_dir):
    a_tier = Path(shm_dir, "a")
    with Store.open(tmp_path / "a", _pmem_at(a_tier)):
        pass  # a tier with no segments: an owner taken for gone would lose it silently
    claim = (a_tier / "_pafka_store").read_bytes()
    (tmp_path / "a" / "_store.json").write_text("{damaged")
    with pytest.raises(ConfigError, match=f"cannot tell whether the store at {tmp_path / 'a'} "
                                          "still exists"):
        Store.open(tmp_path / "z", _pmem_at(a_tier))
    assert (a_tier / "_pafka_store").read_bytes() == claim


def test_a_missing_tier_directory_in_the_root_with_no_segments_is_made(tmp_path):
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD"}
    _fill(tmp_path / "s", conf)  # every segment on tier 1
    os.rmdir(tmp_path / "s" / "tier-2")
    with Store.open(tmp_path / "s") as s:
        assert read_all(s.topic("t"), 0) == list(range(10))
    assert (tmp_path / "s" / "tier-2").is_dir()
    shutil.rmtree(tmp_path / "s" / "tier-1")
    with pytest.raises(ConfigError, match="tier-1 of the store at .* is missing"):
        Store.open(tmp_path / "s")


def test_a_claim_naming_no_host_is_never_taken_for_this_host_s(tmp_path, shm_dir):
    a_tier, _ = _pmem_store(tmp_path, shm_dir)
    marker = a_tier / "_pafka_store"
    marker.write_text(json.dumps({"store": "0" * 32, "root": str(tmp_path / "gone")}))
    with pytest.raises(ConfigError, match="which cannot be checked from host"):
        Store.open(tmp_path / "a")
    assert json.loads(marker.read_text())["store"] == "0" * 32
