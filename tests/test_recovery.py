import os

from tier_store import Store
from tier_store.recovery import check_topic

from .conftest import SCHEMA, make_batch


def _store(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=2)
    for i in range(30):
        t.append(make_batch(i * 300, 300), key="key")
    return s, t


def test_check_of_a_healthy_topic_verifies_every_chunk(tmp_path):
    s, t = _store(tmp_path)
    r = check_topic(t)
    assert r.ok, r.problems
    assert r.chunks == 60 and r.segments == len(t.segments())
    assert r.bytes_verified == sum(seg.bytes for seg in t.segments())


def test_check_reports_a_flipped_byte_with_file_and_offsets(tmp_path):
    s, t = _store(tmp_path)
    seg = t.segments()[1]
    with open(seg.path, "r+b") as f:
        f.seek(5000)
        b = f.read(1)
        f.seek(5000)
        f.write(bytes([b[0] ^ 0xFF]))
    r = check_topic(Store.open(tmp_path).topic("t"))
    assert len(r.problems) == 1
    assert seg.path in r.problems[0] and "does not match its checksum" in r.problems[0]


def test_check_reports_a_missing_segment_file(tmp_path):
    s, t = _store(tmp_path)
    seg = t.segments()[0]
    os.unlink(seg.path)
    r = check_topic(Store.open(tmp_path).topic("t"))
    assert any("is missing" in p and seg.id in p for p in r.problems)
