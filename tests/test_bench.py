"""The benchmark scripts' plumbing (fast, no Spark): arguments are checked, a failed process
fails the run, and a default run rewrites no tracked file."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import bench_common  # noqa: E402


def run(script: str, *args: str, env: dict | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(BENCH, script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def tracked_state() -> tuple[str, dict[str, str]]:
    """``git status`` of bench/ and the hash of every tracked file under it."""
    status = subprocess.run(["git", "status", "--porcelain", "--", "bench"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    files = subprocess.run(["git", "ls-files", "bench"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    hashes = {}
    for f in files:
        with open(os.path.join(ROOT, f), "rb") as fh:
            hashes[f] = hashlib.sha256(fh.read()).hexdigest()
    return status, hashes


@pytest.mark.parametrize("script", ["tiering_bench.py", "store_bench.py", "soak.py",
                                    "scaleout_bench.py", "perf_cli_bench.py",
                                    "scale_bench.py", "validation_bench.py",
                                    "pushdown_bench.py"])
def test_help(script):
    r = run(script, "--help")
    assert r.returncode == 0, r.stderr
    assert "--write-results" in r.stdout and "--out" in r.stdout


@pytest.mark.parametrize("script, args, flag", [
    ("tiering_bench.py", ["--tier1", "0"], "--tier1"),
    ("tiering_bench.py", ["--producers", "0"], "--producers"),
    ("tiering_bench.py", ["--hdd", "-1"], "--hdd"),
    ("tiering_bench.py", ["--hdd", "nan"], "--hdd"),
    ("tiering_bench.py", ["--burst-rate", "10"], "--burst-rate"),
    ("tiering_bench.py", ["--low-rate", "50"], "--low-rate"),
    ("tiering_bench.py", ["--steady-seconds", "0"], "--steady-seconds"),
    ("tiering_bench.py", ["--out", "bench"], "--out"),
    ("tiering_bench.py", ["--out", "bench/RESULTS.md"], "--out"),
    ("store_bench.py", ["--records", "0"], "--records"),
    ("store_bench.py", ["--repeat", "0"], "--repeat"),
    ("store_bench.py", ["--batch", "x"], "--batch"),
    ("store_bench.py", ["--commits", "0", "10"], "--commits"),
    ("store_bench.py", ["--s3", "gs://bucket"], "--s3"),
    ("store_bench.py", ["--shared-commits", "0"], "--shared-commits"),
    ("soak.py", ["--minutes", "0"], "--minutes"),
    ("soak.py", ["--sample", "nan"], "--sample"),
    ("soak.py", ["--out", "bench"], "--out"),
    ("scaleout_bench.py", ["--batches", "1"], "--batches"),
    ("scaleout_bench.py", ["--rows", "x"], "--rows"),
    ("scaleout_bench.py", ["--out", "bench"], "--out"),
    ("perf_cli_bench.py", ["--records", "0"], "--records"),
    ("perf_cli_bench.py", ["--processes", "0"], "--processes"),
    ("perf_cli_bench.py", ["--batch-records", "x"], "--batch-records"),
    ("pushdown_bench.py", ["--partitions", "0"], "--partitions"),
    ("pushdown_bench.py", ["--gb", "0"], "--gb"),
])
def test_bad_arguments_name_the_flag(script, args, flag):
    r = run(script, *args)
    assert r.returncode == 2
    assert flag in r.stderr
    assert "allowed" in r.stderr or "must" in r.stderr or "expected" in r.stderr \
        or "directory" in r.stderr or "tracked" in r.stderr


def test_a_dead_process_fails_the_run():
    """A consumer that dies makes the benchmark exit non-zero naming it, and prints no
    figure."""
    r = run("tiering_bench.py", "--tier1", "16", "--hdd", "8e6", "--burst-rate", "15",
            "--low-rate", "1", "--scenario", "burst", env={"PAFKA_BENCH_CRASH": "consumer"})
    assert r.returncode != 0
    assert "FAILED" in r.stderr and "consumer" in r.stderr
    assert "predicted" not in r.stdout.split("schedule")[-1]


def test_default_run_rewrites_no_tracked_file(tmp_path, s3_server, s3_root):
    before = tracked_state()
    r = run("store_bench.py", "--records", "2000", "--batch", "500", "--repeat", "1",
            "--commits", "2", "4", "--s3", "off")
    assert r.returncode == 0, r.stderr
    assert "## Tier store" in r.stdout and "verify=False" in r.stdout
    assert tracked_state() == before
    # The commit-latency rows on the test's S3 server (the AWS variables name it).
    r = run("store_bench.py", "--records", "2000", "--batch", "500", "--repeat", "1",
            "--commits", "2", "4", "--s3", s3_root, "--shared-commits", "8",
            "--out", str(tmp_path / "out"), env=s3_server.env)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "out" / "RESULTS.md") as f:
        text = f.read()
    assert "<!-- store-bench:start -->" in text and "| 4 |" in text and "s3 p99" in text
    assert tracked_state() == before


def test_figures_go_to_a_temporary_directory_by_default(tmp_path):
    args = argparse.Namespace(write_results=False, out=None)
    out = bench_common.Output(args)
    paths = out.figure("fig.png", lambda p: open(p, "w").close())
    assert len(paths) == 1 and os.path.dirname(paths[0]) != BENCH
    assert not os.path.exists(os.path.join(BENCH, "fig.png"))
    shutil.rmtree(os.path.dirname(paths[0]))
    out = bench_common.Output(argparse.Namespace(write_results=False, out=str(tmp_path)))
    assert out.figure("fig.png", lambda p: open(p, "w").close()) == [str(tmp_path / "fig.png")]


def test_update_section_keeps_the_other_sections(tmp_path):
    path = str(tmp_path / "RESULTS.md")
    bench_common.update_section(path, "a", "one")
    bench_common.update_section(path, "b", "two")
    bench_common.update_section(path, "a", "three")
    with open(path) as f:
        text = f.read()
    assert "three" in text and "two" in text and "one" not in text


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_degenerate_measurements_stop_the_run(value):
    with pytest.raises(SystemExit) as e:
        bench_common.positive(value, "some time")
    assert "some time" in str(e.value.code)


def test_the_simulated_hdd_charges_the_file_tiers_named_for_the_store_written(
        tmp_path, shm_dir, monkeypatch):
    """``install_throttle`` goes through ``tier_store.throttle_tier_writes``: a process
    following the selection (Spark's workers) charges the file tier of the store being
    written, whichever its number, and never the pmem tier."""
    import tiering_bench as tb

    from tier_store import Store, throttle_tier_writes

    from .conftest import SCHEMA, make_batch
    charged: list[int] = []
    monkeypatch.setattr(tb.DeviceThrottle, "__call__", lambda self, n: charged.append(n))
    small = {"log.segment.bytes": "64k", "storage.tiers.first.sizes": "1m"}
    tiered_conf, tiered_hdd = tb.store_conf(True, shm_dir, small)
    alone_conf, alone_hdd = tb.store_conf(False, "", small)
    bucket = str(tmp_path / "bucket")
    try:
        assert (tiered_hdd, alone_hdd) == ([2], [1])
        tb.install_throttle(bucket, 1e9, [*tiered_hdd, *alone_hdd], follow_selection=True)
        for name, conf, hdd, charges in (("tiered", tiered_conf, [2], False),
                                         ("alone", alone_conf, [1], True)):
            with Store.open(tmp_path / name, conf) as s:
                assert tb.hdd_tiers(s) == hdd
                tb.select_hdd_tiers(bucket, tb.hdd_tiers(s))
                t = s.create_topic("t", SCHEMA)
                t.append(make_batch(0, 100))
                assert [x.tier for x in t.segments()] == [1]
                assert charged == ([x.bytes for x in t.segments()] if charges else [])
                charged.clear()
    finally:
        for n in (1, 2):
            throttle_tier_writes(None, n)


# -- bench/soak.py -------------------------------------------------------------------------------
def _soak_outputs(tmp_path, read_ids: list[int], ok: list[bool] | None = None) -> tuple[str, str]:
    """A real store holding ids 0..999 (10 batches of 100, partition 0, offset = id), the
    writer's Spark checkpoint logs for those batches, and a reader output of ``read_ids``."""
    import json
    import time

    import pyarrow as pa
    import soak_roles

    from tier_store import Store
    root, work = str(tmp_path / "store"), tmp_path / "work"
    # log.segment.ms=1: each batch rolls a segment of its own.
    conf = {"storage.tiers.first.sizes": "64m", "log.segment.bytes": "1m", "log.segment.ms": 1}
    with Store.open(root, conf, create=True) as store:
        t = store.create_topic(soak_roles.TOPIC, soak_roles.TOPIC_SCHEMA, partitions=1)
        for b in range(10):
            time.sleep(0.002)  # past log.segment.ms since the last append, however fast
            ids = list(range(b * 100, b * 100 + 100))
            t.append(pa.record_batch([pa.array(ids, pa.int64()),
                                      pa.array([soak_roles.payload(i) for i in ids])],
                                     schema=soak_roles.TOPIC_SCHEMA), partition=0)
            for log in ("offsets", "commits"):
                d = work / "writer-ckpt" / log
                d.mkdir(parents=True, exist_ok=True)
                (d / str(b)).write_text("v1\n{}\n" + json.dumps({"offset": b * 100 + 100,
                                                                "timestamp": 1000}) + "\n")
    n = len(read_ids)
    table = pa.table({"id": pa.array(read_ids, pa.int64()),
                      "_partition": pa.array([0] * n, pa.int32()),
                      "_offset": pa.array(read_ids, pa.int64()),
                      "_timestamp": pa.array([0] * n, pa.int64()),
                      "ok": pa.array(ok if ok is not None else [True] * n)})
    with pa.OSFile(str(work / "read.arrow"), "wb") as sink, \
            pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return root, str(work)


def test_the_soak_check_passes_when_the_reader_read_every_committed_id(tmp_path):
    import time

    import soak_check
    root, work = _soak_outputs(tmp_path, list(range(1000)))
    f = soak_check.check(root, work, time.time(), retention_s=3600)
    assert f["ids_committed"] == f["ids_within_horizon"] == 1000
    for side in ("store", "reader"):
        assert (f[side]["rows"], f[side]["wrong"], f[side]["duplicated"], f[side]["lost"]) \
            == (1000, 0, 0, 0), f[side]
    assert f["store"]["problems"] == []


def test_the_soak_check_counts_lost_duplicated_and_wrong_rows(tmp_path):
    """A check that cannot fail proves nothing: a reader output missing id 5, holding id 7
    twice, one row whose payload did not match (ok false) and an id never written is
    reported as such, and the run is failed."""
    import time

    import soak_check
    ids = [i for i in range(1000) if i != 5] + [7]
    ok = [i != 500 for i in ids]
    root, work = _soak_outputs(tmp_path, ids + [5000], ok + [True])
    f = soak_check.check(root, work, time.time(), retention_s=3600)
    assert f["reader"]["lost"] == 1
    assert f["reader"]["duplicated"] == 1
    assert f["reader"]["wrong"] == 2  # the bad payload, and id 5000 beyond every batch
    f.update(crashes=[], kills=[])
    assert not soak_check.passed(f)
    assert any("reader: 1 lost rows" in p for p in soak_check.problems(f))


def test_the_soak_check_allows_what_retention_deleted_before_the_reader_came(tmp_path):
    """Ids of batches planned before the retention horizon and gone from the store may be
    missing from the reader's output: counted apart, not as lost."""
    import os
    import time

    import soak_check
    root, work = _soak_outputs(tmp_path, list(range(300, 1000)))
    from tier_store import Store
    with Store.open(root) as store:  # what retention would do: the first 3 batches go
        t = store.topic("soak")
        gone = [s.id for s in t.segments() if s.end_offset <= 300]
        assert len(gone) == 3
        t.delete_segments(gone)
    old = time.time() - 7200
    for b in range(3):
        for log in ("offsets", "commits"):
            os.utime(os.path.join(work, "writer-ckpt", log, str(b)), (old, old))
    f = soak_check.check(root, work, time.time(), retention_s=3600)
    assert f["ids_within_horizon"] == 700 and f["store"]["rows"] == 700
    assert (f["reader"]["lost"], f["reader"]["deleted_before_read"]) == (0, 300)
    assert (f["store"]["lost"], f["store"]["wrong"]) == (0, 0)


@pytest.mark.slow
def test_soak_smoke_run_passes_its_check_and_rewrites_no_tracked_file(tmp_path):
    """A tiny soak (a Spark writer and a Spark reader, the migration service): the run ends
    with a passing check, a figure and a report, and no tracked file changes."""
    import json
    before = tracked_state()
    out, raw = tmp_path / "out", tmp_path / "raw.json"
    r = run("soak.py", "--minutes", "0.25", "--kill-every", "3600", "--sample", "2",
            "--out", str(out), env={"PAFKA_BENCH_JSON": str(raw)}, timeout=400)
    assert r.returncode == 0, r.stderr[-4000:]
    with open(raw) as fh:
        f = json.load(fh)
    assert f["ids_committed"] > 0 and f["ids_within_horizon"] > 0
    for side in ("store", "reader"):
        assert (f[side]["wrong"], f[side]["duplicated"], f[side]["lost"]) == (0, 0, 0)
    assert f["reader"]["rows"] >= f["ids_committed"]
    assert (out / "soak.png").stat().st_size > 0
    assert "<!-- soak:start -->" in (out / "RESULTS.md").read_text()
    assert tracked_state() == before


def test_scale_bench_runs_every_scenario_small_and_rewrites_no_tracked_file():
    before = tracked_state()
    r = run("scale_bench.py", "--commits", "1000", "--partitions", "1,8", "--topics", "4",
            "--read-gb", "0.01", "--default-write-gb", "0.01", "--driver-partitions", "8")
    assert r.returncode == 0, r.stderr
    for needle in ("## Scaling", "commit p50", "checkpoint bytes", "**Open**",
                   "| 8 |", "fresh handle, default", "fixed size", "**Memory**",
                   "**Spark driver** at 8 partitions", "**Defaults**"):
        assert needle in r.stdout, needle
    assert tracked_state() == before


def test_a_tiering_run_with_a_lake_throttles_tier_2_and_the_lake_as_one_disk(shm_dir):
    import tiering_bench as tb
    conf, hdd = tb.store_conf(True, shm_dir, {"storage.tiers.first.sizes": "1m"}, "/x/lake")
    assert hdd == [2, 3] and conf["storage.tiers.types"] == "PMEM,HDD,LAKE"
    assert conf["storage.tiers.2.sizes"] == str(2 << 20) and conf["storage.tiers.3.paths"] == \
        "/x/lake"
