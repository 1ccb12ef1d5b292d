"""``pafka perf produce|consume`` on real stores, with real processes: the figures add up
to what the store holds, the throughput cap holds, and bad input is refused."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pafka_source.cli import main
from tier_store import Store

from .conftest import PYTHON, SCHEMA, make_batch

PAFKA = os.path.join(os.path.dirname(PYTHON), "pafka")
WAIT = 300.0


@pytest.fixture
def root(tmp_path) -> str:
    path = str(tmp_path / "store")
    Store.open(path, {"log.segment.bytes": "1m"}).close()
    return path


def perf(cwd, *args: str) -> subprocess.CompletedProcess[str]:
    """The console command, run from ``cwd`` (outside the repository)."""
    return subprocess.run([PAFKA, "perf", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=WAIT)


def check_figures(r: dict, processes: int, records: int, record_bytes: int) -> None:
    """``records`` in all, shared by the processes (Kafka's --num-records)."""
    assert len(r["per_process"]) == processes
    for x in [*r["per_process"], r["total"]]:
        lat = x["latency_ms"]
        assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
        assert 0 < lat["avg"] <= lat["max"]
        assert x["records_per_s"] == pytest.approx(x["records"] / x["seconds"])
        assert x["mb_per_s"] == pytest.approx(x["bytes"] / x["seconds"] / 1e6)
        assert x["bytes"] == x["records"] * record_bytes
    assert sum(x["records"] for x in r["per_process"]) == r["total"]["records"] == records
    assert max(x["records"] for x in r["per_process"]) - \
        min(x["records"] for x in r["per_process"]) <= 1
    assert r["total"]["batches"] == sum(x["batches"] for x in r["per_process"])


def test_produce_then_consume_in_two_processes(root, tmp_path):
    r = perf(tmp_path, "produce", root, "p", "--records", "10000", "--record-size", "104",
             "--processes", "2", "--batch-records", "1000", "--json", "--create")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    # 116 bytes a record in Arrow: 8 of key, 104 of value, a 4-byte offset.
    check_figures(rep, 2, 10000, 116)
    assert rep["created_topic"] and rep["per_process"][0]["batches"] == 5
    t = Store.open(root).topic("p")
    assert t.partitions == 2 and t.latest_offsets() == {0: 5000, 1: 5000}
    # The readers share 8000 of the 10,000 records, a partition each (as a consumer group
    # deals them out), 3000 at a time: no record is read twice.
    r = perf(tmp_path, "consume", root, "p", "--records", "8000", "--processes", "2",
             "--batch-records", "3000", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    check_figures(rep, 2, 8000, 116)
    assert not rep["created_topic"]
    assert [x["partitions"] for x in rep["per_process"]] == [[0], [1]]
    assert [x["batches"] for x in rep["per_process"]] == [2, 2]  # 3000 + 1000 each
    # For people: a line, a header, a row per process and the total.
    r = perf(tmp_path, "consume", root, "p", "--records", "100")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("consume p: 100 records over 1 process")
    assert lines[1].split()[:3] == ["PROCESS", "RECORDS", "SECONDS"]
    assert lines[3].split()[:2] == ["total", "100"]
    # Then Kafka's summary line, as kafka-producer-perf-test prints it.
    assert re.fullmatch(r"100 records read, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms "
                        r"avg latency, [\d.]+ ms max latency, \d+ ms 50th, \d+ ms 95th, \d+ "
                        r"ms 99th, \d+ ms 99.9th\.", lines[4]), lines[4]
    # 100 records take milliseconds: the figures are noted as too short to mean much.
    assert re.fullmatch(r"note: the run took [\d.]+ s, too short to measure steadily: for "
                        r"about 10 s, give --records \d+", lines[5]), lines[5]


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 40)), min_size=1, max_size=6),
       st.integers(1, 6), st.data())
def test_readers_share_the_records_each_offset_once(parts, processes, data):
    from pafka_source.cli.perf import read_ranges
    earliest = {p: e for p, (e, _) in enumerate(parts)}
    latest = {p: e + n for p, (e, n) in enumerate(parts)}
    held = sum(n for _, n in parts)
    processes = min(processes, len(parts))
    records = data.draw(st.integers(0, held))
    got = read_ranges(earliest, latest, records, processes)
    assert len(got) == processes
    read = [(p, o) for i, ranges in enumerate(got) for p, s, e in ranges
            for o in range(s, e) if p % processes == i]
    assert len(read) == len(set(read)) == records == \
        sum(e - s for ranges in got for _, s, e in ranges)
    assert all(earliest[p] <= o < latest[p] for p, o in read)
    for ranges in got:  # each partition from its earliest offset, with no gap
        assert all(s == earliest[p] for p, s, _ in ranges)


