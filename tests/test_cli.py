import os
import subprocess

import pytest

from tier_store import ConfigError, PafkaError, Store

from .conftest import ROOT, SCHEMA, make_batch
from .support import fill, pmem_hdd_config
from .support import pafka as _pafka

PAFKA = os.path.join(ROOT, ".venv", "bin", "pafka")


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
    assert r.returncode == 0 and "partition 1: offsets [0, 500)" in r.stdout
    assert "group g" in r.stdout and "lag 900" in r.stdout
    r = _pafka("check", str(tmp_path))
    assert r.returncode == 0 and "clicks: version" in r.stdout and ": ok" in r.stdout
    seg = t.segments()[0]
    with open(seg.path, "r+b") as f:
        f.seek(seg.bytes // 2 + 4096)
        f.write(b"\x00\xff\x00\xff")
    r = _pafka("check", str(tmp_path))
    assert r.returncode == 1 and "does not match its checksum" in r.stdout


def test_describe_and_check_write_end_exclusive_offset_ranges_and_plurals(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k"})
    t = s.create_topic("clicks", SCHEMA)
    for i in range(10):
        t.append(make_batch(i * 100, 100))
    seg = t.segments()[0]
    r = _pafka("describe", str(tmp_path), "clicks")
    assert f"segment {seg.id:>8} tier 1 FILE  offsets [0, {seg.end_offset})" in r.stdout
    assert ".." not in r.stdout
    with open(seg.path, "r+b") as f:
        f.seek(seg.bytes // 2 + 4096)
        f.write(b"\x00\xff\x00\xff")
    r = _pafka("check", str(tmp_path))
    assert r.returncode == 1 and "verified: 1 problem\n" in r.stdout
    problem = next(line for line in r.stdout.splitlines() if "checksum" in line)
    assert "offsets [" in problem and ")" in problem and ".." not in problem


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
    assert "migration: 1 run," in r.stdout
    # The policy's own measure of tier 1: segments per pool file, against its threshold.
    assert "migration fill" in r.stdout and "segments per pool file" in r.stdout
    assert len([x for x in Store.open(tmp_path).topic("t").segments() if x.tier == 2]) >= 4
    r = _pafka("migrate", str(tmp_path), "--set", "log.segment.bytes=1m")
    assert r.returncode == 1 and "conflicts with the store" in r.stderr


def _tiered(root, shm_dir, n=120):
    """A tiered store (pmem tier 1 of 16 pool files, disk tier 2) with one filled topic."""
    s = Store.open(root, pmem_hdd_config(shm_dir, **{"log.cleanup.grace.ms": 0}))
    return s, fill(s, n)


def _usage_error(r, *needles):
    """A usage error: exit 2, argparse's usage line, then the problem."""
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "usage: pafka groups" in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


def _one_line_error(r, *needles):
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("pafka: ")
    for n in needles:
        assert n in r.stderr, r.stderr


@pytest.mark.parametrize("command", [["topics"], ["tiers"], ["describe", "{root}", "t"],
                                     ["check"], ["migrate"], ["groups"],
                                     ["create-topic", "{root}", "t", "--schema", "a long"],
                                     ["add-partitions", "{root}", "t", "--add", "1"],
                                     ["config", "{root}", "t"],
                                     ["produce", "{root}", "t", "--from", "-", "--format",
                                      "csv"]])
def test_commands_other_than_demo_never_create_a_store(tmp_path, command):
    root = tmp_path / "mistyped"
    args = [a.format(root=root) for a in command]
    r = _pafka(*args) if "{root}" in command else _pafka(*args, str(root))
    _one_line_error(r, f"no store at {root} (no _store.json")
    assert not root.exists()


def test_a_directory_a_file_or_an_empty_root_is_not_taken_for_a_store(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("mine")
    _one_line_error(_pafka("topics", str(plain)), f"no store at {plain} (no _store.json)")
    assert sorted(os.listdir(plain)) == ["notes.txt"]
    _one_line_error(_pafka("describe", str(plain / "notes.txt"), "t"),
                    "not a directory")
    r = subprocess.run([PAFKA, "topics", ""], capture_output=True, text=True, cwd=plain)
    _one_line_error(r, "store root is empty")
    assert sorted(os.listdir(plain)) == ["notes.txt"]


@pytest.mark.parametrize("content,what", [
    (b'{"format": 1}', "config is missing"),
    (b"[]", "found a JSON array"),
    (b'{"format": 1, "config": [], "layout": {}}', "config is a JSON array"),
    (b'{"format": 1, "config": {}, "layout": {}}', "layout.tier.paths is missing"),
    (b'{"format": 1, "config": {}, "layout": {"tier.paths": ["t"], "tier.relocations": [-1]}}',
     "layout.tier.relocations is [-1], not a list of at most 1 non-negative integers"),
    (b'{"format": 7, "config": {}, "layout": {"tier.paths": []}}',
     "unsupported store format 7"),
    (b"{not json", "not JSON"),
    (b'{"format": 1, "config": {"log.segment.bytes": "\xff"}}', "not JSON"),
])
def test_a_damaged_store_file_is_a_one_line_error_naming_it(tmp_path, content, what):
    (tmp_path / "_store.json").write_bytes(content)
    _one_line_error(_pafka("topics", str(tmp_path)), str(tmp_path / "_store.json"), what)


def test_an_os_error_is_a_one_line_error_naming_the_path(tmp_path):
    Store.open(tmp_path).create_topic("a", SCHEMA)
    os.rmdir(tmp_path / "tier-1")
    (tmp_path / "tier-1").write_text("not a directory")  # the tier's directory is a file
    _one_line_error(_pafka("tiers", str(tmp_path)), str(tmp_path / "tier-1"))


def test_verbose_works_after_the_command_and_shows_the_traceback(tmp_path):
    # A _store.json Store.open cannot use (its layout lacks the tier paths): whatever the
    # store raises, the CLI prints one line, and the traceback with -v.
    (tmp_path / "_store.json").write_text('{"format": 1, "config": {}, "layout": {}}')
    r = _pafka("topics", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
    r = _pafka("topics", str(tmp_path), "-v")
    assert r.returncode == 1 and "Traceback" in r.stderr
    r = _pafka("-v", "topics", str(tmp_path))
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_help_shows_no_markup():
    r = _pafka("--help")
    assert r.returncode == 0 and "``" not in r.stdout and "The pafka command" in r.stdout


def test_a_closed_pipe_ends_the_command_quietly(tmp_path):
    s = Store.open(tmp_path, {"log.segment.bytes": "64k"})
    t = s.create_topic("clicks", SCHEMA, partitions=2)
    for i in range(40):
        t.append(make_batch(i * 100, 100))
    p = subprocess.Popen([PAFKA, "describe", str(tmp_path), "clicks"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the command writes (as `| head -1` does)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1 and err == b""


def test_migrate_skips_a_move_whose_segment_file_is_missing_and_goes_on(tmp_path, shm_dir):
    _, t = _tiered(tmp_path, shm_dir)
    oldest = t.segments()[0]
    assert oldest.sealed and oldest.tier == 1
    os.unlink(oldest.path)
    r = _pafka("migrate", str(tmp_path), "--set", "storage.migrate.threshold=0.25")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert oldest.path in r.stderr  # the skipped move is reported, naming the file
    assert "1 skipped" in r.stdout
    after = {x.id: x.tier for x in Store.open(tmp_path).topic("t").segments()}
    assert after[oldest.id] == 1 and list(after.values()).count(2) >= 3


def test_migrate_follow_reports_a_failed_run_and_keeps_running(tmp_path, shm_dir, monkeypatch,
                                                               capsys):
    from migration import MigrationService
    from pafka_source import cli
    _tiered(tmp_path, shm_dir, n=10)
    runs = []

    def run_once(self):
        runs.append(1)
        if len(runs) == 1:
            raise FileNotFoundError(2, "No such file or directory", "/gone/00001.seg")
        raise KeyboardInterrupt  # ends --follow, as Ctrl-C does

    monkeypatch.setattr(MigrationService, "run_once", run_once)
    rc = cli.main(["migrate", str(tmp_path), "--follow",
                   "--set", "storage.migrate.interval.ms=1"])
    err = capsys.readouterr().err
    assert rc == 0 and len(runs) == 2
    assert "migration run failed: /gone/00001.seg: No such file or directory" in err


def test_set_refuses_tier_sizes_and_paths(tmp_path, shm_dir):
    _tiered(tmp_path, shm_dir, n=10)
    pool = sorted(os.listdir(os.path.join(shm_dir, "_pool")))
    for item in ("storage.tiers.first.sizes=2m", "storage.tiers.1.sizes=512k",
                 "storage.tiers.second.paths=/tmp/elsewhere", "storage.tiers.3.paths=/tmp/x"):
        r = _pafka("migrate", str(tmp_path), "--set", item)
        _one_line_error(r, item.split("=")[0], "fixed when the store is created")
    assert sorted(os.listdir(os.path.join(shm_dir, "_pool"))) == pool  # the pool is unchanged


def test_resize_grows_and_shrinks_a_pmem_pool_for_every_later_open(tmp_path, shm_dir):
    _tiered(tmp_path, shm_dir, n=60)
    # An open naming another size is refused: it used to grow the pool on disk while
    # _store.json kept the old size, and `tiers` then showed a negative count in use.
    with pytest.raises(ConfigError, match=r"storage\.tiers\.1\.sizes=2097152 conflicts .*"
                                          r"capacity of 1048576 bytes.*pafka resize"):
        Store.open(tmp_path, {"storage.tiers.first.sizes": "2m"})
    pool = os.path.join(shm_dir, "_pool")
    assert len([n for n in os.listdir(pool) if n.endswith(".pool")]) < 16
    r = _pafka("resize", str(tmp_path), "1", "2m")
    assert r.returncode == 0, r.stderr
    assert "1.0 MiB -> 2.0 MiB; pool 16 -> 32 files (+16)" in r.stdout
    s = Store.open(tmp_path)
    assert s.tiers[0].capacity == 2 * 1024 * 1024 and s.tiers[0].pool_size == 32
    used = s.tier_usage()[0]
    in_use = used["pool_files"] - used["pool_free"]
    assert used["pool_files"] == 32 and in_use == used["segments"] > 1
    assert f"pool {in_use}/32 files in use" in _pafka("tiers", str(tmp_path)).stdout
    # Shrinking gives up free pool files only; below the segments it needs, it is refused.
    r = _pafka("resize", str(tmp_path), "1", "64k")
    _one_line_error(r, f"holds {in_use} segments; a pool of 1 files", "pafka migrate")
    r = _pafka("resize", str(tmp_path), "1", str(in_use * 64 * 1024))
    assert r.returncode == 0 and f"pool 32 -> {in_use} files (-{32 - in_use})" in r.stdout
    assert Store.open(tmp_path).tier_usage()[0]["pool_free"] == 0
    assert f"pool {in_use}/{in_use} files in use" in _pafka("tiers", str(tmp_path)).stdout
    _one_line_error(_pafka("resize", str(tmp_path), "1", "1000t"), "its filesystem has",
                    "free")
    assert Store.open(tmp_path).tiers[0].pool_size == in_use  # nothing changed
    _one_line_error(_pafka("resize", str(tmp_path), "3", "1g"), "has no tier 3")
    _one_line_error(_pafka("resize", str(tmp_path), "1", "lots"),
                    "storage.tiers.first.sizes", "a size in bytes")


def test_relocate_points_a_tier_at_its_moved_directory(tmp_path, shm_dir):
    tier = os.path.join(shm_dir, "a")
    s, t = _tiered(tmp_path, tier, n=40)
    segments = len([x for x in t.segments() if x.tier == 1])
    s.close()
    moved = os.path.join(shm_dir, "b")
    _one_line_error(_pafka("relocate", str(tmp_path), "1", moved), "no such directory")
    os.rename(tier, moved)
    r = _pafka("relocate", str(tmp_path), "1", moved)
    assert r.returncode == 0, r.stderr
    assert f"tier 1: {tier} -> {moved}; {segments} segments" in r.stdout
    assert "Traceback" not in r.stderr
    with Store.open(tmp_path) as s:
        assert s.tiers[0].path == moved
        assert sum(b.num_rows for b in s.topic("t").read(0, 0)) == 8000
    _one_line_error(_pafka("relocate", str(tmp_path), "1", str(tmp_path)), "store's root")
    _one_line_error(_pafka("relocate", str(tmp_path / "nope"), "1", moved), "no store at")


def test_migrate_with_migration_disabled_says_so(tmp_path, shm_dir):
    _tiered(tmp_path, shm_dir, n=40)
    r = _pafka("migrate", str(tmp_path), "--set", "storage.migrate.threshold=-1")
    assert r.returncode == 0 and "migration is disabled" in r.stdout
    assert "within its threshold" not in r.stdout


# -- the demo, without Spark ---------------------------------------------------------------------
@pytest.mark.parametrize("seconds", ["0", "-1", "nan", "inf"])
def test_demo_rejects_a_bad_duration_before_spark_starts(seconds, capsys):
    from pafka_source import cli
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["demo", "--seconds", seconds])
    assert e.value.code == 2 and "--seconds" in capsys.readouterr().err


@pytest.fixture
def no_spark(monkeypatch, tmp_path):
    """The demo in tmp_path with Spark replaced by a failure: nothing may get as far."""
    from pafka_source import demo

    def spark_session():
        raise AssertionError("the demo started Spark")

    monkeypatch.setattr(demo, "spark_session", spark_session)
    monkeypatch.chdir(tmp_path)
    yield demo
    import shutil
    shutil.rmtree(demo.demo_paths(str(tmp_path))[1], ignore_errors=True)


def test_demo_refuses_to_delete_a_directory_it_did_not_make(no_spark, tmp_path, capsys):
    from pafka_source import cli
    mine = tmp_path / "pafka-data"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert cli.main(["demo", "--seconds", "1"]) == 1
    err = capsys.readouterr().err
    assert "is not a store made by the demo" in err and "Move or rename it" in err
    assert (mine / "thesis.tex").read_text() == "years of work"
    Store.open(mine, {"log.segment.bytes": "64k"}).create_topic("clicks", SCHEMA)
    assert cli.main(["demo", "--seconds", "1"]) == 1  # a store, but not the demo's
    assert (mine / "thesis.tex").exists()


def test_demo_replaces_only_its_own_store(no_spark, tmp_path):
    demo = no_spark
    root, fast = demo.demo_paths(str(tmp_path))
    Store.open(root, demo.store_options(root, fast))
    assert not demo.is_demo_store(root)  # the demo's options alone do not make it the demo's
    with open(os.path.join(root, demo.DEMO_MARKER), "w") as f:
        f.write("made by `pafka demo`\n")
    assert demo.is_demo_store(root)
    demo.check_replaceable(root)
    with pytest.raises(AssertionError, match="started Spark"):
        demo.run(seconds=1)  # deleted and recreated it, marked, then started Spark
    assert os.path.isfile(os.path.join(root, demo.DEMO_MARKER))
    assert demo.is_demo_store(root)
    with pytest.raises(PafkaError, match="seconds must be a number > 0"):
        demo.run(seconds=0)


class _Query:
    """A stand-in for a StreamingQuery that never creates its topic."""

    def __init__(self, error=None, active=True):
        self.error, self.isActive, self.status = error, active, {"message": "Waiting"}

    def exception(self):
        return self.error


def test_demo_waits_for_its_topic_with_a_deadline_and_reports_the_query_error(tmp_path):
    from pafka_source.demo import wait_for_topic
    Store.open(tmp_path)
    with pytest.raises(PafkaError, match="failed before creating it: boom"):
        wait_for_topic(str(tmp_path), "clicks", _Query(error=RuntimeError("boom")))
    with pytest.raises(PafkaError, match="stopped before creating it"):
        wait_for_topic(str(tmp_path), "clicks", _Query(active=False))
    with pytest.raises(PafkaError, match="did not appear .* within 0.3 s"):
        wait_for_topic(str(tmp_path), "clicks", _Query(), timeout=0.3)
    Store.open(tmp_path).create_topic("clicks", SCHEMA)
    wait_for_topic(str(tmp_path), "clicks", _Query(), timeout=0.3)


# -- consumer groups ------------------------------------------------------------------------------
def _groups_store(root):
    """Topic 'clicks' (2 partitions of 500 records) with group g at 100 on partition 0 only."""
    s = Store.open(root, {"log.segment.bytes": "64k"})
    t = s.create_topic("clicks", SCHEMA, partitions=2)
    for i in range(10):
        t.append(make_batch(i * 100, 100), partition=i % 2)
    t.set_position("g", {0: 100})
    return t


def _json_of(capsys, *argv):
    import json

    from pafka_source import cli
    assert cli.main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_groups_lists_committed_latest_and_lag_per_partition(tmp_path, capsys):
    t = _groups_store(tmp_path)
    t.set_position("other", {1: 500})
    r = _pafka("groups", str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "GROUP", "PARTITION", "COMMITTED", "EARLIEST",
                                "LATEST", "LAG"]
    assert lines[1].split() == ["clicks", "g", "0", "100", "0", "500", "400"]
    assert lines[2].split() == ["clicks", "g", "1", "-", "0", "500", "-"]  # nothing committed
    assert lines[4].split() == ["clicks", "other", "1", "500", "0", "500", "0"]
    got = _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "g", "--json")
    assert got["groups"] == [{"topic": "clicks", "group": "g", "lag": 400, "partitions": [
        {"partition": 0, "committed": 100, "earliest": 0, "latest": 500, "lag": 400},
        {"partition": 1, "committed": None, "earliest": 0, "latest": 500, "lag": None}]}]
    _one_line_error(_pafka("groups", str(tmp_path), "clicks", "--group", "gg"),
                    "consumer group 'gg' has no committed offsets on topic 'clicks'; "
                    "groups: g, other")
    Store.open(tmp_path).create_topic("quiet", SCHEMA)
    r = _pafka("groups", str(tmp_path), "quiet")
    assert r.returncode == 0 and r.stdout == "no consumer groups on topic quiet\n"


def test_groups_reset_to_earliest_latest_an_offset_or_a_timestamp(tmp_path, capsys):
    import time
    t = _groups_store(tmp_path)
    before = t.positions()
    # As Kafka's: a reset shows its plan unless --execute is given.
    r = _pafka("groups", str(tmp_path), "clicks", "--group", "g", "--reset-to", "latest")
    assert r.returncode == 0, r.stderr
    assert "would reset consumer group g on topic clicks to latest" in r.stdout
    assert "add --execute to record it" in r.stdout and t.positions() == before
    r = _pafka("groups", str(tmp_path), "clicks", "--group", "g", "--reset-to", "latest",
               "--execute")
    assert r.returncode == 0, r.stderr
    assert t.positions()["g"] == {0: 500, 1: 500}
    assert "reset consumer group g on topic clicks to latest" in r.stdout
    assert "overwriting a reset (as in Kafka)" in r.stdout  # the running-query caveat
    # One partition only: the others keep their offsets.
    got = _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "g", "--reset-to",
                   "250", "--partition", "1", "--json", "--execute")
    assert got["partitions"] == [{"partition": 1, "before": 500, "after": 250, "latest": 500,
                                  "lag": 250}]
    assert not got["created"] and t.positions()["g"] == {0: 500, 1: 250}
    # A dry run records nothing; a group that has no position yet is created.
    got = _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "new", "--reset-to",
                   "earliest", "--dry-run", "--json")
    assert got["created"] and got["dry_run"] and "new" not in t.positions()
    r = _pafka("groups", str(tmp_path), "clicks", "--group", "new", "--reset-to", "earliest")
    assert "(a new group: check its name)" in r.stdout and "new" not in t.positions()
    _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "new", "--reset-to",
             "earliest", "--json", "--execute")
    assert t.positions()["new"] == {0: 0, 1: 0}
    # Shifted, within each partition's range (as Kafka's --shift-by).
    got = _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "g", "--shift-by",
                   "-300", "--json", "--execute")
    assert got["to"] == {"shift_by": -300} and t.positions()["g"] == {0: 200, 1: 0}
    _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "g", "--shift-by", "1000",
             "--partition", "0", "--json", "--execute")
    assert t.positions()["g"] == {0: 500, 1: 0}
    # By time: the first record committed at or after it.
    time.sleep(0.01)
    cut = int(time.time() * 1000)
    time.sleep(0.01)
    t.append(make_batch(1000, 10), partition=0)
    _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "new",
             "--reset-to-timestamp", str(cut), "--json", "--execute")
    assert t.positions()["new"] == {0: 500, 1: 500}
    # The same as an ISO 8601 time (Kafka's --to-datetime).
    import datetime
    iso = datetime.datetime.fromtimestamp(cut / 1000, datetime.UTC).isoformat()
    _json_of(capsys, "groups", str(tmp_path), "clicks", "--group", "iso", "--to-datetime",
             iso, "--json", "--execute")
    assert t.positions()["iso"] == {0: 500, 1: 500}


