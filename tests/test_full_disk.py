"""Full disks: a tier's filesystem, a pmem pool's, the commit log's and a move's target
filling up, on real tmpfs mounts smaller than the tiers are configured for.

What must hold: every acknowledged record is read back once; a full tier counts as full
until space returns and the next local tier with room takes new segments; a pool its
filesystem cannot hold whole opens with the files it has; a full commit log is
:class:`StoreFull` naming its filesystem; nothing is left behind (no temporary file, no
half-made segment, no half-visible entry) and no bare ``OSError`` reaches a caller.
Appends run in a child process, so a crash (SIGBUS on a mapping) is counted, not fatal.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tier_store import Store, StoreFull

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import pafka

# Appends `n` batches of `per` rows (keys i*per ...) to topic "t" partition 0, created if
# missing; prints what was acknowledged and what each failure was.
APPEND_CHILD = r"""
import json, sys
from collections import Counter
from tier_store import PafkaError, Store
from tests.conftest import SCHEMA, make_batch
root, conf, first, n, per = json.loads(sys.argv[1])
s = Store.open(root, conf)
t = s.topic("t") if s.has_topic("t") else s.create_topic("t", SCHEMA, partitions=1)
acked, errors, bare = [], Counter(), []
for i in range(first, first + n):
    try:
        t.append(make_batch(i * per, per), partition=0)
        acked.append(i)
    except PafkaError as e:
        errors[type(e).__name__] += 1
    except Exception as e:
        bare.append(f"{type(e).__name__}: {e}")
s.close()
print(json.dumps({"acked": acked, "errors": errors, "bare": bare}))
"""


def run_appends(root: str, conf: dict, first: int, n: int, per: int) -> dict:
    """Run :data:`APPEND_CHILD`; fail on a crash (a signal) naming it."""
    r = subprocess.run([PYTHON, "-c", APPEND_CHILD, json.dumps([root, conf, first, n, per])],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"appending process died (rc {r.returncode}): {r.stderr[-2000:]}"
    return json.loads(r.stdout.splitlines()[-1])


def expected_keys(acked: list[int], per: int) -> list[int]:
    return [k for i in acked for k in range(i * per, (i + 1) * per)]


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(name, size, options)`` mounts a tmpfs of ``size`` at ``tmp_path/name`` and
    returns its path (skips when mounting is not permitted); all are unmounted afterwards."""
    mounted: list[str] = []

    def mount(name: str, size: str, options: str = "") -> str:
        d = tmp_path / name
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}{options}", "tmpfs",
                            str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(str(d))
        return str(d)

    yield mount
    for d in reversed(mounted):
        subprocess.run(["umount", "-l", d], check=False)


