"""A store shared by many hosts (an s3:// root with a REMOTE tier): write-through to the
shared tier, one object per write task, reads from any host, a host's tier 1 lost.

Hosts are simulated on this machine: this process is host ``ha``; host ``hb`` is a child
process in a mount namespace of its own, where its own directory is mounted at the tier-1
path every host uses (``tests/support.py:on_host``). Everything runs against the real Ceph
radosgw of the session (``s3_root``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pytest

from tier_store import (
    ConfigError,
    CorruptLog,
    CorruptSegment,
    InvalidArgument,
    Store,
    read_counts,
)
from tier_store.entries import AppendEntry, ChunkRecord, decode, entry_body, signed
from tier_store.ids import SEQ_SPAN

from .support import can_unshare, host_job

pytestmark = pytest.mark.skipif(not can_unshare(), reason="simulated hosts need root and "
                                "unshare (a mount namespace per host)")

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


@pytest.fixture
def shared(s3_root, tmp_path, monkeypatch):
    """(root, config, the tier-1 path, host hb's own tier-1 directory) of a new shared store
    with topic ``t`` of 3 partitions; this process is host ``ha``."""
    monkeypatch.setenv("PAFKA_HOST_ID", "ha")
    conf = {"storage.tiers.types": "NVME,REMOTE",
            "storage.tiers.first.paths": str(tmp_path / "tier1"),
            "storage.tiers.second.paths": f"{s3_root}-shared",
            "log.segment.bytes": "256k"}
    with Store.open(s3_root, conf) as s:
        s.create_topic("t", SCHEMA, 3)
    return s3_root, conf, str(tmp_path / "tier1"), str(tmp_path / "hb-tier1")


def _rows(start: int, n: int) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.table({"id": ids, "v": ids})


def _read(store: Store) -> tuple[int, int]:
    t = store.topic("t")
    rows = total = 0
    for p in range(t.partitions):
        for b in t.read(p, 0):
            rows += b.num_rows
            total += sum(b.column(0).to_pylist())
    return rows, total


def _bundles(store: Store, topic: str = "t") -> list[str]:
    shared = store.shared
    assert shared is not None
    d = shared.bundle_dir(topic, store.topic(topic).id)
    fs = shared.tier.fs
    return sorted(fs.ls(d, refresh=True)) if fs.exists(d) else []


def test_a_write_task_uploads_one_object_for_all_its_partitions(shared):
    root, conf, _, _ = shared
    with Store.open(root, conf) as s:
        t = s.topic("t")
        refs = t.write_chunks(_rows(0, 3000), key="id")
        assert len({r.partition for r in refs}) == 3
        assert all(r.obj is None and r.host == "ha" for r in refs)
        assert _bundles(s) == []
        shared_refs = t.share(refs)
        objects = {r.obj for r in shared_refs}
        assert len(objects) == 1 and len(_bundles(s)) == 1
        # Each chunk's place in the object: back to back, in the task's order.
        assert [r.opos for r in shared_refs] == \
            [sum(x.length for x in refs[:i]) for i in range(len(refs))]
        assert t.share(shared_refs) == shared_refs  # shared already: nothing uploaded
        t.commit(shared_refs)
        entry = json.loads(entry_body(t.log.commit_log.store.read(t.version)))
        assert {c["obj"] for c in entry["chunks"]} == objects
        assert {c["host"] for c in entry["chunks"]} == {"ha"}
        assert _read(s) == (3000, sum(range(3000)))
        # A commit shares what was not shared yet: Topic.append works as ever.
        t.append(_rows(3000, 300), key="id")
        assert len(_bundles(s)) == 2
        assert _read(s) == (3300, sum(range(3300)))


def test_each_host_reads_its_own_copies_and_the_shared_tier_for_the_rest(shared):
    root, conf, tier1, hb = shared
    with Store.open(root, conf) as s:
        s.topic("t").append(_rows(0, 2000), key="id")
    wrote = host_job("hb", hb, tier1, "write", root, json.dumps(conf), "t", "2000", "1000")
    assert len(wrote["objects"]) == 1
    # Host numbers keep the hosts' segment numbers apart without asking each other.
    assert all(q // SEQ_SPAN == 2 for q in wrote["seqs"]), wrote
    expect = (3000, sum(range(3000)))
    on_b = host_job("hb", hb, tier1, "read", root, json.dumps(conf), "t")
    assert (on_b["rows"], on_b["sum"]) == expect
    assert on_b["local_chunks"] == 3 and on_b["remote_chunks"] == 3, on_b
    with Store.open(root, conf, create=False) as s:
        before = read_counts()
        assert _read(s) == expect
        after = read_counts()
    assert after["local_chunks"] - before["local_chunks"] == 3
    assert after["remote_chunks"] - before["remote_chunks"] == 3


def test_each_host_counts_its_own_tier_1_only(shared):
    # Every host has a tier 1 of its own: `pafka tiers` and the service's fill on host ha
    # must not count the segments host hb holds on its disk.
    root, conf, tier1, hb = shared
    with Store.open(root, conf) as s:
        s.topic("t").append(_rows(0, 2000), key="id")
        mine = s.tier_usage()[0]
    host_job("hb", hb, tier1, "write", root, json.dumps(conf), "t", "2000", "1000")
    with Store.open(root, conf, create=False) as s:
        segs = [x for x in s.topic("t").state().segments.values() if x.tier == 1]
        assert {x.host for x in segs} == {"ha", "hb"}  # both hosts' segments are in tier 1
        usage = s.tier_usage()[0]
        assert (usage["segments"], usage["used"]) == (mine["segments"], mine["used"])
        assert usage["segments"] < len(segs)


def test_a_host_that_lost_its_tier_1_reads_everything_from_the_shared_tier(shared):
    root, conf, tier1, hb = shared
    with Store.open(root, conf) as s:
        s.topic("t").append(_rows(0, 2000), key="id")
    host_job("hb", hb, tier1, "write", root, json.dumps(conf), "t", "2000", "1000")
    shutil.rmtree(tier1)  # host ha's tier 1, claim, pointers and all
    shutil.rmtree(hb)
    expect = (3000, sum(range(3000)))
    on_b = host_job("hb", hb, tier1, "read", root, json.dumps(conf), "t")
    assert (on_b["rows"], on_b["sum"]) == expect and on_b["local_chunks"] == 0, on_b
    with Store.open(root, conf, create=False) as s:
        assert _read(s) == expect
        # The host writes again: its tier 1 is made and claimed anew, new segments follow.
        s.topic("t").append(_rows(3000, 500), key="id")
        assert _read(s) == (3500, sum(range(3500)))


def test_a_chunk_written_on_another_host_is_shared_there_not_here(shared):
    root, conf, _, _ = shared
    with Store.open(root, conf) as s:
        t = s.topic("t")
        refs = t.write_chunks(_rows(0, 100), partition=0)
        elsewhere = [r.__class__(**{**r.to_dict(), "host": "hb"}) for r in refs]
        with pytest.raises(InvalidArgument, match="written on host hb can only be shared there"):
            t.commit(elsewhere)
        assert t.latest_offsets() == {0: 0, 1: 0, 2: 0}


def test_an_uploaded_object_that_no_longer_matches_is_corrupt_not_rows(shared):
    root, conf, tier1, hb = shared
    host_job("hb", hb, tier1, "write", root, json.dumps(conf), "t", "0", "1000")
    with Store.open(root, conf, create=False) as s:
        [url] = _bundles(s)
        fs = s.shared.tier.fs
        data = bytearray(fs.cat_file(url))
        data[len(data) // 2] ^= 0x40
        fs.pipe_file(url, bytes(data))
        with pytest.raises(CorruptSegment, match="does not match its checksum"):
            _read(s)


def test_two_local_tiers_on_a_shared_store_are_refused(s3_root, tmp_path):
    conf = {"storage.tiers.types": "NVME,HDD,REMOTE",
            "storage.tiers.first.paths": str(tmp_path / "a"),
            "storage.tiers.second.paths": str(tmp_path / "b"),
            "storage.tiers.3.paths": f"{s3_root}-shared"}
    with pytest.raises(ConfigError, match="storage.tiers.types=NVME,HDD,REMOTE.*two tiers"):
        Store.open(s3_root, conf)


def test_hosts_racing_for_numbers_each_get_their_own(shared):
    root, conf, _, _ = shared
    code = ("import sys; from tier_store import Store; "
            "s = Store.open(sys.argv[1], __import__('json').loads(sys.argv[2])); "
            "print(s.shared.number)")
    procs = [subprocess.Popen([sys.executable, "-c", code, root, json.dumps(conf)],
                              env={**os.environ, "PAFKA_HOST_ID": f"h{i % 3}"},
                              stdout=subprocess.PIPE, text=True) for i in range(6)]
    numbers = {}
    for i, p in enumerate(procs):
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        numbers.setdefault(f"h{i % 3}", set()).add(int(out.strip()))
    # One number per host id, whichever of its processes won; distinct between hosts.
    assert all(len(v) == 1 for v in numbers.values()), numbers
    assert len({next(iter(v)) for v in numbers.values()}) == 3, numbers


@pytest.mark.parametrize("field, value, why", [
    ("obj", "../../etc/passwd", "obj is '../../etc/passwd', not 32 lowercase hex digits"),
    ("obj", 7, "not 32 lowercase hex digits"),
    ("host", "a/b", "host is 'a/b', not 1 to 63 letters"),
    ("opos", -1, "opos is -1"),
])
def test_names_of_hosts_and_objects_in_entries_are_validated(field, value, why):
    good = ChunkRecord(0, SEQ_SPAN, 1, 4096, 100, 0, 10, 1, None, None, "ha", "0" * 32, 0)
    body = json.loads(entry_body(AppendEntry(1, (good,)).encode(3, "x")))
    body["chunks"][0][field] = value
    data = signed(json.dumps(body).encode(), 3, "x")
    with pytest.raises(CorruptLog, match=why.replace("(", r"\(")):
        decode(data, "entry 3", 3, "x")


def test_a_single_host_store_writes_entries_as_before(tmp_path):
    with Store.open(tmp_path / "s") as s:
        t = s.create_topic("t", SCHEMA, 1)
        t.append(_rows(0, 10))
        assert s.shared is None
        chunk = json.loads(entry_body(t.log.commit_log.store.read(1)))["chunks"][0]
        assert not {"host", "obj", "opos"} & set(chunk) and chunk["seq"] == 0


def test_a_local_copy_is_checked_even_when_reads_trust_their_bytes(shared):
    root, conf, _, _ = shared
    with Store.open(root, conf) as s:
        t = s.topic("t")
        t.append(_rows(0, 3000), key="id")
        plan = t.plan_read(0, 0)
        c = plan.chunks[0]
        assert c.host == "ha" and c.elsewhere
        with open(c.path, "r+b") as f:  # another file's bytes under the copy's name
            f.seek(c.pos + c.length // 2)
            f.write(b"\xff" * 64)
        rows = sum(b.num_rows for b in t.read(0, 0, verify=False))
        assert rows == t.latest_offsets()[0] and _read(s)[1] == sum(range(3000))


def test_a_malformed_shared_reference_is_refused_before_publishing(shared):
    root, conf, _, _ = shared
    with Store.open(root, conf) as s:
        t = s.topic("t")
        [ref] = t.share(t.write_chunks(_rows(0, 10), partition=1))
        bad = ref.__class__(**{**ref.to_dict(), "obj": "../../elsewhere"})
        with pytest.raises(InvalidArgument, match="obj is '../../elsewhere'"):
            t.commit([bad])
        assert t.version == 0
        with pytest.raises(CorruptLog, match="not 32 lowercase hex"):
            s.shared.bundle_dir("t", "../other")


def test_check_on_a_shared_store_checks_objects_not_other_hosts_caches(shared):
    root, conf, tier1, hb = shared
    with Store.open(root, conf) as s:
        s.topic("t").append(_rows(0, 2000), key="id")
    host_job("hb", hb, tier1, "write", root, json.dumps(conf), "t", "2000", "1000")
    with Store.open(root, conf, create=False) as s:
        [report] = s.check()
        assert report.ok and report.chunks == 6 and report.bytes_verified > 0, report
        # This host's caches evicted (or lost): nothing is missing, every object verified.
        shutil.rmtree(tier1)
    with Store.open(root, conf, create=False) as s:
        again = s.check()[0]
        shared_bytes = sum(int(r["length"]) for p in range(3)
                           for r in s.topic("t").state().part(p).chunks.rows())
        # The objects hold every chunk; the first check verified this host's copies too.
        assert again.ok and again.bytes_verified == shared_bytes < report.bytes_verified
        [first, second] = _bundles(s)
        fs = s.shared.tier.fs
        data = bytearray(fs.cat_file(first))
        data[len(data) // 2] ^= 0x40
        fs.pipe_file(first, bytes(data))
        fs.rm(second)
        damaged = s.check()[0]
        assert any("does not match its checksum" in p and first.split("/")[-1] in p
                   for p in damaged.problems), damaged.problems
        assert any("is missing" in p and second.split("/")[-1] in p
                   for p in damaged.problems), damaged.problems
        quick = s.check(verify=False)[0]  # no checksums: the missing object still shows
        assert [p for p in quick.problems if "is missing" in p]
        assert not [p for p in quick.problems if "checksum" in p]
