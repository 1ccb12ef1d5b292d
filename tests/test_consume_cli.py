"""``pafka consume`` on real stores: formats parsed back, starting points, groups, a real
``--follow`` process stopped by SIGINT while another process appends, and bad input."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from pafka_source.cli import main
from tier_store import Store

from .conftest import PYTHON, ROOT, SCHEMA, make_batch

PAFKA = os.path.join(os.path.dirname(PYTHON), "pafka")
WAIT = 120.0


@pytest.fixture
def root(tmp_path) -> str:
    """A store with topic ``t``: keys 0..9 on partition 0 and 100..103 on partition 1."""
    path = str(tmp_path / "store")
    with Store.open(path) as s:
        t = s.create_topic("t", SCHEMA, partitions=2)
        t.append(make_batch(0, 6), partition=0)
        t.append(make_batch(6, 4), partition=0)
        t.append(make_batch(100, 4), partition=1)
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        sys.exit(main(["consume", *argv]))
    got = capsys.readouterr()
    return int(e.value.code or 0), got.out, got.err


def json_records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_json_prints_one_object_per_record_with_partition_and_offset(root, capsys):
    rc, out, err = run(capsys, root, "t", "--format", "json")
    assert rc == 0 and err.strip() == "consumed 14 records from topic t"
    recs = json_records(out)
    assert {(r["_partition"], r["_offset"], r["key"]) for r in recs} == \
        {(0, k, k) for k in range(10)} | {(1, k - 100, k) for k in range(100, 104)}
    assert all(r["value"] == f"v{r['key']}" and r["_timestamp"] > 0 for r in recs)


def test_csv_has_a_header_and_table_columns_are_aligned(root, capsys):
    rc, out, _ = run(capsys, root, "t", "--format", "csv", "--partition", "1")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rc == 0 and [r["key"] for r in rows] == ["100", "101", "102", "103"]
    assert list(rows[0]) == ["_partition", "_offset", "_timestamp", "key", "ts", "value"]
    rc, out, _ = run(capsys, root, "t", "--partition", "0")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == ["_PARTITION", "_OFFSET", "_TIMESTAMP", "key", "ts",
                                            "value"]
    assert len(lines) == 11 and len({len(line) for line in lines[1:]}) == 1
    # Numbers right-aligned: every row's key ends in the same column as the header's.
    end = lines[0].index("key") + len("key")
    assert all(line[end - 1].isdigit() and line[end] == " " for line in lines[1:])


def test_binary_values_print_in_base64_and_long_table_cells_are_cut(tmp_path, capsys):
    path = str(tmp_path / "store")
    schema = pa.schema([("id", pa.int64()), ("blob", pa.binary()), ("text", pa.string())])
    with Store.open(path) as s:
        s.create_topic("b", schema, partitions=1).append(
            pa.record_batch([pa.array([1]), pa.array([b"\x00\xff"]), pa.array(["x" * 200])],
                            schema=schema))
    _, out, _ = run(capsys, path, "b", "--format", "json")
    assert json_records(out)[0]["blob"] == "AP8=" and json_records(out)[0]["text"] == "x" * 200
    _, out, _ = run(capsys, path, "b")
    assert out.splitlines()[1].endswith("x" * 59 + "…")


def test_start_points_and_max(root, capsys):
    def keys(*args: str) -> list[int]:
        rc, out, _ = run(capsys, root, "t", "--format", "json", *args)
        assert rc == 0
        return [r["key"] for r in json_records(out)]

    assert keys("--partition", "0", "--offset", "7") == [7, 8, 9]
    assert keys("--offset", "latest") == []
    assert sorted(keys("--offset", "earliest")) == list(range(10)) + list(range(100, 104))
    assert keys("--partition", "0", "--max", "3") == [0, 1, 2]
    assert len(keys("--max", "5")) == 5
    assert len(keys("--from-time", "0")) == 14
    assert keys("--from-time", "2999-01-01T00:00:00Z") == []
    assert len(keys("--from-time", "2000-01-01")) == 14  # ISO without a zone: UTC
    # Kafka's console consumer's flags.
    assert keys("--partition", "0", "--from-beginning", "--max-messages", "2") == [0, 1]


def test_commit_times_print_as_iso_on_request_and_kafka_flags_are_answered(root, capsys):
    rc, out, _ = run(capsys, root, "t", "--format", "json", "--time", "iso", "--max", "1")
    ms = json_records(run(capsys, root, "t", "--format", "json", "--max", "1")[1])[0]
    got = json_records(out)[0]["_timestamp"]
    import datetime
    assert rc == 0 and got.endswith("Z") and datetime.datetime.fromisoformat(
        got).timestamp() * 1000 == ms["_timestamp"]
    assert main(["topics", root, "--list"]) == 0 and capsys.readouterr().out.startswith("t\t")
    rc, _, err = run(capsys, "--bootstrap-server", "localhost:9092", "t")
    assert rc == 2 and "pafka has no broker to connect to; give the store's directory" in err


def test_a_group_starts_from_its_offsets_and_commits_what_was_printed(root, capsys):
    rc, out, _ = run(capsys, root, "t", "--group", "g", "--partition", "0", "--max", "4",
                     "--format", "json")
    assert rc == 0 and [r["key"] for r in json_records(out)] == [0, 1, 2, 3]
    assert Store.open(root).topic("t").positions()["g"] == {0: 4}
    rc, out, _ = run(capsys, root, "t", "--group", "g", "--format", "json")
    assert sorted(r["key"] for r in json_records(out)) == [4, 5, 6, 7, 8, 9, 100, 101, 102, 103]
    assert Store.open(root).topic("t").positions()["g"] == {0: 10, 1: 4}
    rc, out, err = run(capsys, root, "t", "--group", "g")
    assert rc == 0 and out == "" and "consumed 0 records" in err


def test_json_is_an_alias_and_non_finite_floats_stay_valid_json(tmp_path, capsys):
    root = str(tmp_path / "store")
    with Store.open(root) as s:
        s.create_topic("f", pa.schema([("x", pa.float64())])).append(
            pa.table({"x": [1.5, float("nan"), float("inf"), -float("inf")]}))
    rc, out, _ = run(capsys, root, "f", "--json")
    assert rc == 0
    recs = [json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c}"))
            for line in out.splitlines()]
    assert [r["x"] for r in recs] == [1.5, "NaN", "Infinity", "-Infinity"]


def test_a_group_commits_each_poll_so_an_interrupt_repeats_at_most_one(root, monkeypatch):
    from pafka_source.cli import consume as command
    monkeypatch.setattr(command, "POLL_RECORDS", 4)
    s = Store.open(root)
    got: list[int] = []
    records = command.consume(s, "t", [0], group="g")
    for fb in records:
        got += fb.batch.column("key").to_pylist()
        if len(got) >= 5:
            break
    records.close()  # as Ctrl-C would: the second poll was printed in part, not committed
    assert got[:4] == [0, 1, 2, 3] and s.topic("t").positions()["g"] == {0: 4}


@pytest.mark.parametrize("args, message", [
    (["t", "--partition", "2"], "--partition 2: topic 't' has partitions 0..1"),
    (["t", "--partition", "0", "--offset", "11"],
     "--offset 11: start offset 11 is outside partition 0 of topic 't': it allows 0 (earliest) "
     "to 10 (latest)"),
    (["t", "--offset", "3"], "--offset 3 needs --partition P: topic 't' has 2 partitions"),
    (["t", "--partition", "1", "--offset", "5"], "outside partition 1"),
    (["nope"], "topic 'nope' does not exist in"),
    (["t", "--group", ""], "consumer group must be a non-empty string"),
])
def test_bad_input_is_one_line_naming_it(root, capsys, args, message):
    rc, out, err = run(capsys, root, *args)
    assert rc == 1 and out == ""
    assert err.startswith("pafka: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("args, flag", [
    (["--partition", "-1"], "--partition"), (["--partition", "x"], "--partition"),
    (["--offset", "first"], "--offset"), (["--offset", "-3"], "--offset"),
    (["--from-time", "yesterday"], "--from-time"), (["--from-time", "-5"], "--from-time"),
    (["--max", "0"], "--max"), (["--max", "many"], "--max"),
    (["--format", "xml"], "--format"), (["--offset", "1", "--from-time", "0"], "--from-time"),
    (["--group", "g", "--offset", "1"], "--group"),
    (["--group", "g", "--from-time", "0"], "--group"),
])
def test_usage_errors_exit_2_naming_the_flag(root, capsys, args, flag):
    rc, _, err = run(capsys, root, "t", *args)
    assert rc == 2 and flag in err.splitlines()[-1]


def test_the_console_command_from_outside_the_repository(root, tmp_path):
    r = subprocess.run([PAFKA, "consume", root, "t", "--format", "json", "--max", "2"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=WAIT)
    assert r.returncode == 0 and len(json_records(r.stdout)) == 2
    r = subprocess.run([PAFKA, "consume", str(tmp_path / "none"), "t"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=WAIT)
    assert r.returncode == 1 and r.stderr.startswith("pafka: no store at ")
    r = subprocess.run([PAFKA, "consume", "--help"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=WAIT)
    assert r.returncode == 0 and "--follow" in r.stdout and "--from-time" in r.stdout


WRITER = """
import sys, time
import numpy as np, pyarrow as pa
from tier_store import Store
t = Store.open(sys.argv[1]).topic("t")
for i in range(20):
    k = np.arange(1000 + i * 5, 1005 + i * 5, dtype=np.int64)
    t.append(pa.record_batch([pa.array(k), pa.array(k * 10),
                              pa.array([f"v{x}" for x in k])], names=["key", "ts", "value"]),
             partition=i % 2)
    time.sleep(0.05)
