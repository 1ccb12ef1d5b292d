"""The commit log under damage and hostile contents (issue #20, points 4 and 5).

A template store holds topic ``t`` (one partition, keys 0..299 in six appends of 50, a
checkpoint at version 4, entries 5 and 6 after it) and topic ``u`` (the same history, another
id). Each case damages a copy of it: the newest entry (bits flipped, truncated, a field given
another value or type, an entry copied from another version or topic), the checkpoint (bits
flipped, truncated, its state rewritten), the checkpoint pointer, or a partition's active
pointer. A child process then opens the copy through the public API, reads every record,
checks the topic, lists tier usage and topics, and reports per case: the error (a store
error naming the file, or a bare one), wrong, duplicated and lost rows, and opens outside the
store. The parent restarts the child past a case that kills it, and counts that as a crash.

``python -m tests.test_log_damage`` prints the totals per kind of damage.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from tier_store import ConfigError, CorruptLog, PafkaError, Store

from .conftest import PYTHON, SCHEMA, make_batch, settle

RECORDS, PER = 300, 50
NEWEST, CHECKPOINT = 6, 4
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTILE: list[Any] = [-1, 0, 2**64, 2**63, "7", "../../../outside", "/tmp/outside", True, None,
                      1.5, [], {}]


def entry_file(root: str, topic: str, version: int) -> str:
    return os.path.join(root, topic, "_log", f"{version:020d}.json")


def checkpoint_file(root: str, topic: str, version: int) -> str:
    return os.path.join(root, topic, "_log", f"{version:020d}.checkpoint")


def build_template(root: str, config: dict[str, Any] | None = None) -> None:
    """The store every case damages a copy of (see the module docstring); ``config`` adds
    keys (an s3:// root's tier paths and options)."""
    s = Store.open(root, {**(config or {}), "log.checkpoint.interval": CHECKPOINT,
                          "log.segment.bytes": "16k"})
    for name in ("t", "u"):
        t = s.create_topic(name, SCHEMA, partitions=1)
        for i in range(RECORDS // PER):
            t.append(make_batch(i * PER, PER), partition=0)
        settle()
        assert t.version == NEWEST and t.checkpointed_version == CHECKPOINT
    s.close()


def _template_on(store_root) -> tuple[str, str, str]:
    """The template store at ``store_root`` (a local or an s3:// root): (its root, the
    location of t's newest entry, of t's checkpoint) as errors name them."""
    build_template(store_root.url, store_root.config())
    with Store.open(store_root.url, create=False) as s:
        log = s.topic("t").log.commit_log.store
        return store_root.url, log.entry_location(NEWEST), log.checkpoint_location(CHECKPOINT)


def _rewrite(location: str, change: Any) -> None:
    """Replace the bytes of a local file, or of an object named ``s3://bucket/key`` (on the
    server the AWS variables name), by ``change(bytes)``."""
    if not location.startswith("s3://"):
        with open(location, "rb") as f:
            body = f.read()
        with open(location, "wb") as f:
            f.write(change(body))
        return
    import boto3
    bucket, _, key = location[len("s3://"):].partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3.put_object(Bucket=bucket, Key=key, Body=change(body))


# -- the cases ------------------------------------------------------------------------------
def _json_mutations(raw: bytes) -> list[tuple[str, bytes]]:
    """The entry ``raw`` with each field (and each field of its first chunk) given each
    hostile value, or removed; and with an unknown field."""
    body = json.loads(raw)
    out = []
    paths = [(k,) for k in body if k != "chunks"] + \
        [("chunks", 0, k) for k in body.get("chunks", [{}])[0]] + [("chunks",)]
    for path in paths:
        for value in [*HOSTILE, "remove"]:
            b = json.loads(raw)
            holder = b
            for k in path[:-1]:
                holder = holder[k]
            if value == "remove":
                del holder[path[-1]]
            else:
                holder[path[-1]] = value
            out.append((f"{'.'.join(map(str, path))}={value!r}", json.dumps(b).encode()))
    b = json.loads(raw)
    b["extra"] = 1
    out.append(("extra field", json.dumps(b).encode()))
    return out


def _encoders() -> tuple[Any, Any]:
    """(stored checkpoint -> Arrow IPC file, (table, version) -> stored checkpoint): with a
    checksum trailer since issue #20, plain Arrow files before (for the figures before)."""
    try:
        from tier_store.commit_log import checkpoint_body, encode_checkpoint  # noqa: PLC0415
        return checkpoint_body, encode_checkpoint
    except ImportError:
        return pa.py_buffer, lambda table, version: _ipc(table)


def _checkpoint_rewrites(raw: bytes) -> list[tuple[str, bytes]]:
    """The checkpoint ``raw`` written again, checksum and all (as a hostile writer could),
    with one field of its state given a hostile value, or one chunk column changed."""
    body, encode = _encoders()
    table = pa.ipc.open_file(body(raw)).read_all()
    meta = json.loads(table.schema.metadata[b"pafka.state"])
    changes: list[tuple[str, Any]] = [(k, v) for k in ("version", "name", "partitions",
                                                       "next_offset", "start_offset",
                                                       "chunk_counts", "segments", "topic_id",
                                                       "writers", "positions", "tombstones")
                                      for v in HOSTILE]
    changes += [(f"segments.0.{k}", v) for k in meta["segments"][0] for v in HOSTILE]
    out = []
    for key, value in changes:
        m = json.loads(json.dumps(meta))
        if key.startswith("segments.0."):
            m["segments"][0][key.split(".")[2]] = value
        else:
            m[key] = value
        t = table.replace_schema_metadata({b"pafka.state": json.dumps(m).encode()})
        out.append((f"{key}={value!r}", encode(t, CHECKPOINT)))
    for col in ("pos", "len", "base", "n", "seq"):
        cols = {n: table.column(n) for n in table.column_names}
        cols[col] = pa.array([-5] * table.num_rows, pa.int64())
        t = pa.table(cols).replace_schema_metadata(table.schema.metadata)
        out.append((f"column {col}=-5", encode(t, CHECKPOINT)))
    return out


def _resign(data: bytes, topic_id: str) -> bytes:
    try:
        from tier_store.entries import signed  # noqa: PLC0415
    except ImportError:  # before issue #20: no checksum
        return data
    return signed(data, NEWEST, topic_id)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def cases(template: str) -> list[tuple[str, str, str, bytes | None]]:
    """(kind, name, file relative to the root, new content; None deletes it) per case."""
    out: list[tuple[str, str, str, bytes | None]] = []
    rel_entry = os.path.relpath(entry_file(template, "t", NEWEST), template)
    entry = _read(entry_file(template, "t", NEWEST))
    for i in range(len(entry)):
        b = bytearray(entry)
        b[i] ^= 0x01
        out.append(("entry: bit flip", f"byte {i}", rel_entry, bytes(b)))
    for n in range(0, len(entry), 16):
        out.append(("entry: truncated", f"{n} bytes", rel_entry, entry[:n]))
    try:
        from tier_store.entries import entry_body  # noqa: PLC0415
        plain = entry_body(entry)
    except ImportError:  # before issue #20: no checksum
        plain = entry
    topic_id = Store.open(template, create=False).topic("t").id
    for name, data in _json_mutations(plain):
        out.append(("entry: field changed", name, rel_entry, data))
        # As a hostile writer could: with the checksum made again, so that the checks of
        # the state behind it are what stands.
        out.append(("entry: field changed, checksum made again", name, rel_entry,
                    _resign(data, topic_id)))
    for name, src in [("previous entry", entry_file(template, "t", NEWEST - 1)),
                      ("entry 0", entry_file(template, "t", 0)),
                      ("another topic's entry", entry_file(template, "u", NEWEST))]:
        out.append(("entry: copied", name, rel_entry, _read(src)))
    rel_cp = os.path.relpath(checkpoint_file(template, "t", CHECKPOINT), template)
    cp = _read(checkpoint_file(template, "t", CHECKPOINT))
    for i in range(0, len(cp), max(1, len(cp) // 120)):
        b = bytearray(cp)
        b[i] ^= 0xFF
        out.append(("checkpoint: bits flipped", f"byte {i}", rel_cp, bytes(b)))
    for n in range(0, len(cp), max(1, len(cp) // 12)):
        out.append(("checkpoint: truncated", f"{n} bytes", rel_cp, cp[:n]))
    for name, data in _checkpoint_rewrites(cp):
        out.append(("checkpoint: state changed", name, rel_cp, data))
    out.append(("checkpoint: copied", "another topic's checkpoint", rel_cp,
                _read(checkpoint_file(template, "u", CHECKPOINT))))
    hint = os.path.join("t", "_log", "_last_checkpoint")
    for text in ("../../../outside", "-4", "abc", "9" * 30, "", "4.0"):
        out.append(("pointer: _last_checkpoint", repr(text), hint, text.encode()))
    active = os.path.join("t", "_partitions", "0.active")
    for seq, tier in [("../../outside", 1), (0, "../x"), (-1, 1), (True, 1), (2**70, 1),
                      (0, 7)]:
        out.append(("pointer: active segment", f"seq={seq!r} tier={tier!r}", active,
                    json.dumps({"seq": seq, "tier": tier}).encode()))
    return out


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


# -- one case, in the child -----------------------------------------------------------------
def _outcome(e: BaseException) -> str:
    return ("error " if isinstance(e, PafkaError) else "BARE ") + type(e).__name__


def run_case(base: str, template: str, case: tuple[str, str, str, bytes | None]
             ) -> dict[str, Any]:
    """Apply ``case`` to a fresh copy of ``template`` under ``base`` and exercise it."""
    kind, name, rel, data = case
    here = os.path.join(base, "case")
    shutil.rmtree(here, ignore_errors=True)
    root = os.path.join(here, "store")
    shutil.copytree(template, root)
    path = os.path.join(root, rel)
    if data is None:
        os.unlink(path)
    else:
        with open(path, "wb") as f:
            f.write(data)
    res: dict[str, Any] = {"kind": kind, "name": name, "rows": 0, "wrong": 0, "dup": 0,
                           "lost": 0}
    outside: list[str] = []
    _OUTSIDE[:] = [root, here]
    _SEEN.clear()
    store = None
    try:
        store = Store.open(root, create=False)
        t = store.topic("t")
        latest = t.latest_offsets()
        got = [k for b in t.read(0, 0) for k in b.column("key").to_pylist()]
        res["rows"] = len(got)
        res["wrong"] = sum(1 for i, k in enumerate(got) if i >= RECORDS or k != i)
        res["dup"] = len(got) - len(set(got))
        res["lost"] = RECORDS - len(set(got) & set(range(RECORDS)))
        if latest != {0: RECORDS}:
            res["wrong"] += 1 if res["wrong"] == 0 else 0
            res["latest"] = latest
        t2 = store.topic("t")
        t2.append(make_batch(RECORDS, 5), partition=0)  # the log goes on after the damage
        res["open"] = "ok"
    except Exception as e:  # noqa: BLE001 (what is counted)
        res["open"] = _outcome(e)
        res["message"] = str(e)[:300]
    for what, op in [("check", lambda s: s.check(verify=True)),
                     ("usage", lambda s: s.tier_usage()),
                     ("topics", _list_topics)]:
        try:
            s = store or Store.open(root, create=False)
            got_op = op(s)
            if what == "check":
                res[what] = "ok" if all(r.ok for r in got_op) else "reported"
            else:
                res[what] = "ok"
        except Exception as e:  # noqa: BLE001
            res[what] = _outcome(e)
    outside = [p for p in _SEEN if not p.startswith(root + os.sep)]
    res["outside"] = outside + [os.path.join(here, n) for n in os.listdir(here) if n != "store"]
    if store is not None:
        store.close()
    return res


def _list_topics(store: Store) -> list[dict[str, Any]]:
    from pafka_source.cli.store_commands import list_topics  # noqa: PLC0415
    return list_topics(store)


_OUTSIDE: list[str] = []
_SEEN: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Record opens under the case's directory that are not in its store."""
    if event == "open" and _OUTSIDE and isinstance(args[0], (str, bytes)):
        p = os.path.abspath(os.fsdecode(args[0]))
        if p.startswith(_OUTSIDE[1] + os.sep) and not p.startswith(_OUTSIDE[0] + os.sep):
            _SEEN.append(p)


def worker(base: str, template: str, first: int, out_path: str) -> None:
    """Run cases ``first..`` one after another, a JSON line each (flushed before the next
    begins, so that a crash is pinned on its case)."""
    import logging  # noqa: PLC0415
    logging.disable(logging.CRITICAL)
    sys.addaudithook(_audit)
    all_cases = cases(template)
    with open(out_path, "a") as out:
        for i in range(first, len(all_cases)):
            out.write(json.dumps({"i": i, **run_case(base, template, all_cases[i])},
                                 default=str) + "\n")
            out.flush()


def run_all(base: str) -> list[dict[str, Any]]:
    """Every case, in child processes; a case that kills its child is a crash."""
    template = os.path.join(base, "template")
    if not os.path.isdir(template):
        build_template(template)
    total = len(cases(template))
    out_path = os.path.join(base, "results.jsonl")
    results: dict[int, dict[str, Any]] = {}
    first = 0
    while first < total:
        code = ("import sys; from tests.test_log_damage import worker; "
                f"worker({base!r}, {template!r}, {first}, {out_path!r})")
        p = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True,
                           timeout=900)
        if os.path.exists(out_path):
            with open(out_path) as f:
                for line in f:
                    r = json.loads(line)
                    results[r["i"]] = r
        done = max(results, default=-1) + 1
        if p.returncode == 0 and done >= total:
            break
        crashed = done
        how = signal.Signals(-p.returncode).name if p.returncode < 0 else p.returncode
        results[crashed] = {"i": crashed, "kind": cases(template)[crashed][0],
                            "name": cases(template)[crashed][1], "open": f"CRASH {how}",
                            "rows": 0, "wrong": 0, "dup": 0, "lost": 0, "outside": [],
                            "stderr": p.stderr[-2000:]}
        with open(out_path, "a") as f:
            f.write(json.dumps(results[crashed]) + "\n")
        first = crashed + 1
    return [results[i] for i in sorted(results)]


def summary(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind of damage: cases, records checked, wrong, dup, lost, bare exceptions, crashes,
    opens outside the store, outcomes."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        s = out.setdefault(r["kind"], {"cases": 0, "records": 0, "wrong": 0, "dup": 0,
                                       "lost": 0, "bare": 0, "crashes": 0, "outside": 0,
                                       "outcomes": collections.Counter()})
        s["cases"] += 1
        s["records"] += r["rows"]
        for k in ("wrong", "dup", "lost"):
            s[k] += r[k]
        ops = [r.get(k, "") for k in ("open", "check", "usage", "topics")]
        s["bare"] += sum(1 for o in ops if o.startswith("BARE"))
        s["crashes"] += r["open"].startswith("CRASH")
        s["outside"] += len(r.get("outside", []))
        s["outcomes"][r["open"]] += 1
    return out


# -- tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def damage_results(tmp_path_factory) -> Iterator[list[dict[str, Any]]]:
    # Memory-backed when there is /dev/shm: 850 copies of a store, each opened and appended to.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    base = tempfile.mkdtemp(prefix="pafka-log-damage-", dir=shm) if shm else \
        str(tmp_path_factory.mktemp("damage"))
    try:
        yield run_all(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_no_damage_to_the_log_gives_a_wrong_row_or_a_bare_exception(damage_results):
    """Every case: the topic opens and reads exactly keys 0..299, or fails with a store
    error; check, tier usage and the topic listing never raise a bare exception; nothing
    kills the process, nothing outside the store is opened."""
    bad = [r for r in damage_results
           if r["wrong"] or r["dup"] or r["lost"] or r["outside"]
           or any(r.get(k, "").startswith(("BARE", "CRASH"))
                  for k in ("open", "check", "usage", "topics"))]
    assert not bad, json.dumps(bad[:5], indent=1, default=str)
    assert len(damage_results) > 1000


def test_damage_to_the_newest_entry_or_the_checkpoint_is_a_corrupt_log_naming_the_file(
        damage_results):
    """A damaged entry or checkpoint never opens: its checksum (or, for a checkpoint
    written again with a valid checksum, the state it holds) rejects it, and ``CorruptLog``
    names the file; check reports it, tier usage leaves the topic out."""
    remade = ("checkpoint: state changed", "entry: field changed, checksum made again")
    for r in damage_results:
        if r["kind"] in remade and r["open"] == "error CorruptSegment":
            continue  # a checksum of a chunk made up: the chunk's bytes do not match it
        if r["kind"].startswith(("entry", "checkpoint")) and r["open"] != "ok":
            assert r["open"] == "error CorruptLog", r
            assert ".json" in r["message"] or ".checkpoint" in r["message"], r
            assert r["check"] == "reported" and r["usage"] == "ok", r
    opened = [r for r in damage_results if r["kind"].startswith(("entry", "checkpoint"))
              and r["kind"] not in remade and r["open"] == "ok"]
    assert not opened, opened[:3]
    rewritten = [r for r in damage_results if r["kind"] == "checkpoint: state changed"]
    assert sum(r["open"] == "error CorruptLog" for r in rewritten) > 0.9 * len(rewritten)


# The tests below damage one entry or checkpoint in place: on a local root's file, or by
# overwriting the object on an s3:// root (the bulk cases above copy a local root's
# directory per case, so they stay local).
def test_a_corrupt_topic_is_reported_and_the_others_still_listed(store_root):
    template, newest, _ = _template_on(store_root)
    _rewrite(newest, lambda body: b"[" + body[1:])
    s = Store.open(template, create=False)
    with pytest.raises(CorruptLog, match=re.escape(newest)):
        s.topic("t")
    (report_t, report_u) = s.check()
    assert not report_t.ok and newest in report_t.problems[0]
    assert report_u.ok
    assert sum(u["segments"] for u in s.tier_usage()) == len(s.topic("u").segments())
    from pafka_source.cli.store_commands import list_topics
    listed = list_topics(s)
    assert [x["topic"] for x in listed] == ["t", "u"]
    assert "error" in listed[0] and listed[1]["latest"] == {0: RECORDS}


def test_migration_skips_a_topic_whose_log_is_damaged(store_root):
    """One damaged topic stops no other: the service plans the healthy topics' moves."""
    from migration import MigrationService
    template, newest, _ = _template_on(store_root)
    _rewrite(newest, lambda body: b"[" + body[1:])
    s = Store.open(template, create=False)
    try:
        svc = MigrationService(s)
        svc.run_once()
        assert sum(b.num_rows for b in s.topic("u").read(0, 0)) == RECORDS
    finally:
        s.close()


def test_pafka_check_and_topics_name_the_damaged_file(store_root):
    template, _, checkpoint = _template_on(store_root)
    _rewrite(checkpoint, lambda body: body[:100] + b"\xff\xff" + body[102:])
    pafka = os.path.join(os.path.dirname(PYTHON), "pafka")
    for args in (["check", template], ["topics", template], ["describe", template, "t"]):
        p = subprocess.run([pafka, *args], capture_output=True, text=True, timeout=120)
        text = p.stdout + p.stderr
        assert "Traceback" not in text and "pafka -v" not in text, text
        assert checkpoint in text, text
        assert p.returncode == 1, text
        if args[0] == "topics":
            assert "u\tpartitions=1" in text and "t\tERROR" in text, text


def test_a_saved_relative_tier_path_leading_out_of_the_root_is_refused(tmp_path):
    """Relative tier paths in ``_store.json`` are inside the root (only those are saved
    relative): one with ``../`` is damage, refused before anything is made there."""
    root = tmp_path / "s"
    build_template(str(root))
    saved = json.loads((root / "_store.json").read_text())
    saved["layout"]["tier.paths"][0] = "../outside"
    (root / "_store.json").write_text(json.dumps(saved))
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ConfigError, match=r"_store.json is damaged: the relative tier path "
                                          r"'../outside' leads outside"):
        Store.open(root, create=False)
    assert sorted(os.listdir(tmp_path)) == before


def test_a_directory_no_topic_can_be_named_is_not_listed(tmp_path):
    root = str(tmp_path / "s")
    build_template(root)
    os.makedirs(os.path.join(root, "bad name", "_log"))
    shutil.copy(entry_file(root, "t", 0), entry_file(root, "bad name", 0))
    s = Store.open(root, create=False)
    assert s.topics() == ["t", "u"]
    assert [r.topic for r in s.check(verify=False)] == ["t", "u"]


if __name__ == "__main__":
    base = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="log-damage-")
    results = run_all(base)
    for kind, s in summary(results).items():
        outcomes = ", ".join(f"{k}: {v}" for k, v in s.pop("outcomes").most_common())
        print(f"{kind}: {json.dumps(s)}\n    {outcomes}")
    print("cases:", len(results), "results in", base)


@pytest.mark.parametrize("value", [-5, "soon", None, [1]])
def test_a_topic_config_value_read_from_the_log_is_checked(tmp_path, value):
    from tier_store.entries import entry_body, signed
    root = str(tmp_path / "store")
    with Store.open(root) as s:
        t = s.create_topic("t", SCHEMA)
        t.set_config({"retention.ms": 60_000})
        version, topic_id = t.version, t.id
    path = entry_file(root, "t", version)
    body = json.loads(entry_body(_read(path)))
    assert body["config"] == {"log.retention.ms": 60_000}
    body["config"]["log.retention.ms"] = value
    unsigned = json.dumps(body, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(signed(unsigned, version, topic_id))
    if value is None:  # null unsets the key: a valid entry
        assert Store.open(root, create=False).topic("t").config == {}
        return
    with pytest.raises(CorruptLog, match=r"log\.retention\.ms"):
        Store.open(root, create=False).topic("t")
