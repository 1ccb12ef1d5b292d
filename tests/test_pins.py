"""Reader pins: a pool file a reader maps is never reused under it, and a freed one returns to
the pool as soon as no reader pins it, at the default log.cleanup.grace.ms (10 minutes)."""

import os
import shutil
import signal
import subprocess
import textwrap
import time

import pytest

from tier_store import MAPS, CorruptSegment, Store, seal_idle

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import no_cached_maps as no_cached_maps
from .support import open_pmem_hdd as _store  # the default grace: nothing may wait for it


@pytest.fixture(autouse=True)
def reads_map(monkeypatch):
    """These tests are about mappings: every read maps its file, however small (a small
    read of a file not mapped copies its bytes otherwise: see the copy tests below)."""
    monkeypatch.setattr(MAPS, "copy_bytes", 0)


def _two_segments(s):
    t = s.create_topic("t", SCHEMA)
    for i in range(3):
        t.append(make_batch(i * 200, 200))
    assert seal_idle(t, 0, now_ms=t.state().last_ts + 1) == ["0-0"]
    t.append(make_batch(600, 200))  # the next segment is the active one
    return t


def _move_elsewhere(root, segment, tier):
    """A move by another process (a move in this one unpins its sources)."""
    code = (f"from tier_store import Store; "
            f"Store.open({str(root)!r}).move_segment({segment!r}, {tier})")
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_pool_file_a_reader_maps_is_not_reused_until_the_reader_lets_go(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = _two_segments(s)
    held = list(t.read(0, 0, 600))  # batches alive: the mapping of 0-0 is pinned
    old = s.tier(1).segment_path("t", 0, 0)
    free = s.tier(1).free_pool_files()
    s.move_segment("t/0-0", 2)
    assert s.collect_garbage(t) == 0 and os.path.exists(old)
    assert [k for b in held for k in b.column("key").to_pylist()] == list(range(600))
    MAPS.clear()
    assert os.path.exists(old)  # the batches still use the mapping: still pinned
    assert s.collect_garbage(t) == 0
    del held
    # No reader left: back to the pool at once, not after the 10-minute grace period.
    assert s.collect_garbage(t) == 1
    assert not os.path.exists(old) and s.tier(1).free_pool_files() == free + 1
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(800))