"""


def test_follow_tails_another_process_appends_until_sigint_and_commits(root, tmp_path):
    """A real ``pafka consume --follow --group`` process prints what a second process appends
    while it runs; SIGINT ends it with status 0, and the group has what was printed."""
    # From now on: what the writer commits, however long this process takes to start.
    now_ms = str(int(time.time() * 1000))
    follower = subprocess.Popen(
        [PAFKA, "consume", root, "t", "--follow", "--from-time", now_ms, "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    grouped = subprocess.Popen(
        [PAFKA, "consume", root, "t", "--follow", "--group", "tail", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        time.sleep(1.5)  # both are (most likely) running: they tail, not read a backlog
        writer = subprocess.run([PYTHON, "-c", WRITER, root], cwd=ROOT, capture_output=True,
                                text=True, timeout=WAIT)
        assert writer.returncode == 0, writer.stderr
        got: list[dict] = []
        deadline = time.monotonic() + WAIT
        while len(got) < 100 and time.monotonic() < deadline:
            line = follower.stdout.readline()
            if line:
                got.append(json.loads(line))
        assert sorted(r["key"] for r in got) == list(range(1000, 1100))
        grouped_got = []
        while len(grouped_got) < 114 and time.monotonic() < deadline:
            grouped_got.append(json.loads(grouped.stdout.readline()))
        t = Store.open(root).topic("t")
        while t.positions().get("tail") != t.latest_offsets() and time.monotonic() < deadline:
            time.sleep(0.1)  # the commit follows the printing of each batch
        assert t.positions()["tail"] == {0: 60, 1: 54}
    finally:
        for p in (follower, grouped):
            p.send_signal(signal.SIGINT)
    for p, n in ((follower, 100), (grouped, 114)):
        rest, err = p.communicate(timeout=WAIT)
        assert p.returncode == 0, err
        assert rest == "" and err.strip().endswith(f"consumed {n} records from topic t")
