"""The remote tier through fsspec: a file:// URL and fsspec's in-memory filesystem."""

import json
import os
import uuid

import pytest

from migration import MigrationService
from tier_store import ConfigError, PafkaError, Store, check_topic, relocate_tier

from .conftest import SCHEMA, make_batch, read_all
from .support import fill
from .support import record_fsyncs as _record_fsyncs


@pytest.fixture(params=["file", "memory"])
def remote_url(request, tmp_path):
    if request.param == "file":
        return f"file://{tmp_path}/remote"
    return f"memory://pafka-{uuid.uuid4().hex[:8]}"


def _store(tmp_path, url, **extra):
    return Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,REMOTE",
        "storage.tiers.first.sizes": "1m", "storage.tiers.second.paths": url,
        "log.segment.bytes": "64k", "log.cleanup.grace.ms": 0, **extra})


def _fill(s, n=60):
    return fill(s, n)


def test_segments_move_to_the_remote_tier_and_read_back_by_ranged_reads(tmp_path, remote_url):
    s = _store(tmp_path, remote_url)
    t = _fill(s)
    sealed = [x for x in t.segments() if x.sealed]
    s.move_segment(sealed[0].id, 2, merge_with=[x.id for x in sealed[1:3]], topic="t")
    for x in sealed[3:5]:
        s.move_segment(x.id, 2, topic="t")
    remote = [x for x in t.segments() if x.tier == 2]
    assert len(remote) == 3 and all(x.path.startswith(remote_url.split("://")[0]) for x in remote)
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == list(range(12_000))
    assert read_all(fresh, 0, 1234, 1300) == list(range(1234, 1300))
    assert check_topic(fresh).ok
    # The old local files go after the grace period; the remote copies stay.
    assert s.collect_garbage(t) == 5
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(12_000))


def test_a_segment_comes_back_up_from_the_remote_tier(tmp_path, remote_url):
    s = _store(tmp_path, remote_url)
    t = _fill(s)
    x = t.segments()[1]
    s.move_segment(x.id, 2, topic="t")
    s.move_segment(x.id, 1, topic="t")
    assert next(y for y in t.segments() if y.id == x.id).tier == 1
    assert s.collect_garbage(t) >= 1  # the remote copy, once its grace period is over
    assert read_all(t, 0) == list(range(12_000))


def test_the_service_demotes_to_a_remote_second_tier(tmp_path, remote_url):
    s = _store(tmp_path, remote_url, **{"storage.migrate.threshold": 0.3})
    _fill(s, n=150)
    done = MigrationService(s).run_once()
    assert done and {r.to_tier for r in done} == {2}
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(30_000))


def test_nothing_is_appended_to_a_remote_tier(tmp_path, remote_url):
    s = _store(tmp_path, remote_url, **{"storage.tiers.first.sizes": "128k"})
    t = s.create_topic("t", SCHEMA)
    from tier_store import StoreFull
    with pytest.raises(StoreFull):
        for i in range(100):
            t.append(make_batch(i * 200, 200))


def test_a_remote_first_tier_or_an_unknown_protocol_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="first tier cannot be REMOTE"):
        Store.open(tmp_path, {"log.channel.type": "tiered", "storage.tiers.types": "REMOTE,HDD",
                              "storage.tiers.first.paths": "memory://x"})
    with pytest.raises(PafkaError, match="cannot open remote tier.*install"):
        Store.open(tmp_path / "b", {"log.channel.type": "tiered",
                                    "storage.tiers.types": "NVME,REMOTE",
                                    "storage.tiers.second.paths": "nosuchproto://bucket/x"})


def test_a_segment_moved_to_a_local_remote_tier_is_durable_before_its_move_entry(
        tmp_path, monkeypatch):
    remote = str(tmp_path / "remote")
    s = _store(tmp_path, f"file://{remote}")
    t = _fill(s)
    seg = t.segments()[0]
    calls = _record_fsyncs(monkeypatch)
    s.move_segment(seg.id, 2, topic="t")
    synced = [path for _, path in calls]
    moved = next(x for x in t.segments() if x.id == seg.id)
    assert moved.tier == 2
    pdir = os.path.join(remote, "t", "0")
    publication = min(i for i, path in enumerate(synced)
                      if path.startswith(os.path.join(s.root, "t", "_log")))
    before = synced[:publication]
    # The file (fsynced under its temp name, then renamed), its directory, and the parents
    # of the new directories t/0/ and t/: all before the move entry is published.
    assert any(os.path.dirname(path) == pdir and path != pdir for path in before), synced
    assert {pdir, os.path.join(remote, "t"), remote} <= set(before), synced
    assert not [n for n in os.listdir(pdir) if n.startswith(".tmp-")]
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(12_000))