def test_groups_reset_and_delete_refuse_what_they_cannot_do(tmp_path):
    t = _groups_store(tmp_path)
    root = str(tmp_path)
    _usage_error(_pafka("groups", root, "--reset-to", "earliest"),
                 "--reset-to needs a topic and a group: pafka groups ROOT TOPIC --group")
    _usage_error(_pafka("groups", root, "clicks", "--delete"), "--delete needs a topic")
    _usage_error(_pafka("groups", root, "clicks", "--group", "g", "--partition", "0"),
                 "--partition applies to a reset (--reset-to")
    _usage_error(_pafka("groups", root, "clicks", "--group", "g", "--execute"),
                 "--execute applies to a reset")
    _one_line_error(_pafka("groups", root, "clicks", "--group", "nobody", "--shift-by", "5"),
                    "--shift-by: consumer group 'nobody' has no committed offset on "
                    "partition 0 of topic 'clicks'")
    r = _pafka("groups", root, "clicks", "--group", "g", "--reset-to", "0", "--execute",
               "--dry-run")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    _one_line_error(_pafka("groups", root, "clicks", "--group", "g", "--reset-to", "501"),
                    "--reset-to 501 is outside partition 0 of topic 'clicks': it allows 0 "
                    "(earliest) to 500 (latest")
    _one_line_error(_pafka("groups", root, "clicks", "--group", "g", "--reset-to", "0",
                           "--partition", "7", "--execute"),
                    "--partition 7: topic 'clicks' has partitions 0..1")
    r = _pafka("groups", root, "clicks", "--group", "g", "--reset-to", "soon")
    assert r.returncode == 2 and "expected earliest, latest or an offset" in r.stderr
    r = _pafka("groups", root, "clicks", "--group", "g", "--reset-to", "0", "--delete")
    assert r.returncode == 2 and "not allowed with argument" in r.stderr
    assert t.positions() == {"g": {0: 100}}  # nothing changed
    r = _pafka("groups", root, "clicks", "--group", "g", "--delete")
    assert r.returncode == 0 and "deleted consumer group g from topic clicks" in r.stdout
    assert t.positions() == {}
    _one_line_error(_pafka("groups", root, "clicks", "--group", "g", "--delete"),
                    "topic 'clicks' has no consumer group 'g'")


