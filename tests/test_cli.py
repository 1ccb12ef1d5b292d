import os
import subprocess

from tier_store import Store

from .conftest import ROOT, SCHEMA, make_batch

PAFKA = os.path.join(ROOT, ".venv", "bin", "pafka")


def _pafka(*args):
    return subprocess.run([PAFKA, *args], capture_output=True, text=True, timeout=120)


def test_version():
    r = _pafka("--version")
    assert r.returncode == 0 and r.stdout.startswith("pafka ")


def test_topics_describe_and_check(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k"})
    t = s.create_topic("clicks", SCHEMA, partitions=2)
    for i in range(10):
        t.append(make_batch(i * 100, 100))
    t.set_position("g", {0: 100, 1: 0})
    r = _pafka("topics", str(tmp_path))
    assert r.returncode == 0 and "clicks\tpartitions=2" in r.stdout
    r = _pafka("describe", str(tmp_path), "clicks")
    assert r.returncode == 0 and "partition 1: offsets 0..500" in r.stdout
    assert "group g" in r.stdout and "lag 900" in r.stdout
    r = _pafka("check", str(tmp_path))
    assert r.returncode == 0 and "clicks: version" in r.stdout and ": ok" in r.stdout
    seg = t.segments()[0]
    with open(seg.path, "r+b") as f:
        f.seek(seg.bytes // 2 + 4096)
        f.write(b"\x00\xff\x00\xff")
    r = _pafka("check", str(tmp_path))
    assert r.returncode == 1 and "does not match its checksum" in r.stdout


def test_unknown_topic_is_a_clear_error_not_a_traceback(tmp_path):
    Store.open(tmp_path).create_topic("a", SCHEMA)
    r = _pafka("describe", str(tmp_path), "b")
    assert r.returncode == 1
    assert "topic 'b' does not exist" in r.stderr and "Traceback" not in r.stderr


def test_migrate_once_moves_down_and_tiers_reports_it(tmp_path, shm_dir):
    s = Store.open(tmp_path, {
        "log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
        "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
        "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0, "log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA)
    for i in range(120):
        t.append(make_batch(i * 200, 200))
    r = _pafka("migrate", str(tmp_path), "--set", "storage.migrate.threshold=0.25")
    assert r.returncode == 0, r.stderr
    assert "segments" in r.stdout and "down" in r.stdout
    r = _pafka("tiers", str(tmp_path))
    assert "migration: 1 runs" in r.stdout
    assert len([x for x in Store.open(tmp_path).topic("t").segments() if x.tier == 2]) >= 4
    r = _pafka("migrate", str(tmp_path), "--set", "log.segment.bytes=1m")
    assert r.returncode == 1 and "conflicts with the store" in r.stderr