def test_garbage_collection_never_deletes_a_copy_a_move_is_uploading(tmp_path, remote_url):
    # One segment moves down to the remote tier and back up, over and over, while garbage
    # collection runs with no grace period. A pass that listed the segment's old remote copy
    # used to delete the new one uploaded under the same name, after its move was published.
    import threading
    import time
    s = _store(tmp_path, remote_url)
    t = _fill(s)
    x = [seg for seg in t.segments() if seg.sealed][1]
    stop = time.time() + 3
    moves, failures = [], []

    def mover():
        while time.time() < stop:
            for tier in (2, 1):
                try:
                    s.move_segment(x.id, tier, topic="t")
                    moves.append(tier)
                except PafkaError as e:  # a lost race with the collector: tried again
                    failures.append(e)

    def collector():
        while time.time() < stop:
            s.collect_garbage(t)

    threads = [threading.Thread(target=mover), threading.Thread(target=collector)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert moves.count(2) > 10, failures[:3]
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == list(range(12_000))
    assert check_topic(fresh).ok


def _at(root, url):
    return Store.open(root, {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,REMOTE",
        "storage.tiers.first.sizes": "1m", "storage.tiers.second.paths": url,
        "log.segment.bytes": "64k", "log.cleanup.grace.ms": 0})


def test_two_stores_given_one_remote_tier_never_touch_each_other_s_files(tmp_path, remote_url,
                                                                        caplog):
    # Each would take the other's remote segments for its own garbage (same topic name),
    # and their moves would write the same names.
    a = _at(tmp_path / "a", remote_url)
    ta = _fill(a, n=30)
    sealed = [x for x in ta.segments() if x.sealed]
    a.move_segment(sealed[0].id, 2, topic="t")
    b = _at(tmp_path / "b", remote_url)
    tb = _fill(b, n=30)
    with pytest.raises(ConfigError, match=f"tier 2 {remote_url}.* belongs to the store at "
                                          f"{tmp_path / 'a'} .* is another store"):
        b.move_segment([x for x in tb.segments() if x.sealed][0].id, 2, topic="t")
    assert b.collect_garbage(tb) == 0
    assert "no garbage collection on tier 2" in caplog.text
    fresh = Store.open(tmp_path / "a").topic("t")
    assert read_all(fresh, 0) == list(range(6000))
    assert check_topic(fresh).ok
    # A store moved elsewhere takes its remote claim along on its first move there.
    a.close()
    os.rename(tmp_path / "a", tmp_path / "a2")
    a2 = Store.open(tmp_path / "a2")
    a2.move_segment(sealed[1].id, 2, topic="t")
    with pytest.raises(ConfigError, match=f"belongs to the store at {tmp_path / 'a2'}"):
        b.move_segment([x for x in tb.segments() if x.sealed][0].id, 2, topic="t")
    assert read_all(Store.open(tmp_path / "a2").topic("t"), 0) == list(range(6000))


def test_a_remote_tier_claimed_from_another_host_is_never_assumed_free(tmp_path, remote_url,
                                                                      caplog):
    # Whether a store on another host still exists cannot be seen from here: its claim is
    # kept until the operator takes the tier over, by relocating it in place.
    import fsspec
    fs, base = fsspec.core.url_to_fs(remote_url)
    fs.makedirs(base, exist_ok=True)
    claim = json.dumps({"store": "x", "root": str(tmp_path / "a"), "host": "elsewhere"})
    fs.pipe_file(base.rstrip("/") + "/_pafka_store", claim.encode())
    fs.makedirs(base.rstrip("/") + "/t/0", exist_ok=True)
    fs.pipe_file(base.rstrip("/") + "/t/0/00000000000000000000.seg", b"theirs")
    s = _at(tmp_path / "a", remote_url)
    t = _fill(s, n=30)
    sealed = [x for x in t.segments() if x.sealed]
    with pytest.raises(ConfigError, match=f"on host elsewhere .* cannot be checked from host "
                                          f".*pafka relocate {tmp_path / 'a'} 2 URL"):
        s.move_segment(sealed[1].id, 2, topic="t")
    assert s.collect_garbage(t) == 0 and "no garbage collection on tier 2" in caplog.text
    assert fs.cat_file(base.rstrip("/") + "/t/0/00000000000000000000.seg") == b"theirs"
    s.close()
    relocate_tier(tmp_path / "a", 2, remote_url)
    s = Store.open(tmp_path / "a")
    s.move_segment(sealed[1].id, 2, topic="t")
    assert read_all(s.topic("t"), 0) == list(range(6000))
