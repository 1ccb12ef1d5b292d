"""A store is a directory: moved or copied with ``mv``/``cp -r``, it opens where it lands;
a copy never writes into the tier directories of the store it was copied from."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tier_store import ConfigError, Store, relocate_tier

from .conftest import SCHEMA, make_batch, read_all


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
    return {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
            "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
            "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0}


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
                                          "empty the directory"):
        Store.open(tmp_path / "a", conf)
    for name in os.listdir(shm_dir):
        if name not in ("_pool", "_pafka_store"):
            shutil.rmtree(os.path.join(shm_dir, name))
    _fill(tmp_path / "a", conf)
    owner = json.loads(Path(shm_dir, "_pafka_store").read_text())
    saved = json.loads((tmp_path / "a" / "_store.json").read_text())
    assert owner == {"store": saved["id"], "root": str(tmp_path / "a")}


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


def test_a_copy_with_copies_of_its_outside_tiers_is_relocated_and_independent(tmp_path,
                                                                             shm_dir):
    a_tier, b_tier = Path(shm_dir, "a"), Path(shm_dir, "b")
    segments = _fill_many(tmp_path / "a", _pmem_at(a_tier))
    assert segments >= 2
    shutil.copytree(tmp_path / "a", tmp_path / "b")
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
    a_tier = Path(shm_dir, "a")
    _fill_many(tmp_path / "a", _pmem_at(a_tier))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
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
    with pytest.raises(ConfigError, match=f"is a tier directory of the store at {tmp_path / 'b'}"):
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
