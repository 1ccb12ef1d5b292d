"""Placement: a new segment goes to the first local tier with room; a tier whose filesystem
answers ENOSPC counts as full until space returns; REMOTE never takes appends; when no local
tier has room, StoreFull names every tier and says to run the migration service."""

import subprocess

import pytest

from tier_store import Store, StoreFull

from .conftest import SCHEMA, make_batch, read_all


@pytest.fixture
def small_fs(tmp_path):
    """Two tiny tmpfs mounts (real ENOSPC), unmounted afterwards."""
    made = []
    for name, size in (("a", "1m"), ("b", "1m")):
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            for m in made:
                subprocess.run(["umount", "-l", str(m)])
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        made.append(d)
    yield made
    for m in made:
        subprocess.run(["umount", "-l", str(m)])


def _store(tmp_path, first, second, **extra):
    return Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
        "storage.tiers.first.paths": str(first / "t1"), "storage.tiers.first.sizes": "1g",
        "storage.tiers.second.paths": str(second), "storage.tiers.second.sizes": "1g",
        "log.segment.bytes": "64k", "log.cleanup.grace.ms": 0, **extra})


def test_a_full_filesystem_sends_new_segments_to_the_next_local_tier_until_space_returns(
        tmp_path, small_fs):
    s = _store(tmp_path, small_fs[0], tmp_path / "t2")
    t = s.create_topic("t", SCHEMA, partitions=1)
    for i in range(60):  # ~2.6 MB into a 1 MB filesystem whose tier claims 1 GiB
        t.append(make_batch(i * 2000, 2000))
    tiers = {x.tier for x in t.segments()}
    assert tiers == {1, 2}
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(120_000))
    # Space returns (its segments move down): new segments go to tier 1 again.
    for x in t.segments():
        if x.tier == 1 and x.sealed:
            s.move_segment(x.id, 2, topic="t")
    s.collect_garbage(t)
    while t.segments()[-1].tier != 1:
        t.append(make_batch(10**6, 200))
        assert len(t.segments()) < 200
    assert read_all(Store.open(s.root).topic("t"), 0)[:120_000] == list(range(120_000))


def test_when_every_local_tier_is_full_store_full_names_each_tier_and_the_migration(
        tmp_path, small_fs):
    s = _store(tmp_path, small_fs[0], small_fs[1])
    t = s.create_topic("t", SCHEMA, partitions=1)
    with pytest.raises(StoreFull) as e:
        for i in range(400):
            t.append(make_batch(i * 2000, 2000))
    msg = str(e.value)
    assert "tier 1 (NVME" in msg and "tier 2 (HDD" in msg
    assert "filesystem is full" in msg and "pafka migrate" in msg
    # Everything acknowledged before is still there, exactly once.
    n = t.latest_offsets()[0]
    assert n > 0 and read_all(Store.open(s.root).topic("t"), 0) == list(range(n))


def test_a_remote_tier_never_takes_appends_and_store_full_says_so(tmp_path):
    s = Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,REMOTE",
        "storage.tiers.first.paths": str(tmp_path / "t1"), "storage.tiers.first.sizes": "256k",
        "storage.tiers.second.paths": f"memory://{tmp_path.name}-remote",
        "log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=1)
    with pytest.raises(StoreFull, match="remote .*migration service only.*pafka migrate"):
        for i in range(100):
            t.append(make_batch(i * 200, 200))
    assert {x.tier for x in t.segments()} == {1}
