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


@pytest.mark.parametrize("script", ["tiering_bench.py", "store_bench.py"])
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


def test_default_run_rewrites_no_tracked_file(tmp_path):
    before = tracked_state()
    r = run("store_bench.py", "--records", "2000", "--batch", "500", "--repeat", "1",
            "--commits", "2", "4")
    assert r.returncode == 0, r.stderr
    assert "## Tier store" in r.stdout and "verify=False" in r.stdout
    assert tracked_state() == before
    r = run("store_bench.py", "--records", "2000", "--batch", "500", "--repeat", "1",
            "--commits", "2", "4", "--out", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "out" / "RESULTS.md") as f:
        assert "<!-- store-bench:start -->" in f.read()
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
        tb.install_throttle(bucket, 1e9, [tiered_hdd, alone_hdd], follow_selection=True)
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