def test_tiers_shows_a_pmem_tiers_usable_capacity_its_pool(tmp_path, shm_dir, capsys):
    s = Store.open(tmp_path, {
        "log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
        "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "1m",
        "log.segment.bytes": "64k", "log.pmem.pool.ratio": 0.5})
    s.create_topic("t", SCHEMA).append(make_batch(0, 100))
    r = _pafka("tiers", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "of 1.0 MiB (usable 512.0 KiB: the pool), 1 segment, pool 1/8 files in use" in r.stdout
    assert ("note: tier 1 is PMEM: it holds segments only in its pool of pre-allocated files, "
            "so it can use log.pmem.pool.ratio (0.5) of its size") in r.stdout
    got = _json_of(capsys, "tiers", str(tmp_path), "--json")
    pmem, hdd = got["tiers"]
    assert (pmem["capacity"], pmem["usable_capacity"], pmem["pool_ratio"]) == (
        1024 * 1024, 512 * 1024, 0.5)
    assert (pmem["pool_files"], pmem["pool_in_use"]) == (8, 1)
    assert pmem["fill_basis"] == "segments per pool file" and pmem["migration_fill"] == 1 / 8
    assert hdd["usable_capacity"] == hdd["capacity"] == 0  # unbounded
    assert len(got["notes"]) == 1 and "log.pmem.pool.ratio" in got["notes"][0]


def test_migrate_on_a_full_one_tier_store_says_nothing_can_move_and_what_to_do(tmp_path,
                                                                             capsys):
    # A one-tier store over its threshold is not "within its threshold": nothing is below it.
    s = Store.open(tmp_path, {"log.segment.bytes": "64k", "storage.tiers.first.sizes": "512k"})
    t = s.create_topic("t", SCHEMA)
    for i in range(12):
        t.append(make_batch(i * 1000, 1000))
    s.close()
    m = _json_of(capsys, "migrate", str(tmp_path), "--once", "--json")
    assert not m["planned"] and m["moves"] == 0
    assert "tier 1 is" in m["idle_reason"] and "the store has one tier" in m["idle_reason"] \
        and "pafka resize" in m["idle_reason"], m["idle_reason"]


# -- --json on every command that prints data; help on every argument ------------------------------
def test_json_of_topics_describe_check_migrate_resize_and_relocate(tmp_path, shm_dir, capsys):
    import json
    tier = os.path.join(shm_dir, "a")
    s, t = _tiered(tmp_path, tier, n=120)
    t.set_position("g", {0: 100})
    root = str(tmp_path)
    assert _json_of(capsys, "topics", root, "--json") == [
        {"topic": "t", "partitions": 1, "latest": {"0": 24000}}]
    d = _json_of(capsys, "describe", root, "t", "--json")
    assert d["ddl"] == "key bigint, ts bigint, value string" and d["config"] == {}
    assert d["offsets"] == [{"partition": 0, "earliest": 0, "latest": 24000}]
    assert d["groups"] == [{"group": "g", "committed": {"0": 100}, "lag": 23900}]
    assert sum(x["end_offset"] - x["base_offset"] for x in d["segments"]) == 24000
    [c] = _json_of(capsys, "check", root, "--json")
    assert c["topic"] == "t" and c["problems"] == [] and c["bytes_verified"] > 0
    m = _json_of(capsys, "migrate", root, "--set", "storage.migrate.threshold=0.25", "--json")
    assert m["planned"] and m["segments_down"] >= 4 and m["failed_moves"] == 0
    m = _json_of(capsys, "migrate", root, "--set", "storage.migrate.threshold=0.25", "--json")
    assert not m["planned"] and "within its threshold" in m["idle_reason"]
    r = _json_of(capsys, "resize", root, "1", "2m", "--json")
    assert (r["capacity_before"], r["capacity"], r["pool_size"]) == (1 << 20, 2 << 20, 32)
    s.close()
    moved = os.path.join(shm_dir, "b")
    os.rename(tier, moved)
    r = _json_of(capsys, "relocate", root, "1", moved, "--json")
    assert (r["tier"], r["old_path"], r["new_path"]) == (1, tier, moved) and r["segments"] > 0
    # Errors stay one line on stderr with --json too.
    _one_line_error(_pafka("describe", root, "nope", "--json"), "topic 'nope' does not exist")
    assert json.loads(_pafka("check", root, "--topic", "t", "--json").stdout)[0]["topic"] == "t"


def test_migrate_follow_json_writes_one_object_per_line(tmp_path, shm_dir):
    import json
    _tiered(tmp_path, shm_dir, n=120)
    p = subprocess.Popen([PAFKA, "migrate", str(tmp_path), "--follow", "--json", "--set",
                          "storage.migrate.threshold=0.25", "--set",
                          "storage.migrate.interval.ms=200"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        events = [json.loads(p.stdout.readline())]
        while not any(e["event"] == "moved" for e in events):
            line = p.stdout.readline()
            assert line, p.stderr.read()
            events.append(json.loads(line))
    finally:
        p.terminate()
        p.wait(timeout=60)
    assert events[0] == {"event": "started", "root": str(tmp_path), "interval_s": 0.2}
    moved = events[-1]
    assert moved["topic"] == "t" and moved["to_tier"] == 2 and moved["bytes"] > 0


def _parsers(parser):
    """Every parser under ``parser`` (subcommands, and their subcommands), with its name."""
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner, deeper in _parsers(sub):
                    yield f"{name} {inner}", deeper


def test_every_argument_of_every_command_has_help():
    import argparse

    from pafka_source.cli import build_parser
    bare = [f"pafka {name}: {a.dest}" for name, p in _parsers(build_parser())
            for a in p._actions
            if not a.help and not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
    assert not bare, bare
