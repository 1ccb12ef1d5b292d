"""The tier contract, one suite that every tier joins, plus what is particular to each."""

import mmap
import os
import signal
import subprocess
import textwrap
import time

import numpy as np
import pyarrow as pa
import pytest

from tier_store import PmemUnavailable, Store, StoreFull
from tier_store.chunk import EncodedChunk, checksum, read_chunk
from tier_store.config import TierSpec
from tier_store.segment import HEADER_SIZE, SegmentHeader, align
from tier_store.tiers import FileTier, PmemTier

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import record_fsyncs as _record_fsyncs

SEG = 256 * 1024


def _chunk(start: int, n: int) -> EncodedChunk:
    b = make_batch(start, n)
    return EncodedChunk.of([b], b.schema, "none")


class TierContract:
    """Every tier passes these: create, append, seal, reopen, read back, release."""

    def make_tier(self, directory: str):
        raise NotImplementedError

    @pytest.fixture
    def tier(self, tmp_path, shm_dir):
        t = self.make_tier(shm_dir if self.on_shm else str(tmp_path / "tier"))
        t.prepare()
        if isinstance(t, PmemTier):
            t.ensure_pool()
        return t

    on_shm = False

    def test_new_segment_has_a_fresh_header(self, tier):
        w = tier.create_segment("t", 0, 0, 100)
        h = w.header()
        assert (h.partition, h.seq, h.end, h.sealed) == (0, 0, HEADER_SIZE, False)
        w.close()

    @staticmethod
    def _append(w, chunks, durable=True, sync_after=None):
        """Append ``chunks`` chunks of 10 rows (keys 0, 10, 20, ...); their (pos, size, crc)
        and the end."""
        pos, spans = HEADER_SIZE, []
        for i in range(chunks):
            c = _chunk(i * 10, 10)
            pos = align(pos)
            spans.append((pos, c.size, w.write_chunk(pos, c)))
            w.set_end(pos + c.size, durable)
            pos += c.size
            if i == sync_after:
                w.sync()
                w.sync()  # nothing left to flush: a no-op
        return spans, pos

    @staticmethod
    def _check_read_back(path, spans):
        buf = pa.memory_map(path).read_buffer()
        for i, (p, n, crc) in enumerate(spans):
            assert checksum(buf.slice(p, n)) == crc
            (b,) = list(read_chunk(buf.slice(p, n), "test"))
            assert b.column(0).to_pylist() == list(range(i * 10, i * 10 + 10))

    def test_appended_chunks_read_back_zero_copy_with_their_checksums(self, tier):
        w = tier.create_segment("t", 3, 7, 100)
        spans, end = self._append(w, 5)
        assert w.header().end == end
        w.close()
        self._check_read_back(tier.segment_path("t", 3, 7), spans)

    def test_deferred_chunks_are_readable_and_flushed_by_sync_seal_or_close(self, tier):
        w = tier.create_segment("t", 1, 4, 100)
        spans, end = self._append(w, 6, durable=False, sync_after=2)
        # Another writer (another process) sees the advanced end before any flush.
        other = tier.open_segment(tier.segment_path("t", 1, 4))
        assert other.header().end == end
        other.close()
        w.seal()
        w.close()
        self._check_read_back(tier.segment_path("t", 1, 4), spans)

    def test_deferred_seal_is_seen_at_once_and_flushed_with_the_chunks(self, tier):
        w = tier.create_segment("t", 2, 5, 100)
        spans, end = self._append(w, 4, durable=False)
        w.seal(durable=False)
        other = tier.open_segment(tier.segment_path("t", 2, 5))
        assert other.header().sealed and other.header().end == end
        other.close()
        w.sync()
        w.close()
        again = tier.open_segment(tier.segment_path("t", 2, 5))
        assert again.header().sealed
        again.close()
        self._check_read_back(tier.segment_path("t", 2, 5), spans)

    def test_seal_is_durable_and_seen_by_a_new_writer(self, tier):
        w = tier.create_segment("t", 0, 1, 100)
        w.seal()
        w.close()
        again = tier.open_segment(tier.segment_path("t", 0, 1))
        assert again.header().sealed
        again.close()

    def test_capacity_is_the_segment_size(self, tier):
        w = tier.create_segment("t", 0, 2, 100)
        assert w.capacity() == SEG
        w.close()

    def test_new_directories_are_durable_in_their_parents(self, tier, monkeypatch):
        calls = _record_fsyncs(monkeypatch)
        w = tier.create_segment("t", 0, 0, 100)
        synced = {path for _, path in calls}
        pdir = os.path.dirname(tier.segment_path("t", 0, 0))
        tdir = os.path.dirname(pdir)
        # <tier> holds the new t/, t/ the new 0/, 0/ the new segment.
        assert {tier.path, tdir, pdir} <= synced, synced
        w.close()
        calls.clear()
        # Directories there: their parents again all the same, since a directory that exists
        # may be one a deferred writer made and died before syncing.
        w = tier.create_segment("t", 0, 1, 100)
        synced = {path for _, path in calls}
        assert {tier.path, tdir, pdir} <= synced
        w.close()

    def test_deferred_new_directories_are_made_durable_by_the_first_sync(self, tier,
                                                                        monkeypatch):
        calls = _record_fsyncs(monkeypatch)
        w = tier.create_segment("t", 5, 0, 100, durable=False)
        assert calls == []  # nothing waited on the disk yet
        w.sync()
        pdir = os.path.dirname(tier.segment_path("t", 5, 0))
        assert {tier.path, os.path.dirname(pdir), pdir} <= {path for _, path in calls}
        w.close()

    def test_released_segment_is_gone_from_its_path(self, tier):
        w = tier.create_segment("t", 0, 3, 100)
        w.close()
        path = tier.segment_path("t", 0, 3)
        tier.release_segment(path)
        assert not os.path.exists(path)
        tier.release_segment(path)  # idempotent


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_a_chunk_gathered_from_its_batches_is_byte_for_byte_their_joined_encoding(compression):
    """Several batches become one record batch; gathered from the batches' own buffers where
    a column has no nulls, the bytes are those of encoding the joined batch."""
    import datetime
    import decimal

    t = pa.table({
        "i8": pa.array([1, None, -3], pa.int8()), "u64": pa.array([0, 2**64 - 1, 5], pa.uint64()),
        "f": [1.5, None, -0.0], "d": pa.array([decimal.Decimal("1.25")] * 3,
                                                      pa.decimal128(9, 2)),
        "s": ["a", None, "ccc" * 50], "b": pa.array([b"\x00", b"", None], pa.large_binary()),
        "ts": pa.array([0, 1, None], pa.timestamp("us", "UTC")),
        "day": [datetime.date(2024, 1, 1)] * 3, "ok": [True, None, False],
        "l": [[1, 2], None, []], "st": [{"x": 1, "y": "a"}, None, {"x": None, "y": None}],
        "m": pa.array([[("k", 1)], None, []], pa.map_(pa.string(), pa.int64())),
        # without nulls: gathered with no copy
        "i": pa.array([7, -1, 3], pa.int32()), "u": ["x", "", "yy" * 40],
        "lb": pa.array([b"", b"\x01", b"ab"], pa.large_binary()),
        "fb": pa.array([b"abc", b"def", b"ghi"], pa.binary(3)),
        "dec": pa.array([decimal.Decimal("-3.5")] * 3, pa.decimal128(30, 1)),
        "empty": pa.array(["", "", ""]),
    })
    # Sliced batches (offsets not at 0) and an empty one.
    batches = t.slice(1).to_batches() + t.to_batches() + t.slice(0, 0).to_batches() + \
        t.slice(1, 1).to_batches()
    c = EncodedChunk.of(batches, t.schema, compression)
    joined = b"".join(bytes(memoryview(p)) for p in c.pieces())
    assert len(joined) == c.size
    from tier_store.chunk import _encode, checksum_pieces
    one = pa.Table.from_batches(batches).combine_chunks().to_batches()
    assert len(one) == 1
    assert joined == _encode(one, t.schema, compression).to_pybytes()
    assert checksum_pieces(c.pieces()) == checksum(joined)
    written = pa.allocate_buffer(c.size)
    c.write_into(written)
    assert written.to_pybytes() == joined
    (got,) = read_chunk(pa.py_buffer(joined), "test")
    assert got.equals(one[0])