def test_consume_creates_and_fills_a_missing_topic(root, capsys):
    with pytest.raises(SystemExit) as e:
        sys.exit(main(["perf", "consume", root, "fresh", "--records", "3000",
                       "--record-size", "10", "--batch-records", "500", "--json", "--create"]))
    assert e.value.code == 0
    rep = json.loads(capsys.readouterr().out)
    check_figures(rep, 1, 3000, 8 + 10 + 4)
    assert rep["created_topic"] and rep["total"]["batches"] == 6
    assert sum(Store.open(root).topic("fresh").latest_offsets().values()) == 3000


def test_the_throughput_cap_holds_per_process(root, tmp_path):
    r = perf(tmp_path, "produce", root, "p", "--records", "600", "--record-size", "8",
             "--batch-records", "50", "--throughput", "1000", "--json", "--create")
    assert r.returncode == 0, r.stderr
    total = json.loads(r.stdout)["total"]
    # 600 records at 1000/s: the last is due at 0.6 s at the earliest.
    assert total["seconds"] >= 0.55 and total["records_per_s"] <= 1100


def test_a_process_that_fails_fails_the_run_naming_it_and_why(tmp_path):
    """A full tier stops each writer: one line per process, exit 1, no figures."""
    root = str(tmp_path / "store")
    Store.open(root, {"log.segment.bytes": "64k", "storage.tiers.first.sizes": "1m"}).close()
    r = perf(tmp_path, "produce", root, "p", "--records", "20000", "--record-size", "1000",
             "--batch-records", "100", "--processes", "2", "--create")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("pafka: perf process 0 failed: no local tier has room")
    assert "; perf process 1 failed: no local tier has room" in r.stderr
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize("args, message", [
    (["consume", "{root}", "nope", "--records", "10", "--create"],
     "topic 'nope' does not exist: give --record-size to create it and fill it"),
    (["consume", "{root}", "typo", "--records", "10", "--record-size", "8"],
     "topic 'typo' does not exist (topics: other, small); check the name, or add --create"),
    (["produce", "{root}", "typo", "--records", "10", "--record-size", "8"],
     "topic 'typo' does not exist (topics: other, small); check the name, or add --create"),
    (["consume", "{root}", "small", "--records", "11"],
     "topic 'small' holds 10 records, fewer than --records 11"),
    (["produce", "{root}", "other", "--records", "1", "--record-size", "1"],
     "topic 'other' has columns (key int64, ts int64, value string); pafka perf produce "
     "writes key int64 and value binary"),
    (["produce", "{root}/missing", "p", "--records", "1", "--record-size", "1", "--create"],
     "no store at"),
    (["produce", "{root}", "p", "--records", "100000", "--record-size", "65536",
      "--batch-records", "50000", "--create"],
     "is 2 GiB or more in one append; lower --batch-records"),
])
def test_bad_input_is_one_line_naming_it(root, capsys, args, message):
    with Store.open(root) as s:
        s.create_topic("other", SCHEMA)
        s.create_topic("small", SCHEMA).append(make_batch(0, 10))
    with pytest.raises(SystemExit) as e:
        sys.exit(main(["perf", *(a.replace("{root}", root) for a in args)]))
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("pafka: ") and message in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("args, flag", [
    (["--records", "0"], "--records"), (["--records", "x"], "--records"),
    (["--record-size", "-1"], "--record-size"), (["--record-size", "1e9"], "--record-size"),
    (["--processes", "0"], "--processes"), (["--processes", "65"], "--processes"),
    (["--throughput", "0"], "--throughput"), (["--throughput", "nan"], "--throughput"),
    (["--batch-records", "0"], "--batch-records"), (["--batch-records", "y"], "--batch-records"),
])
def test_usage_errors_exit_2_naming_the_flag(root, capsys, args, flag):
    argv = ["perf", "produce", root, "p", "--records", "10", "--record-size", "8", *args]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and flag in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("argv, needle", [
    (["perf", "send", "r", "t", "--records", "1"], "invalid choice: 'send'"),
    (["perf", "produce", "r", "t"], "the following arguments are required: --records"),
])
def test_mode_and_records_are_required(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_the_bench_writes_its_section_only_where_told(tmp_path):
    """bench/perf_cli_bench.py at a tiny size: its report names both paths and goes to
    ``--out``; no tracked file changes."""
    from .test_bench import run as run_bench
    from .test_bench import tracked_state
    before = tracked_state()
    r = run_bench("perf_cli_bench.py", "--records", "4000", "--batch-records", "1000",
                  "--processes", "1", "--out", str(tmp_path / "out"), timeout=WAIT)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "out" / "RESULTS.md").read_text()
    assert "<!-- perf-cli:start -->" in text and "| file | 1 |" in text
    assert "`pafka perf produce`" in text and tracked_state() == before


def test_produce_without_a_record_size_is_a_usage_error(root, capsys):
    with pytest.raises(SystemExit) as e:
        main(["perf", "produce", root, "p", "--records", "10"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: pafka perf" in err
    assert err.splitlines()[-1].endswith("produce needs --record-size B (the bytes of each "
                                         "record's value)")
