"""A damaged ``end`` word in the active segment's header: the writer trusts the commit log,
never the header, about what is acknowledged (issue #20, point 2)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import threading

import pytest

from tier_store import CommitConflict, Store
from tier_store.segment import END_OFFSET, HEADER_SIZE, MAGIC, WORD, SegmentHeader, align

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import pmem_hdd_config

SEGMENT = 64 * 1024


def _store(kind: str, tmp_path, shm_dir) -> Store:
    conf = {"log.segment.bytes": "64k"}
    if kind == "pmem":
        conf = pmem_hdd_config(shm_dir)
    return Store.open(tmp_path / "store", conf)


def _active_path(store: Store, topic) -> str:
    seq, tier = topic.active_segment(0)
    return store.tier(tier).segment_path(topic.name, 0, seq)


def _end(path: str) -> int:
    with open(path, "rb") as f:
        f.seek(END_OFFSET)
        return WORD.unpack(f.read(WORD.size))[0]


def _set_end(path: str, end: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, WORD.pack(end), END_OFFSET)
    finally:
        os.close(fd)


BELOW = {
    "bit 5 cleared": lambda e: e ^ (1 << 5),
    "bit 9 cleared": lambda e: e ^ (1 << 9),
    "bit 13 cleared (inside the header)": lambda e: e ^ (1 << 13),
    "the first chunk's position": lambda e: HEADER_SIZE,
    "64 bytes below": lambda e: e - 64,
    "zero": lambda e: 0,
}


@pytest.mark.parametrize("kind", ["file", "pmem"])
def test_an_end_below_the_committed_end_never_overwrites_an_acknowledged_chunk(
        kind, tmp_path, shm_dir, caplog):
    # Before: the next append wrote at the damaged `end`, over acknowledged chunks (their
    # checksums failed), or raised CorruptSegment on every append for an `end` inside the
    # header. Now: the segment is restored from the log, sealed, and left.
    store = _store(kind, tmp_path, shm_dir)
    for i, (what, damage) in enumerate(BELOW.items()):
        t = store.create_topic(f"t{i}", SCHEMA, partitions=1)
        for j in range(3):
            t.append(make_batch(j * 50, 50), partition=0)
        path = _active_path(store, t)
        committed = _end(path)
        with open(path, "rb") as f:
            before = f.read()
        _set_end(path, damage(committed))
        t.append(make_batch(150, 50), partition=0)
        t.append(make_batch(200, 50), partition=0)
        assert _active_path(store, t) != path, what
        with open(path, "rb") as f:
            after = f.read()
        # Not a byte of a chunk changed; `end` is the committed end again, and it is sealed.
        assert after[HEADER_SIZE:] == before[HEADER_SIZE:], what
        hdr = SegmentHeader.unpack(after, path)
        assert (hdr.end, hdr.sealed) == (committed, True), what
        again = Store.open(store.root).topic(t.name)
        assert read_all(again, 0) == list(range(250)), what
    assert "the header is damaged" in caplog.text and path in caplog.text


@pytest.mark.parametrize("kind", ["file", "pmem"])
def test_an_end_above_the_committed_end_is_legal_and_one_past_the_segment_rolls(
        kind, tmp_path, shm_dir):
    # Above the committed end lie chunks not committed yet, or a hole a crash left: the
    # next chunk goes after it. Past the segment's capacity (a huge value) the append rolls
    # instead of writing there (the file tier trusted it as an oversized segment's end).
    store = _store(kind, tmp_path, shm_dir)
    t = store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 50), partition=0)
    path = _active_path(store, t)
    _set_end(path, _end(path) + 4096)
    hole = _end(path)
    [r] = t.write_chunks(make_batch(50, 50), partition=0)
    assert r.pos == align(hole)
    t.commit([r])
    _set_end(path, 1 << 40)
    store.close()
    store = Store.open(store.root)
    t = store.topic("t")  # a writer that opens the segment afresh
    [r] = t.write_chunks(make_batch(100, 50), partition=0)
    t.commit([r])
    assert _active_path(store, t) != path
    assert read_all(t, 0) == list(range(150))
    tier = store.tier(1).path
    sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tier)
             for f in fs if f.endswith(".seg")]
    assert max(sizes) <= SEGMENT


def test_a_commit_refuses_a_chunk_the_header_no_longer_covers(file_store):
    # A chunk written but not committed is known only to the header: once `end` lies below
    # it (damage, or a crash that lost the update), the next writer may put its own chunk
    # there, so committing it must fail rather than publish bytes that may not be it.
    t = file_store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)
    path = _active_path(file_store, t)
    committed = _end(path)
    [r] = t.write_chunks(make_batch(10, 10), partition=0)
    _set_end(path, committed)
    with pytest.raises(CommitConflict, match=r"segment 0-0 \(.*\.seg\) no longer holds the "
                       rf"chunks written to it: expected its header to end at or after byte "
                       rf"{r.pos + r.length}, found segment 0-0 ending at byte {committed}; "
                       "write the batch again"):
        t.commit([r])
    assert t.latest_offsets() == {0: 10}
    t.append(make_batch(10, 10), partition=0)
    assert read_all(t, 0) == list(range(20))


def test_a_chunk_of_this_handle_is_not_overwritten_when_end_falls_below_it(file_store):
    # The log knows nothing of a chunk not committed yet; the handle that wrote it does.
    t = file_store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)
    path = _active_path(file_store, t)
    [mine] = t.write_chunks(make_batch(10, 10), partition=0)
    _set_end(path, mine.pos)
    [other] = t.write_chunks(make_batch(20, 10), partition=0)
    assert other.seq != mine.seq
    with pytest.raises(CommitConflict, match="no longer holds the chunks"):
        t.commit([mine])
    t.commit([other])
    assert read_all(t, 0) == list(range(10)) + list(range(20, 30))


def test_the_committed_end_is_read_fresh_while_a_commit_holds_the_handles_lock(tmp_path):
    # Appends never wait on a commit's housekeeping (which holds the handle's lock): the
    # entries published since the handle's state are then read without applying them.
    store = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    t = store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)
    other = Store.open(store.root).topic("t")
    for j in range(1, 4):
        other.append(make_batch(j * 10, 10), partition=0)
    seq, tier = t.active_segment(0)
    committed = _end(_active_path(store, t))
    held, release = threading.Event(), threading.Event()
    found: list[int] = []

    def commit_in_housekeeping() -> None:
        with t.log.lock:
            held.set()
            release.wait(30)

    th = threading.Thread(target=commit_in_housekeeping)
    th.start()
    try:
        assert held.wait(30)
        looker = threading.Thread(target=lambda: found.append(
            t.log.committed_extent(0, seq, tier)))
        looker.start()
        looker.join(10)
        assert found == [committed]  # at once, and with the other handle's chunks
        assert t.log.current.part(0).next_offset == 10  # the state itself is not touched
    finally:
        release.set()
        th.join()
    _set_end(_active_path(store, t), HEADER_SIZE)
    [r] = t.write_chunks(make_batch(40, 10), partition=0)
    assert r.seq != seq
    t.commit([r])
    assert read_all(t, 0) == list(range(50))


def test_a_header_that_is_not_a_segments_is_left_untouched_and_appends_go_on(file_store):
    t = file_store.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10), partition=0)
    path = _active_path(file_store, t)
    with open(path, "r+b") as f:
        f.write(b"X" * len(MAGIC))
    with open(path, "rb") as f:
        before = f.read()
    t.append(make_batch(10, 10), partition=0)
    with open(path, "rb") as f:
        assert f.read() == before
    assert read_all(t, 0, 10) == list(range(10, 20))


_CHILD = textwrap.dedent("""
    import json, os, sys
    from tier_store import Store
    from tier_store.segment import END_OFFSET, WORD
    from tests.conftest import SCHEMA, make_batch
    root, shm, end = sys.argv[1], sys.argv[2], int(sys.argv[3])
    s = Store.open(root, {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
                          "storage.tiers.first.paths": shm, "storage.tiers.first.sizes": "1m",
                          "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0})
    t = s.create_topic("t", SCHEMA, partitions=1)
    for j in range(3):
        t.append(make_batch(j * 50, 50), partition=0)
    seq, tier = t.active_segment(0)
    path = s.tier(tier).segment_path("t", 0, seq)
    fd = os.open(path, os.O_RDWR)
    old = int.from_bytes(os.pread(fd, 8, END_OFFSET), "little")
    os.pwrite(fd, WORD.pack(end if end >= 0 else old ^ -end), END_OFFSET)
    os.close(fd)
    t = Store.open(root).topic("t")
    for j in range(3, 6):
        t.append(make_batch(j * 50, 50), partition=0)
    keys = [k for b in Store.open(root).topic("t").read(0, 0) for k in b.column("key").to_pylist()]
    print(json.dumps(keys == list(range(300))))
""")


@pytest.mark.parametrize("end", [1 << 40, 65535, -(1 << 7), -(1 << 13), 0])
def test_damaged_ends_on_real_pmem_writes_neither_crash_nor_lose_a_row(end, tmp_path, shm_dir):
    # Writes go through the mapping with PMEM_IS_PMEM_FORCE=1: one past its length would be
    # a SIGSEGV or SIGBUS, so each case runs in a child process.
    env = {**os.environ, "PMEM_IS_PMEM_FORCE": "1"}
    p = subprocess.run([PYTHON, "-c", _CHILD, str(tmp_path / "s"), shm_dir, str(end)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert json.loads(p.stdout.strip().splitlines()[-1]) is True