def test_a_gathered_chunk_writes_from_the_batches_own_memory():
    parts = [pa.record_batch({"k": pa.array(np.arange(i * 1000, i * 1000 + 1000)),
                              "v": pa.array([b"x" * 50] * 1000)}).slice(10, 900)
             for i in range(3)]
    c = EncodedChunk.of(parts, parts[0].schema, "none")
    addresses = {pa.py_buffer(p).address for p in c.pieces() if len(p) >= 900 * 8}
    for b in parts:
        assert b.column(0).buffers()[1].address + 10 * 8 in addresses
        assert b.column(1).buffers()[2].address + 10 * 50 in addresses


def _spec(n, typ, path, size):
    return TierSpec(n, typ, path, size)


class TestFileTier(TierContract):
    def make_tier(self, directory):
        return FileTier(_spec(1, "HDD", directory, 0), SEG)


class TestFileTierDirect(TierContract):
    """The file tier writing every chunk with O_DIRECT (most chunks share a block)."""

    def make_tier(self, directory):
        return FileTier(_spec(1, "HDD", directory, 0), SEG, direct_bytes=1)

    def test_direct_and_buffered_chunks_interleave_byte_exact(self, tmp_path):
        tier = FileTier(_spec(1, "HDD", str(tmp_path / "tier"), 0), 8 * SEG,
                        direct_bytes=8192)
        tier.prepare()
        w = tier.create_segment("t", 0, 0, 100)
        path = tier.segment_path("t", 0, 0)
        pos, spans, before = HEADER_SIZE, [], HEADER_SIZE
        for i, n in enumerate([5, 400, 3, 900, 1, 2, 700]):
            c = _chunk(i * 1000, n)
            pos = align(pos)
            crc = w.write_chunk(pos, c)
            w.set_end(pos + c.size)
            size = os.path.getsize(path)
            # A direct write covers whole 4 KiB blocks; a buffered one ends at the chunk (or
            # inside the padding of the direct write before it).
            if c.size >= 8192:
                assert size % 4096 == 0 and size - 4096 < pos + c.size <= size
            else:
                assert size == max(before, pos + c.size)
            before = size
            spans.append((pos, c.size, crc, i * 1000, n))
            pos += c.size
        w.close()
        buf = pa.memory_map(path).read_buffer()
        for p, size, crc, first, n in spans:
            assert checksum(buf.slice(p, size)) == crc
            (b,) = list(read_chunk(buf.slice(p, size), "test"))
            assert b.column(0).to_pylist() == list(range(first, first + n))


    def test_direct_scratch_sits_on_huge_pages(self):
        # A direct write's request holds at most max_segments memory pieces (254 on
        # virtio-blk): 4 KiB pages cap it near 1 MiB, huge pages let it reach the device's
        # largest request.
        import ctypes

        from tier_store.tiers.file import HUGE, _Scratch

        scratch = _Scratch(8 * 1024 * 1024)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(scratch.view))
        assert addr % HUGE == 0 and len(scratch) == 8 * 1024 * 1024
        scratch.view[:] = b"x" * len(scratch)
        try:
            with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
                thp = f.read()
        except OSError:
            pytest.skip("no transparent huge pages on this kernel")
        if "[never]" in thp:
            pytest.skip("transparent huge pages are disabled")
        huge_kb = 0
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                head = line.split()[0]
                if "-" in head and all(c in "0123456789abcdef-" for c in head):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= addr < hi
                elif inside and head == "AnonHugePages:":
                    huge_kb = int(line.split()[1])
        assert huge_kb >= 2048, "the scratch mapping got no huge page"