def test_a_plan_that_no_longer_names_a_segment_unpins_it(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = _two_segments(s)
    assert read_all(t, 0) == list(range(800))  # caches a pinned mapping of 0-0
    old = s.tier(1).segment_path("t", 0, 0)
    assert old in MAPS.pinned()
    _move_elsewhere(s.root, "t/0-0", 2)
    assert s.collect_garbage(t) == 0
    # The next read of the partition plans 0-0 on tier 2 and drops the old mapping.
    assert read_all(t, 0) == list(range(800))
    assert old not in MAPS.pinned()
    assert s.collect_garbage(t) == 1


def test_an_idle_mapping_is_unpinned_by_itself(tmp_path, shm_dir, monkeypatch):
    # Idle after 3 s: long enough that a loaded machine still collects before it lapses
    # (0.3 s lapsed there between the read and the collection).
    monkeypatch.setattr(MAPS, "_idle_s", 3.0)
    s = _store(tmp_path, shm_dir)
    t = _two_segments(s)
    assert read_all(t, 0) == list(range(800))
    _move_elsewhere(s.root, "t/0-0", 2)
    assert s.collect_garbage(t) == 0
    deadline = time.monotonic() + 30
    while MAPS.pinned() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert MAPS.pinned() == []
    assert s.collect_garbage(t) == 1


READER = textwrap.dedent("""
    import sys, time
    from tier_store import MAPS, Store
    MAPS.copy_bytes = 0  # a mapping however small the read
    t = Store.open(sys.argv[1]).topic("t")
    held = list(t.read(0, 0, 600))
    print("mapped", flush=True)
    sys.stdin.readline()  # the parent moves the segment and tries to reclaim it meanwhile
    keys = [k for b in held for k in b.column("key").to_pylist()]
    print("ok" if keys == list(range(600)) else f"wrong {keys[:5]}", flush=True)
    time.sleep(600)
""")


def _reader(root):
    p = subprocess.Popen([PYTHON, "-c", READER, str(root)], cwd=ROOT, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "mapped"
    return p


def test_readers_in_other_processes_pin_across_a_move_and_a_killed_reader_unpins(
        tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    t = _two_segments(s)
    readers = [_reader(s.root) for _ in range(2)]
    try:
        old = s.tier(1).segment_path("t", 0, 0)
        s.move_segment("t/0-0", 2)
        assert s.collect_garbage(t) == 0
        # Another segment takes pool files meanwhile: never the pinned one.
        t.append(make_batch(800, 200))
        for r in readers:
            r.stdin.write("\n")
            r.stdin.flush()
            assert r.stdout.readline().strip() == "ok"
        os.kill(readers[0].pid, signal.SIGKILL)
        readers[0].wait(30)
        assert s.collect_garbage(t) == 0  # the other reader still pins it
        os.kill(readers[1].pid, signal.SIGKILL)
        readers[1].wait(30)
        assert s.collect_garbage(t) == 1 and not os.path.exists(old)
    finally:
        for r in readers:
            if r.poll() is None:
                r.kill()
                r.wait(30)
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(1000))


def test_a_file_whose_header_names_another_segment_is_never_read_as_this_one(
        tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    _two_segments(s)
    seg0 = s.tier(1).segment_path("t", 0, 0)
    seg1 = s.tier(1).segment_path("t", 0, 1)
    os.unlink(seg0)
    shutil.copyfile(seg1, seg0)  # as if a reused pool file lay under the old name
    with pytest.raises(CorruptSegment, match="names segment 0-1, not 0-0"):
        read_all(Store.open(s.root).topic("t"), 0)


def test_a_segment_path_that_is_a_symlink_is_refused(tmp_path, shm_dir):
    s = _store(tmp_path, shm_dir)
    _two_segments(s)
    seg0 = s.tier(1).segment_path("t", 0, 0)
    outside = tmp_path / "planted.seg"
    shutil.copyfile(seg0, outside)
    os.unlink(seg0)
    os.symlink(outside, seg0)
    with pytest.raises(CorruptSegment, match="symbolic link"):
        read_all(Store.open(s.root).topic("t"), 0)


def test_a_long_read_follows_segments_moved_one_after_another_while_it_reads(
        tmp_path, shm_dir):
    from tier_store import execute
    s = _store(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA)
    for i in range(9):
        t.append(make_batch(i * 200, 200))
        if i % 3 == 2:  # three sealed segments of 600 records, then an active one
            seal_idle(t, 0, now_ms=t.state().last_ts + 1)
    t.append(make_batch(1800, 200))
    sealed = [x.id for x in t.segments() if x.sealed]
    assert len(sealed) == 3
    MAPS.clear()
    reader = execute(t.plan_read(0, 0))  # planned with every segment on tier 1
    keys = list(next(reader).batch.column("key").to_pylist())
    # Each further segment moves (and its pool file returns to the pool) before it is read.
    for sid in sealed[1:]:
        _move_elsewhere(s.root, f"t/{sid}", 2)
        Store.open(s.root).collect_garbage(Store.open(s.root).topic("t"))
        while keys[-1] < int(sid.split("-")[1]) * 600 + 599:
            keys += next(reader).batch.column("key").to_pylist()
    keys += [k for b in reader for k in b.batch.column("key").to_pylist()]
    assert keys == list(range(2000))


@pytest.mark.parametrize("copy_bytes", [0, 1 << 16])
def test_a_small_read_copies_and_pins_nothing_a_large_one_maps(tmp_path, shm_dir,
                                                               monkeypatch, copy_bytes):
    # The fixed cost of reading a partition's newest records: a pread of a few pages costs
    # a fraction of a mapping's setup, first page faults and unmapping.
    monkeypatch.setattr(MAPS, "copy_bytes", copy_bytes)
    s = _store(tmp_path, shm_dir)
    t = _two_segments(s)
    old = s.tier(1).segment_path("t", 0, 0)
    held = list(t.read(0, 0, 1))  # one small chunk of 0-0
    assert [k for b in held for k in b.column("key").to_pylist()] == [0]
    assert (old in MAPS.pinned()) == (copy_bytes == 0)
    free = s.tier(1).free_pool_files()
    s.move_segment("t/0-0", 2)
    # A copy holds no pin: the pool file is back at once, and the batches read stay right.
    assert s.collect_garbage(t) == (1 if copy_bytes else 0)
    assert s.tier(1).free_pool_files() == free + (1 if copy_bytes else 0)
    assert [k for b in held for k in b.column("key").to_pylist()] == [0]
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(800))
    t.append(make_batch(800, 20_000))  # segments of 64 KiB: reads of a file over 4 KiB map
    monkeypatch.setattr(MAPS, "copy_bytes", min(copy_bytes, 4096))
    big = list(t.read(0, 800, 20_800))
    assert [k for b in big for k in b.column("key").to_pylist()] == list(range(800, 20_800))
    assert len(MAPS.pinned()) >= 1
