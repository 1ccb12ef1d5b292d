"""``pafka create-topic``, ``add-partitions``, ``config`` and ``produce`` on real stores: run
in-process through ``pafka_source.cli.main`` and as the installed command from a directory
outside the repository."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pafka_source import cli
from pafka_source.schema_text import parse_schema, schema_text
from tier_store import Store

from .conftest import PYTHON, SCHEMA, make_batch

PAFKA = os.path.join(os.path.dirname(PYTHON), "pafka")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """``pafka argv`` in this process: exit status, stdout, stderr."""
    rc = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def as_json(capsys, *argv: str):
    rc, out, err = run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def one_line_error(capsys, argv, *needles: str, rc: int = 1) -> str:
    """``argv`` fails with exit ``rc`` and one line ``pafka: ...`` holding ``needles``."""
    got, out, err = run(capsys, *argv)
    assert got == rc, (out, err)
    assert err.startswith("pafka: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in err, err
    return err


def installed(cwd, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console command, run from ``cwd``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([PAFKA, *map(str, argv)], capture_output=True, text=True, cwd=cwd,
                          input=stdin, env=env, timeout=120)


@pytest.fixture
def root(tmp_path):
    """A store with topic "t" (key long, ts long, value string; 2 partitions)."""
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    s.create_topic("t", SCHEMA, partitions=2)
    s.close()
    return tmp_path / "store"


def records(root, topic: str = "t") -> list[dict]:
    t = Store.open(root, create=False).topic(topic)
    rows = []
    for p in range(t.partitions):
        for b in t.read(p, 0):
            rows += b.to_pylist()
    return sorted(rows, key=lambda r: r["key"])


# -- create-topic -----------------------------------------------------------------------------
DDL = ("id bigint NOT NULL, `page url` string, n int, s smallint, b tinyint, f float, "
       "d double, ok boolean, raw binary, day date, at timestamp, local timestamp_ntz, "
       "price decimal(12,2), tags array<string>, attrs map<string,bigint>, "
       "who struct<name: string, age: int NOT NULL>")


def test_create_topic_from_a_schema_string_then_describe_it(tmp_path, capsys):
    root = tmp_path / "store"
    made = as_json(capsys, "create-topic", root, "events", "--schema", DDL, "--partitions",
                   "3", "--config", "retention.ms=3600000", "--create-store",
                   "--store-config", "log.segment.bytes=128k")
    assert made["topic"] == "events" and made["partitions"] == 3
    assert made["schema"] == DDL
    assert made["config"] == {"log.retention.ms": 3600000}
    s = Store.open(root, create=False)
    assert s.config["log.segment.bytes"] == 128 * 1024  # --store-config laid it out
    t = s.topic("events")
    assert t.schema.equals(parse_schema(DDL)) and t.setting("log.retention.ms") == 3600000
    assert t.schema.field("id").nullable is False
    assert t.schema.field("at").type == pa.timestamp("us", tz="UTC")
    d = as_json(capsys, "describe", root, "events")
    assert d["ddl"] == schema_text(t.schema) and d["config"] == {"log.retention.ms": 3600000}
    assert [p["partition"] for p in d["offsets"]] == [0, 1, 2]
    rc, out, _ = run(capsys, "create-topic", root, "plain", "--schema", "a long")
    assert rc == 0 and "created topic plain" in out and "1 partition;" in out
    one_line_error(capsys, ["config", root, "nope"], "topic 'nope' does not exist",
                   "topics: events, plain")


def test_schema_strings_mean_what_spark_makes_of_them(spark):
    """The parser agrees with Spark's own DDL parser, through the Spark-to-Arrow mapping
    Spark writes use (pafka_source.types)."""
    from pyspark.sql.types import _parse_datatype_string

    from pafka_source.types import topic_schema_from_spark
    for ddl in (DDL, "ID LONG, Url STRING", "a INTEGER, b REAL, c DEC(5), d NUMERIC(20, 4)",
                "struct<a: array<map<string, struct<x: timestamp>>>>"):
        spark_schema = topic_schema_from_spark(_parse_datatype_string(ddl))
        assert parse_schema(ddl).equals(spark_schema), ddl
        assert parse_schema(schema_text(spark_schema)).equals(spark_schema), ddl


@pytest.mark.parametrize("schema,needles", [
    ("id long, url strin", ["column 'url'", "'strin'", "unknown type", "types allowed",
                            "timestamp_ntz"]),
    ("id long url string", ["column 'id'", "expected ','"]),
    ("id", ["column 'id'", "expected a type"]),
    ("a decimal(40,2)", ["column 'a'", "precision from 1 to 38"]),
    ("a array<int", ["column 'a'", "expected '>'"]),
    ("s struct<x: int, y: foo>", ["column 's.y'", "unknown type 'foo'"]),
    ("a int, a long", ["column 'a' appears twice"]),
    ("a int COMMENT 'x'", ["COMMENT is not kept"]),
    ("", ["the schema is empty"]),
])
def test_a_bad_schema_string_says_where_and_what_is_allowed(root, capsys, schema, needles):
    one_line_error(capsys, ["create-topic", root, "new", "--schema", schema], *needles)
    assert Store.open(root, create=False).topics() == ["t"]


def test_create_topic_from_an_arrow_schema_file_file_or_stream(root, tmp_path, capsys):
    schema = pa.schema([("a", pa.int32()), ("b", pa.list_(pa.string()))])
    for kind, writer in (("file", pa.ipc.new_file), ("stream", pa.ipc.new_stream)):
        path = tmp_path / f"schema.{kind}"
        with writer(str(path), schema):
            pass  # no record: only the schema
        made = as_json(capsys, "create-topic", root, kind, "--schema-file", path)
        assert made["schema"] == "a int, b array<string>"
        assert Store.open(root, create=False).topic(kind).schema.equals(schema)
    (tmp_path / "notes.txt").write_text("not arrow")
    one_line_error(capsys, ["create-topic", root, "x", "--schema-file", tmp_path / "notes.txt"],
                   "--schema-file", "notes.txt", "not an Arrow IPC file or stream")
    one_line_error(capsys, ["create-topic", root, "x", "--schema-file", tmp_path / "nope"],
                   "nope: No such file or directory")


def test_create_topic_refuses_a_missing_store_an_existing_topic_and_bad_options(
        root, tmp_path, capsys):
    missing = tmp_path / "mistyped"
    one_line_error(capsys, ["create-topic", missing, "t", "--schema", "a long"],
                   f"no store at {missing}", "--create-store")
    assert not missing.exists()
    one_line_error(capsys, ["create-topic", root, "t", "--schema", "a long"],
                   "topic 't' already exists", "pafka describe")
    one_line_error(capsys, ["create-topic", root, "u", "--schema", "a long", "--config",
                            "storage.migrate.threshold=0.2"],
                   "storage.migrate.threshold cannot be set per topic", "retention")
    one_line_error(capsys, ["create-topic", root, "u", "--schema", "a long", "--config",
                            "retention.ms=soon"], "invalid value 'soon' for log.retention.ms")
    one_line_error(capsys, ["create-topic", root, "bad/name", "--schema", "a long"], "bad/name")
    for usage in (["--schema", "a long", "--partitions", "0"], [],  # [] has no schema
                  ["--schema", "a long", "--store-config", "log.segment.bytes=1m"]):
        with pytest.raises(SystemExit) as e:  # usage errors: argparse, status 2
            cli.main(["create-topic", str(root), "u", *usage])
        assert e.value.code == 2
    assert "--store-config applies only with --create-store" in capsys.readouterr().err
    assert Store.open(root, create=False).topics() == ["t"]


# -- add-partitions ---------------------------------------------------------------------------
def test_add_partitions_adds_n_more_or_up_to_a_total(root, capsys):
    r = as_json(capsys, "add-partitions", root, "t", "--add", "3")
    assert r == {"topic": "t", "before": 2, "added": 3, "partitions": 5}
    assert Store.open(root, create=False).topic("t").partitions == 5
    rc, out, _ = run(capsys, "add-partitions", root, "t", "--add", "1")
    assert rc == 0 and "2 -> 6" not in out and "5 -> 6 partitions (+1)" in out
    # Kafka's meaning: the new count.
    r = as_json(capsys, "add-partitions", root, "t", "--partitions", "8")
    assert r == {"topic": "t", "before": 6, "added": 2, "partitions": 8}
    one_line_error(capsys, ["add-partitions", root, "t", "--total", "8"],
                   "--total 8: topic 't' has 8 partitions already; the count can only grow")
    one_line_error(capsys, ["add-partitions", root, "nope", "--add", "1"],
                   "topic 'nope' does not exist", "topics: t")
    for argv, why in ((["0", "--add"], None), (["4"], "a bare 4 is ambiguous: give --add 4"),
                      ([], "give --add N")):
        with pytest.raises(SystemExit) as e:
            cli.main(["add-partitions", str(root), "t", *argv])
        assert e.value.code == 2
        if why:
            assert why in capsys.readouterr().err
    assert Store.open(root, create=False).topic("t").partitions == 8


# -- alter-topic --------------------------------------------------------------------------------
def test_alter_topic_adds_widens_and_relaxes_in_one_step(tmp_path, capsys):
    s = Store.open(tmp_path / "store")
    s.create_topic("t", parse_schema("id int NOT NULL, name string"), partitions=1)
    t = s.topic("t")
    t.append(pa.record_batch([pa.array([1, 2], pa.int32()), pa.array(["a", "b"])],
                             schema=t.schema))
    root = tmp_path / "store"
    r = as_json(capsys, "alter-topic", root, "t", "--add-column", "country string",
                "--widen", "id bigint", "--nullable", "id")
    assert r["changes"] == ["widened id int → bigint", "made id nullable", "added country string"]
    assert r["schema"] == "id bigint, name string, country string" and r["version"] == 2
    assert [b.to_pydict() for b in Store.open(root, create=False).topic("t").read(0, 0)] == [
        {"id": [1, 2], "name": ["a", "b"], "country": [None, None]}]
    rc, out, _ = run(capsys, "alter-topic", root, "t", "--add-column", "city string")
    assert rc == 0 and "topic t at log version 3: added city string" in out
    d = as_json(capsys, "describe", root, "t")
    assert [h["version"] for h in d["schema_history"]] == [0, 2, 3]
    assert d["schema_history"][2]["changes"] == ["added city string"]
    rc, out, _ = run(capsys, "describe", root, "t")
    assert "schema change at log version 2 (" in out and "Z): widened id int → bigint" in out


def test_alter_topic_refuses_what_delta_refuses_naming_column_and_rule(root, capsys):
    one_line_error(capsys, ["alter-topic", root, "t", "--widen", "key int"], "column 'key'",
                   "int64 → int32", "never narrows")
    one_line_error(capsys, ["alter-topic", root, "t", "--widen", "value bigint"],
                   "column 'value' changes type string → int64", "only widens")
    one_line_error(capsys, ["alter-topic", root, "t", "--add-column", "n long NOT NULL"],
                   "new column 'n'", "must be nullable")
    one_line_error(capsys, ["alter-topic", root, "t", "--add-column", "key string"],
                   "has a column 'key' already", "--widen")
    one_line_error(capsys, ["alter-topic", root, "t", "--widen", "nope long"],
                   "no column 'nope'", "its columns: key, ts, value")
    one_line_error(capsys, ["alter-topic", root, "t", "--add-column", "a long, b long"],
                   "give one column")
    with pytest.raises(SystemExit) as e:
        cli.main(["alter-topic", str(root), "t"])
    assert e.value.code == 2
    assert Store.open(root, create=False).topic("t").version == 0  # nothing was published


# -- config -------------------------------------------------------------------------------------
def _config(report) -> dict[str, tuple]:
    return {c["key"]: (c["value"], c["source"]) for c in report["config"]}


def test_config_shows_sets_and_unsets_for_every_process(root, tmp_path, capsys):
    shown = _config(as_json(capsys, "config", root, "t"))
    assert shown["log.retention.ms"] == (604800000, "default")
    assert shown["log.segment.ms"] == (604800000, "default")
    handle = Store.open(root, create=False).topic("t")  # this process's handle, opened before
    # A second process (the installed command, from outside the repository) sets two keys.
    r = installed(tmp_path, "config", root, "t", "--set", "retention.ms=60000", "--set",
                  "compression.type=zstd", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert {c["key"]: c["after"] for c in report["changed"]} == {
        "log.retention.ms": 60000, "compression.type": "zstd"}
    assert _config(report)["log.retention.ms"] == (60000, "topic")
    handle.refresh()
    assert handle.setting("log.retention.ms") == 60000
    assert handle.setting("compression.type") == "zstd"
    # The text form marks the topic's own values.
    rc, out, _ = run(capsys, "config", root, "t")
    line = next(x for x in out.splitlines() if x.startswith("log.retention.ms"))
    assert "60000" in line and "topic *" in line
    # Unset here; a fresh process sees the store's value again.
    r = as_json(capsys, "config", root, "t", "--unset", "log.retention.ms")
    assert r["changed"] == [{"key": "log.retention.ms", "before": 60000, "after": None}]
    code = ("import sys; from tier_store import Store; t = Store.open(sys.argv[1], "
            "create=False).topic('t'); print(t.setting('log.retention.ms'), t.config)")
    out = subprocess.run([PYTHON, "-c", code, str(root)], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert out.strip() == "604800000 {'compression.type': 'zstd'}"


def test_a_topics_own_retention_applies_to_it_alone(tmp_path, capsys):
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    small, other = s.create_topic("small", SCHEMA), s.create_topic("other", SCHEMA)
    for i in range(40):
        small.append(make_batch(i * 200, 200))
        other.append(make_batch(i * 200, 200))
    assert len(small.segments()) > 3
    as_json(capsys, "config", tmp_path / "store", "small", "--set", "retention.bytes=64k")
    small.refresh()
    deleted = small.apply_retention()
    assert deleted and small.earliest_offsets()[0] > 0
    assert other.apply_retention() == [] and other.earliest_offsets()[0] == 0
    s.close()


@pytest.mark.parametrize("argv,needles", [
    (["--set", "retention.ms=soon"], ["topic 't'", "invalid value 'soon' for log.retention.ms",
                                      "an integer >= 0, or -1"]),
    (["--set", "retention.bytes=-5"], ["log.retention.bytes", "out of range"]),
    (["--set", "compression.type=gzip"], ["one of none, lz4, zstd"]),
    (["--set", "retentoin.ms=1"], ["unknown configuration key 'retentoin.ms'",
                                   "a topic may set"]),
    (["--set", "segment.bytes=1m"], ["segment.bytes cannot be set per topic", "fixed"]),
    (["--set", "storage.migrate.threshold=0.1"], ["setting of the whole store"]),
    (["--set", "retention.ms"], ["--set takes KEY=VALUE"]),
    (["--unset", "log.retention.ms"], ["has no value of its own for log.retention.ms"]),
    (["--set", "retention.ms=1", "--unset", "retention.ms"], ["contradict"]),
    (["--set", "retention.ms=1", "--set", "log.retention.ms=2"],
     ["retention.ms and log.retention.ms both name log.retention.ms"]),
    (["--unset", "nonsense.key"], ["unknown configuration key 'nonsense.key'"]),
])
def test_config_refuses_what_a_topic_cannot_set(root, capsys, argv, needles):
    one_line_error(capsys, ["config", root, "t", *argv], *needles)
    assert Store.open(root, create=False).topic("t").config == {}


# -- produce ------------------------------------------------------------------------------------
def _table(n: int, start: int = 0) -> pa.Table:
    return pa.Table.from_batches([make_batch(start, n)])


def _write(path, table: pa.Table, fmt: str) -> None:
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        import pyarrow.csv as pcsv
        pcsv.write_csv(table, path)
    elif fmt == "json":
        with open(path, "w") as f:
            for row in table.to_pylist():
                f.write(json.dumps(row) + "\n")
    else:
        with (pa.ipc.new_file if fmt == "arrow" else pa.ipc.new_stream)(str(path),
                                                                        table.schema) as w:
            w.write_table(table)


@pytest.mark.parametrize("fmt,suffix", [("parquet", ".parquet"), ("csv", ".csv"),
                                        ("json", ".jsonl"), ("arrow", ".arrow"),
                                        ("stream", ".arrows")])
def test_produce_each_format_from_its_suffix(root, tmp_path, capsys, fmt, suffix):
    path = tmp_path / f"data{suffix}"
    _write(path, _table(1000), fmt)
    r = as_json(capsys, "produce", root, "t", "--from", path, "--key", "key")
    assert r["records"] == 1000 and r["format"] == ("arrow" if fmt == "stream" else fmt)
    assert r["bytes"] > 0 and sum(r["partitions"].values()) == 1000
    assert all(n > 0 for n in r["partitions"].values())  # keyed: both partitions
    assert records(root) == _table(1000).to_pylist()


def test_produce_reads_in_batches_and_reorders_and_casts_columns(root, tmp_path, capsys):
    # Columns in another order, an int32 key: cast to the topic's long, checked per value.
    t = _table(25_000)
    t = pa.table({"value": t["value"], "key": t["key"].cast(pa.int32()), "ts": t["ts"]})
    pq.write_table(t, tmp_path / "d.parquet", row_group_size=4000)
    before = Store.open(root, create=False).topic("t").version
    r = as_json(capsys, "produce", root, "t", "--from", tmp_path / "d.parquet",
                "--partition", "1", "--batch-records", "10000")
    assert r["records"] == 25_000 and r["partitions"] == {"0": 0, "1": 25_000}
    topic = Store.open(root, create=False).topic("t")
    assert topic.version - before == 3  # 10000 + 10000 + 5000: one commit each
    assert topic.latest_offsets() == {0: 0, 1: 25_000}
    assert [x["key"] for x in records(root)] == list(range(25_000))


def test_produce_from_stdin_with_the_installed_command(root, tmp_path):
    csv = "key,ts,value\n" + "".join(f"{i},{i * 10},v{i}\n" for i in range(50))
    r = installed(tmp_path, "produce", root, "t", "--from", "-", "--format", "csv", "--json",
                  stdin=csv)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["records"] == 50 and r.stderr == ""  # no bar off a terminal
    assert records(root) == _table(50).to_pylist()
    r = installed(tmp_path, "produce", root, "t", "--from", "-", stdin=csv)
    assert r.returncode == 1 and r.stderr.startswith("pafka: ") and "--format" in r.stderr


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_produce_from_stdin_commits_lines_as_they_arrive(root, tmp_path, fmt):
    # As `tail -f log | pafka produce`: lines are committed within --linger-ms of arriving,
    # not when stdin ends (or 65,536 lines later).
    import time

    def lines(start: int, n: int) -> str:
        if fmt == "csv":
            return "".join(f"{i},{i * 10},v{i}\n" for i in range(start, start + n))
        return "".join(json.dumps({"key": i, "ts": i * 10, "value": f"v{i}"}) + "\n"
                       for i in range(start, start + n))

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([PAFKA, "produce", root, "t", "--from", "-", "--format", fmt,
                             "--linger-ms", "200", "--json"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env=env)
    try:
        proc.stdin.write(("key,ts,value\n" if fmt == "csv" else "") + lines(0, 3))
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(records(root)) < 3:
            time.sleep(0.1)
        assert [r["key"] for r in records(root)] == [0, 1, 2]  # stdin still open
        out, err = proc.communicate(lines(3, 4), timeout=60)  # then stdin ends
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert json.loads(out)["records"] == 7
    assert records(root) == _table(7).to_pylist()


def test_produce_shows_a_progress_bar_on_a_terminal(root, tmp_path):
    import fcntl
    import pty
    import struct
    import termios
    _write(tmp_path / "d.parquet", _table(3000), "parquet")
    code = ("import sys; from pafka_source.cli import main; sys.exit(main(sys.argv[1:]))")
    leader, follower = pty.openpty()
    # A terminal 100 columns wide (a new pty has 0, and tqdm would draw an empty bar).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.run([sys.executable, "-c", code, "produce", str(root), "t", "--from",
                           str(tmp_path / "d.parquet"), "--batch-records", "1000"],
                          stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120,
                          cwd=tmp_path)
    os.close(follower)
    err = b""
    try:
        while chunk := os.read(leader, 65536):
            err += chunk
    except OSError:
        pass  # the follower is closed: all was read
    os.close(leader)
    assert proc.returncode == 0
    assert b"producing" in err and b"3.00k/3.00k" in err, err
    assert "produced 3,000 records" in proc.stdout


@pytest.mark.parametrize("name,content,needles", [
    ("missing.parquet", pa.table({"key": [1], "ts": [2]}),
     ["missing.parquet does not fit topic 't'", "no column 'value'"]),
    ("extra.arrow", pa.table({"key": [1], "ts": [2], "value": ["a"], "more": [1.5]}),
     ["extra.arrow does not fit topic 't'", "extra column 'more'"]),
    ("typed.parquet", pa.table({"key": ["x"], "ts": [2], "value": ["a"]}),
     ["column 'key' of", "typed.parquet is string", "the topic 't' has bigint"]),
    ("nested.parquet", pa.table({"key": [[1]], "ts": [2], "value": ["a"]}),
     ["column 'key' of", "is array<bigint>", "has bigint"]),
    ("text.csv", "key,ts,value\n1,2,a\nmany,3,b\n",
     ["text.csv", "column 'key'", "text in CSV", "int64", "'many'"]),
    ("lines.jsonl", '{"key": 1, "ts": 2, "value": "a"}\n{"key": "one", "ts": 2}\n',
     ["lines.jsonl", "cannot read it as json", "column 'key' is a JSON string"]),
    ("garbage.parquet", "not parquet at all", ["garbage.parquet: cannot read it as parquet"]),
    ("garbage.arrow", "not arrow at all", ["garbage.arrow: cannot read it as arrow"]),
    ("data.xlsx", "", ["cannot tell the format of", "data.xlsx", "--format"]),
])
def test_produce_refuses_a_mismatched_or_unreadable_file(root, tmp_path, capsys, name,
                                                         content, needles):
    path = tmp_path / name
    if isinstance(content, pa.Table):
        _write(path, content, "parquet" if name.endswith(".parquet") else "arrow")
    else:
        path.write_text(content)
    one_line_error(capsys, ["produce", root, "t", "--from", path], *needles)
    assert Store.open(root, create=False).topic("t").latest_offsets() == {0: 0, 1: 0}


def test_produce_refuses_a_missing_file_a_directory_an_unknown_topic_or_key(root, tmp_path,
                                                                           capsys):
    _write(tmp_path / "d.parquet", _table(10), "parquet")
    one_line_error(capsys, ["produce", root, "t", "--from", tmp_path / "nope.csv"],
                   f"{tmp_path / 'nope.csv'}: No such file or directory")
    one_line_error(capsys, ["produce", root, "t", "--from", tmp_path, "--format", "csv"],
                   str(tmp_path), "directory")
    one_line_error(capsys, ["produce", root, "nope", "--from", tmp_path / "d.parquet"],
                   "topic 'nope' does not exist")
    one_line_error(capsys, ["produce", root, "t", "--from", tmp_path / "d.parquet", "--key",
                            "user"], "--key user: not a column of topic 't'")
    one_line_error(capsys, ["produce", root, "t", "--from", tmp_path / "d.parquet",
                            "--partition", "7"], "has no partition 7")
    with pytest.raises(SystemExit) as e:  # --key and --partition exclude each other
        cli.main(["produce", str(root), "t", "--from", "x.csv", "--key", "key",
                  "--partition", "0"])
    assert e.value.code == 2
    assert Store.open(root, create=False).topic("t").latest_offsets() == {0: 0, 1: 0}


def test_a_failure_part_way_says_what_was_produced(root, tmp_path, capsys):
    # Keys as text: the first batches convert to the topic's long, a later one does not.
    keys = [str(i) for i in range(30)] + ["x"]
    pq.write_table(pa.table({"key": keys, "ts": list(range(31)), "value": ["v"] * 31}),
                   tmp_path / "late.parquet")
    one_line_error(capsys, ["produce", root, "t", "--from", tmp_path / "late.parquet",
                            "--batch-records", "10"],
                   "column 'key' of", "is string, the topic 't' has bigint", "'x'",
                   "the 30 records before it were produced")
    assert [r["key"] for r in records(root)] == list(range(30))


def test_unset_drops_a_key_an_older_version_let_a_topic_set(root, capsys):
    # Entries of an older version may hold any store key: --unset can still drop it.
    from tier_store.entries import ConfigEntry
    t = Store.open(root, create=False).topic("t")
    t.log.publish_retrying(lambda st: ConfigEntry(st.last_ts + 1, {"num.partitions": 3}))
    assert t.refresh().config == {"num.partitions": 3}
    rc, out, err = run(capsys, "config", root, "t", "--unset", "num.partitions")
    assert rc == 0 and "num.partitions 3 -> (the store value)" in out, err
    assert Store.open(root, create=False).topic("t").config == {}


def _floats_topic(root) -> None:
    Store.open(root, create=False).create_topic(
        "f", pa.schema([("id", pa.int64()), ("x", pa.float64()), ("s", pa.string())]), 1)


def _floats(root) -> list[tuple]:
    rows = [r for b in Store.open(root, create=False).topic("f").read(0, 0)
            for r in b.to_pylist()]
    return [(r["id"], r["x"], r["s"]) for r in rows]


def test_produce_csv_keeps_nan_as_nan_and_only_an_empty_cell_is_null(root, tmp_path, capsys):
    import math
    _floats_topic(root)
    (tmp_path / "n.csv").write_text("id,x,s\n1,nan,a\n2,NaN,NULL\n3,-nan,\n4,,nan\n5,inf,NA\n")
    as_json(capsys, "produce", root, "f", "--from", tmp_path / "n.csv")
    got = _floats(root)
    assert [i for i, x, _ in got if x is not None and math.isnan(x)] == [1, 2, 3]
    assert [(i, x) for i, x, _ in got if x is None or not math.isnan(x)] == \
        [(4, None), (5, math.inf)]
    assert [s for *_, s in got] == ["a", "NULL", "", "nan", "NA"]  # text stays text


def test_produce_null_values_lists_the_cells_that_are_null(root, tmp_path, capsys):
    _floats_topic(root)
    (tmp_path / "n.csv").write_text("id,x,s\n1,NULL,a\n2,1.5,NULL\n3,NA,NA\n")
    as_json(capsys, "produce", root, "f", "--from", tmp_path / "n.csv",
            "--null-values", "NULL", "--null-values", "NA")
    assert _floats(root) == [(1, None, "a"), (2, 1.5, None), (3, None, None)]
    one_line_error(capsys, ["produce", root, "f", "--from", tmp_path / "n.csv"],
                   "column 'x'", "'NULL'")  # by default NULL is no number
    (tmp_path / "d.parquet").write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        cli.main(["produce", str(root), "f", "--from", str(tmp_path / "d.parquet"),
                  "--null-values", "NULL"])
    assert e.value.code == 2


# -- produce: what a user meets ----------------------------------------------------------------
def test_produce_json_names_a_wrong_type_and_warns_of_a_column_no_record_holds(root, tmp_path,
                                                                                capsys):
    (tmp_path / "bad.jsonl").write_text('{"key": "x", "ts": 1, "value": "a"}\n')
    one_line_error(capsys, ["produce", root, "t", "--from", tmp_path / "bad.jsonl"],
                   "column 'key' is a JSON string", "topic's bigint needs a JSON number")
    (tmp_path / "no_ts.jsonl").write_text(
        "".join(f'{{"key": {i}, "value": "v{i}"}}\n' for i in range(5)))
    r = installed(tmp_path, "produce", root, "t", "--from", tmp_path / "no_ts.jsonl")
    assert r.returncode == 0 and "produced 5 records" in r.stdout, r.stderr
    assert "holds column 'ts' of topic 't': stored as nulls" in r.stderr
    assert "'value'" not in r.stderr and [x["ts"] for x in records(root)] == [None] * 5


def test_produce_refuses_csv_without_a_header_line(root, tmp_path):
    r = installed(tmp_path, "produce", root, "t", "--from", "-", "--format", "csv",
                  stdin="1,10,v1\n")
    assert r.returncode == 1 and "names no column of the topic" in r.stderr, r.stderr
    assert "starts with a header line naming its columns (key,ts,value)" in r.stderr
    assert records(root) == []


def test_ctrl_c_during_produce_says_what_went_in_and_skip_resumes(root, tmp_path):
    import signal
    import time
    n = 400_000
    pq.write_table(_table(n), tmp_path / "big.parquet", row_group_size=1000)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.Popen([PAFKA, "produce", str(root), "t", "--from",
                          str(tmp_path / "big.parquet"), "--batch-records", "1000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    t = Store.open(root, create=False).topic("t")
    deadline = time.monotonic() + 60
    while sum(t.latest_offsets().values()) < 5000 and time.monotonic() < deadline:
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    got = sum(t.latest_offsets().values())
    assert p.returncode == 1 and 0 < got < n, (got, err)
    assert f"interrupted: {got:,} records of" in err and f"--skip {got}" in err, err
    r = installed(tmp_path, "produce", root, "t", "--from", tmp_path / "big.parquet",
                  "--skip", str(got))
    assert r.returncode == 0, r.stderr
    assert [x["key"] for x in records(root)] == list(range(n))  # none lost, none twice