class TestPmemTier(TierContract):
    on_shm = True

    def make_tier(self, directory):
        return PmemTier(_spec(1, "PMEM", directory, 8 * SEG), SEG, 1.0)

    def test_pool_is_preallocated_and_segments_come_from_it(self, tier):
        assert tier.free_pool_files() == 8
        w = tier.create_segment("t", 0, 0, 100)
        assert tier.free_pool_files() == 7
        assert os.path.getsize(tier.segment_path("t", 0, 0)) == SEG
        w.close()
        tier.release_segment(tier.segment_path("t", 0, 0))
        assert tier.free_pool_files() == 8

    def test_pool_exhaustion_means_no_room(self, tier):
        ws = [tier.create_segment("t", 0, i, 100) for i in range(8)]
        assert all(ws)
        assert tier.create_segment("t", 0, 9, 100) is None
        assert not tier.has_room(0, 100)
        for w in ws:
            w.close()

    def test_a_chunk_larger_than_a_pool_file_does_not_fit(self, tier):
        assert tier.create_segment("t", 0, 0, SEG) is None

    def test_header_words_are_never_seen_half_written_by_another_process(self, tier):
        # The migration planner reads the active segment's header without the partition
        # lock while a writer in another process advances `end` (and a roll seals a sealed
        # segment again): it must see the old word or the new one. struct.pack_into
        # zero-filled the word first, and the planner failed on "end 0".
        w = tier.create_segment("t", 0, 0, 100)
        w.seal()
        w.close()
        path = tier.segment_path("t", 0, 0)
        ends = (HEADER_SIZE + 64, HEADER_SIZE + 128)
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            pytest.skip("needs two CPUs: the reader must run while the writer updates")
        code = textwrap.dedent(f"""
            import os, time
            from tier_store.tiers.pmem import PmemSegmentWriter
            os.sched_setaffinity(0, {{{cpus[1]}}})
            w = PmemSegmentWriter({path!r})
            w.set_end({ends[0]}, durable=False)
            print("ready", flush=True)
            stop = time.monotonic() + 60  # killed long before, unless the test died
            while time.monotonic() < stop:
                for end in {ends!r}:
                    w.set_end(end, durable=False)
                    w.seal(durable=False)
        """)
        child = subprocess.Popen([PYTHON, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        # Until this many updates were seen between two reads: the two processes must run
        # side by side for a while, which a loaded machine may take long to grant.
        changes, last, seen = 0, 0, set()
        # Each process on a CPU of its own, so that they overlap even on a busy machine.
        os.sched_setaffinity(0, {cpus[0]})
        try:
            assert child.stdout.readline().strip() == "ready", child.stderr.read()
            deadline = time.monotonic() + 15
            with open(path, "rb") as f, mmap.mmap(f.fileno(), HEADER_SIZE,
                                                  prot=mmap.PROT_READ) as m:
                while changes < 20_000 and time.monotonic() < deadline:
                    assert child.poll() is None, child.stderr.read()[-2000:]
                    for _ in range(1000):
                        # CorruptSegment on an `end` inside the header.
                        h = SegmentHeader.unpack(m[:48], path)
                        seen.add((h.end, h.sealed))
                        changes += h.end != last
                        last = h.end
        finally:
            os.sched_setaffinity(0, cpus)
            child.kill()
            child.communicate()
        assert seen <= {(end, True) for end in ends}, seen
        if changes < 20_000:
            pytest.skip(f"the writer and reader processes hardly ran side by side ({changes} "
                        "updates seen)")

def test_a_crash_while_preallocating_the_pool_is_completed_by_the_next_open(tmp_path,
                                                                         shm_dir):
    root = str(tmp_path / "s")
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
            "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
            "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0}
    code = f"from tier_store import Store; Store.open({root!r}, {conf!r})"
    # The first open dies making its fourth pool file, after _store.json was saved.
    r = _run(code, dict(os.environ, PAFKA_CRASH_POINT="pool.create", PAFKA_CRASH_AFTER="3"))
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    pool = os.path.join(shm_dir, "_pool")
    assert os.path.exists(os.path.join(root, "_store.json"))
    assert len([n for n in os.listdir(pool) if n.endswith(".pool")]) == 3
    assert [n for n in os.listdir(pool) if n.startswith(".tmp-")]
    s = Store.open(root)
    usage = next(u for u in s.tier_usage() if u["tier"] == 1)
    assert usage["pool_files"] == 16 and usage["pool_free"] == 16
    assert not [n for n in os.listdir(pool) if n.startswith(".tmp-")]  # the dead one's file
    t = s.create_topic("t", SCHEMA)
    for i in range(20):
        t.append(make_batch(i * 200, 200))
    in_use = sum(x.tier == 1 for x in t.segments())
    # Opening again leaves a complete pool as it is.
    again = next(u for u in Store.open(root).tier_usage() if u["tier"] == 1)
    assert in_use > 0 and again["pool_free"] == 16 - in_use


@pytest.mark.parametrize("point,after,size", [
    ("resize.unsaved", "0", "512k"),  # shrunk, died before saving: the old size stands
    ("resize.unsaved", "0", "2m"),  # grown, died before saving: trimmed back
    ("pool.create", "3", "2m"),  # died growing the pool: the files made are trimmed
])
def test_a_crash_while_resizing_a_pool_leaves_one_the_next_open_completes(
        tmp_path, shm_dir, point, after, size):
    files = 16
    root = str(tmp_path / "s")
    conf = {"log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
            "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
            "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0}
    s = Store.open(root, conf)
    t = s.create_topic("t", SCHEMA)
    for i in range(20):
        t.append(make_batch(i * 200, 200))
    in_use = sum(x.tier == 1 for x in t.segments())
    code = f"from tier_store import Store; Store.open({root!r}).resize_tier(1, {size!r})"
    r = _run(code, dict(os.environ, PAFKA_CRASH_POINT=point, PAFKA_CRASH_AFTER=after))
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    pool = os.path.join(shm_dir, "_pool")
    assert not os.path.exists(os.path.join(pool, "_complete"))
    s = Store.open(root)
    usage = next(u for u in s.tier_usage() if u["tier"] == 1)
    assert usage["pool_files"] == files and usage["pool_free"] == files - in_use > 0
    assert read_all(s.topic("t"), 0) == list(range(4000))


def test_pmem_store_falls_over_to_tier_two_when_the_pool_is_empty(tiered_store):
    t = tiered_store.create_topic("t", SCHEMA)  # 16 pool files of 64 KiB
    for i in range(200):
        t.append(make_batch(i * 200, 200))
    tiers = {s.tier for s in t.segments()}
    assert tiers == {1, 2}
    assert read_all(t, 0) == list(range(40_000))
    usage = {u["tier"]: u for u in tiered_store.tier_usage()}
    assert usage[1]["pool_free"] == 0 and usage[2]["segments"] > 0


def test_store_full_names_the_tiers_and_makes_nothing_visible(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k", "storage.tiers.first.sizes": "128k"})
    t = s.create_topic("t", SCHEMA)
    with pytest.raises(StoreFull, match=r"tier 1 \(FILE.*of 131072 bytes used"):
        for i in range(100):
            t.append(make_batch(i * 200, 200))
    latest = t.latest_offsets()[0]
    assert read_all(t, 0) == list(range(latest))


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_pmem_persist_path_is_used_when_libpmem_reports_pmem(shm_dir, tmp_path):
    shm_dir = os.path.join(shm_dir, "a")  # the second store's tier beside it, not in it
    code = f"""
        from tier_store import Store
        from tests.conftest import make_batch, SCHEMA
        s = Store.open({str(tmp_path)!r}, {{"log.channel.type": "pmem",
            "storage.tiers.first.paths": {shm_dir!r}, "storage.tiers.first.sizes": "1m",
            "log.segment.bytes": "64k"}})
        t = s.create_topic("t", SCHEMA)
        t.append(make_batch(0, 100))
        w = t.partition_log(0).writer
        print("is_pmem", w.mapping.is_pmem)
        print("rows", sum(b.num_rows for b in t.read(0, 0)))
    """
    env = dict(os.environ, PMEM_IS_PMEM_FORCE="1")
    r = _run(code, env)
    assert r.returncode == 0, r.stderr
    assert "is_pmem True" in r.stdout and "rows 100" in r.stdout
    env = dict(os.environ, PMEM_IS_PMEM_FORCE="0")
    r = _run(code.replace(str(tmp_path), str(tmp_path / "b")).replace(shm_dir, shm_dir[:-1] + "b"),
             env)
    assert r.returncode == 0, r.stderr
    assert "is_pmem False" in r.stdout


def test_missing_libpmem_names_the_package_to_install(shm_dir, tmp_path):
    code = f"""
        from tier_store import Store, PmemUnavailable
        try:
            Store.open({str(tmp_path)!r}, {{"log.channel.type": "pmem",
                       "storage.tiers.first.paths": {shm_dir!r}}})
        except PmemUnavailable as e:
            print("ERR", e)
    """
    r = _run(code, dict(os.environ, PAFKA_LIBPMEM="libpmem-does-not-exist.so.1"))
    assert r.returncode == 0, r.stderr
    assert "ERR" in r.stdout and "libpmem1" in r.stdout
    assert issubclass(PmemUnavailable, OSError)