def fill_up(directory: str) -> str:
    """Fill ``directory``'s filesystem to the last byte with one file; return its path."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    block = b"x" * 65536
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError:
                if len(block) == 1:
                    break
                block = block[:len(block) // 2]
    finally:
        os.close(fd)
    return path


def temp_files(directory: str) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs
            if f.startswith(".tmp")]


def tiered(kind: str, tier1: str, **extra) -> dict:
    return {"log.channel.type": "tiered", "storage.tiers.types": f"{kind},HDD",
            "storage.tiers.first.paths": tier1, "storage.tiers.first.sizes": "64m",
            "log.segment.bytes": "1m", "log.pmem.pool.ratio": 1.0, **extra}


@pytest.mark.parametrize("kind", ["NVME", "PMEM"])
def test_tier_1_smaller_than_configured_fills_and_appends_go_to_tier_2(tmp_path, tmpfs,
                                                                       kind):
    tier1 = tmpfs("t1", "8m")
    root, conf, per = str(tmp_path / "store"), tiered(kind, tier1), 3000
    out = run_appends(root, conf, 0, 150, per)  # ~14 MiB into an 8 MiB tier 1
    assert out["bare"] == [] and out["errors"] == {}
    assert len(out["acked"]) == 150
    s = Store.open(root, conf)
    try:
        t = s.topic("t")
        assert read_all(t, 0) == expected_keys(out["acked"], per)
        on = {seg.tier for seg in t.segments()}
        assert on == {1, 2}, f"segments on tiers {on}"
    finally:
        s.close()
    for command in ("check", "topics"):
        r = pafka(command, root)
        assert r.returncode == 0, r.stderr
        assert "Errno" not in r.stdout + r.stderr


def test_pool_too_big_for_its_filesystem_opens_short_and_completes_once_freed(tmp_path,
                                                                              tmpfs):
    tier1 = tmpfs("t1", "8m")
    conf = tiered("PMEM", tier1, **{"storage.tiers.first.sizes": "16m"})
    filler = os.path.join(tier1, "other")
    with open(filler, "wb") as f:
        f.write(b"x" * (4 * 1024 * 1024))  # someone else's file takes half
    s = Store.open(tmp_path / "store", conf)
    try:
        assert 0 < s.tier(1).free_pool_files() < 16
    finally:
        s.close()
    assert temp_files(tier1) == []
    os.unlink(filler)
    s = Store.open(tmp_path / "store", conf)
    try:
        # 8 MiB hold 7 pool files of 1 MiB beside the tier's own small files.
        assert s.tier(1).free_pool_files() == 7
    finally:
        s.close()
    assert temp_files(tier1) == []


@pytest.mark.parametrize("kind", ["NVME", "PMEM"])
def test_store_creation_on_a_full_filesystem_is_store_full_and_works_once_freed(
        tmp_path, tmpfs, kind):
    mnt = tmpfs("t1", "1m")
    filler = fill_up(mnt)
    conf = tiered(kind, os.path.join(mnt, "tier"), **{"storage.tiers.first.sizes": "1m",
                                                      "log.segment.bytes": "128k"})
    with pytest.raises(StoreFull, match="cannot be created"):
        Store.open(tmp_path / "store", conf)
    assert temp_files(mnt) == []
    os.unlink(filler)
    Store.open(tmp_path / "store", conf).close()


def test_segment_not_created_on_a_full_tier_leaves_nothing_there_and_returns_with_space(
        tmp_path, tmpfs):
    tier1 = tmpfs("t1", "2m")
    conf = tiered("NVME", tier1, **{"log.segment.bytes": "64k"})
    s = Store.open(tmp_path / "store", conf)
    try:
        filler = fill_up(tier1)
        a = s.create_topic("a", SCHEMA, partitions=1)
        a.append(make_batch(0, 100), partition=0)
        assert [seg.tier for seg in a.segments()] == [2]
        # The creation that hit ENOSPC left no file behind on tier 1.
        assert not os.path.exists(os.path.join(tier1, "a"))or not any(
            files for _, _, files in os.walk(os.path.join(tier1, "a")))
        os.unlink(filler)
        b = s.create_topic("b", SCHEMA, partitions=1)
        b.append(make_batch(0, 100), partition=0)
        assert [seg.tier for seg in b.segments()] == [1]  # tier 1 has room again
        assert read_all(a, 0) == list(range(100)) and read_all(b, 0) == list(range(100))
    finally:
        s.close()
    assert temp_files(tier1) == []


def log_on_tmpfs(tmp_path, tmpfs, **extra) -> tuple[str, dict]:
    mnt = tmpfs("root", "1m")
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
            "storage.tiers.first.paths": str(tmp_path / "t1"),
            "storage.tiers.second.paths": str(tmp_path / "t2"), **extra}
    return os.path.join(mnt, "store"), conf


def test_full_commit_log_is_store_full_with_no_temp_files_and_works_once_freed(tmp_path,
                                                                                tmpfs):
    root, conf = log_on_tmpfs(tmp_path, tmpfs, **{"log.checkpoint.interval": 5})
    s = Store.open(root, conf)
    # The active segment exists before the log's filesystem fills: a roll must also write
    # the partition's pointer there (see test_roll_on_a_full_root_is_store_full).
    s.create_topic("t", SCHEMA, partitions=1).append(make_batch(0, 10), partition=0)
    s.close()
    filler = fill_up(os.path.dirname(root))
    full = run_appends(root, conf, 1, 60, 10)
    assert full["bare"] == []
    assert full["errors"].get("StoreFull", 0) == 60 - len(full["acked"]) > 0
    full["acked"].insert(0, 0)
    assert temp_files(os.path.dirname(root)) == []
    os.unlink(filler)
    freed = run_appends(root, conf, 61, 20, 10)
    assert freed["bare"] == [] and freed["errors"] == {} and len(freed["acked"]) == 20
    s = Store.open(root, conf)
    try:
        assert read_all(s.topic("t"), 0) == expected_keys(full["acked"] + freed["acked"], 10)
    finally:
        s.close()
    assert temp_files(os.path.dirname(root)) == []
    r = pafka("check", root)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_publish_and_checkpoint_on_a_full_log_name_the_filesystem(tmp_path, tmpfs):
    root, conf = log_on_tmpfs(tmp_path, tmpfs)
    s = Store.open(root, conf)
    try:
        t = s.create_topic("t", SCHEMA, partitions=1)
        t.append(make_batch(0, 10), partition=0)
        filler = fill_up(os.path.dirname(root))
        version = t.state().version
        with pytest.raises(StoreFull, match=r"entry \d+ was not published.*filesystem of its "
                                            "commit log") as e:
            t.append(make_batch(10, 10), partition=0)
        assert os.path.dirname(root) in str(e.value)
        with pytest.raises(StoreFull, match="checkpoint"):
            t.write_checkpoint()
        assert t.state().version == version  # nothing half visible
        assert temp_files(os.path.dirname(root)) == []
        os.unlink(filler)
        t.append(make_batch(10, 10), partition=0)
        assert t.write_checkpoint() == version + 1
        assert read_all(t, 0) == list(range(20))
    finally:
        s.close()
    assert temp_files(os.path.dirname(root)) == []


def test_migrate_to_a_full_tier_2_reports_store_full_and_leaves_no_copy(tmp_path, tmpfs):
    tier2 = tmpfs("t2", "1m")
    root = str(tmp_path / "store")
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
            "storage.tiers.first.paths": str(tmp_path / "t1"),
            "storage.tiers.first.sizes": "4m", "storage.tiers.second.paths": tier2,
            "storage.tiers.second.sizes": "64m", "log.segment.bytes": "256k"}
    s = Store.open(root, conf)
    try:
        t = s.create_topic("t", SCHEMA, partitions=1)
        for i in range(40):
            t.append(make_batch(i * 1000, 1000), partition=0)
        sealed = [seg.id for seg in t.segments() if seg.sealed]
        filler = fill_up(tier2)
        os.unlink(filler)
        with open(filler, "wb") as f:  # room for about half a segment
            f.write(b"x" * (os.statvfs(tier2).f_bavail * os.statvfs(tier2).f_frsize
                            - 128 * 1024))
        with pytest.raises(StoreFull, match="filesystem is full"):
            s.move_segment(sealed[0], 2, topic="t")
        assert temp_files(tier2) == []
    finally:
        s.close()
    r = pafka("migrate", root, "--set", "storage.migrate.threshold=0.1")
    assert r.returncode == 0, r.stderr
    assert "Errno" not in r.stdout + r.stderr and "filesystem is full" in r.stderr
    assert temp_files(tier2) == []
    s = Store.open(root, conf)
    try:
        assert read_all(s.topic("t"), 0) == list(range(40000))
    finally:
        s.close()
    assert pafka("check", root).returncode == 0


def test_move_whose_copy_cannot_be_created_is_store_full(tmp_path, tmpfs):
    """Tier 2 has bytes free but no inodes: the copy itself meets ENOSPC."""
    tier2 = tmpfs("t2", "8m", ",nr_inodes=8")
    root = str(tmp_path / "store")
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
            "storage.tiers.first.paths": str(tmp_path / "t1"),
            "storage.tiers.second.paths": tier2, "log.segment.bytes": "64k"}
    s = Store.open(root, conf)
    try:
        t = s.create_topic("t", SCHEMA, partitions=1)
        for i in range(10):
            t.append(make_batch(i * 1000, 1000), partition=0)
        sealed = [seg.id for seg in t.segments() if seg.sealed]
        n = 0
        while True:  # use up the inodes
            try:
                open(os.path.join(tier2, f"f{n}"), "w").close()
                n += 1
            except OSError:
                break
        with pytest.raises(StoreFull, match="filesystem is full"):
            s.move_segment(sealed[0], 2, topic="t")
        assert temp_files(tier2) == []
        for i in range(n):
            os.unlink(os.path.join(tier2, f"f{i}"))
        s.move_segment(sealed[0], 2, topic="t")  # works once space returns
        assert [seg.tier for seg in t.segments()][0] == 2
        assert read_all(t, 0) == list(range(10000))
    finally:
        s.close()


def test_roll_on_a_full_root_is_store_full(tmp_path, tmpfs):
    root, conf = log_on_tmpfs(tmp_path, tmpfs)
    s = Store.open(root, conf)
    try:
        t = s.create_topic("t", SCHEMA, partitions=1)
        filler = fill_up(os.path.dirname(root))
        with pytest.raises(StoreFull):
            t.append(make_batch(0, 10), partition=0)  # the first segment: a roll
        assert temp_files(os.path.dirname(root)) == []
        os.unlink(filler)
        t.append(make_batch(0, 10), partition=0)
        assert read_all(t, 0) == list(range(10))
    finally:
        s.close()
