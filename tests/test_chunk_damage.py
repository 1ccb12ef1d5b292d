"""Damaged chunks and truncated segments: with verification on (the default) a damaged chunk
or segment header is a clean :class:`CorruptSegment` naming the file, never a wrong row or a
crash; a chunk whose checksum was forged to match is never a crash or a bare exception; a
segment truncated from outside is :class:`CorruptSegment` when a read maps it.

Damage is done to real segment files on a file tier and on a PMEM tier, and read back in
child processes, so that a crash (an exit by signal) is counted, not suffered."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from .conftest import PYTHON, ROOT, SCHEMA, make_batch
from .support import pmem_hdd_config

CASES = 200  # damaged copies per tier
PER = 37  # rows per append: chunks of uneven sizes
APPENDS = 60

KINDS = ("byte", "bit", "zeros", "header")
PATHS = ("read", "execute", "read_range")


# -- the child: builds the store, damages it case by case, reads it back ----------------------
def _config(tier: str, root: str) -> dict[str, Any]:
    if tier == "file":
        return {"log.segment.bytes": "64k"}
    shm = os.path.join(root, "pmem")  # on tmpfs: see _tier_dirs
    return pmem_hdd_config(shm, **{"storage.tiers.first.sizes": "2m"})


def _build(tier: str, root: str) -> dict[str, Any]:
    from tier_store import Store
    s = Store.open(os.path.join(root, "store"), _config(tier, root))
    t = s.create_topic("t", SCHEMA, partitions=1)
    for i in range(APPENDS):
        t.append(make_batch(i * PER, PER + i % 5 * 11 if i % 7 else 1))
    plan = t.plan_read(0, 0)
    s.close()
    return {"records": plan.end,
            "chunks": [[c.path, c.pos, c.length, c.base, c.records] for c in plan.chunks]}


def _keys(records: int) -> list[int]:
    """The keys appended by :func:`_build`, in offset order."""
    out: list[int] = []
    for i in range(APPENDS):
        n = PER + i % 5 * 11 if i % 7 else 1
        out.extend(range(i * PER, i * PER + n))
    assert len(out) == records
    return out


def _batches(path: str, root: str, verify: bool, forged: dict[str, Any] | None):
    """(offset, batch) of partition 0 read by ``path``."""
    from tier_store import Store, execute
    from tier_store.chunk import checksum, read_chunk
    from tier_store.errors import CorruptSegment
    from tier_store.reading import read_range
    t = Store.open(os.path.join(root, "store"), create=False).topic("t")
    plan = t.plan_read(0, 0)
    if forged is not None:  # the chunk's checksum made to match its damaged bytes
        import dataclasses
        chunks = list(plan.chunks)
        i = forged["chunk"]
        c = chunks[i]
        chunks[i] = dataclasses.replace(c, checksum=checksum(read_range(c.path, c.pos,
                                                                        c.length)))
        plan = dataclasses.replace(plan, chunks=tuple(chunks))
    if path == "read" and forged is None:
        at = 0
        for b in t.read(0, 0, verify=verify):
            yield at, b
            at += b.num_rows
    elif path in ("read", "execute"):
        for pb in execute(plan, verify):
            yield pb.offset, pb.batch
    else:  # what check, copy and adopt do: a ranged read, its checksum, then the chunk
        for c in plan.chunks:
            buf = read_range(c.path, c.pos, c.length)
            if verify and checksum(buf) != c.checksum and forged is None:
                raise CorruptSegment(f"{c.path}: chunk at {c.pos} does not match its checksum")
            at = c.base
            for b in read_chunk(buf, c.path):
                yield at, b
                at += b.num_rows


def _damage(rng: random.Random, kind: str, chunks: list[list[Any]]) -> dict[str, Any]:
    i = rng.randrange(len(chunks))
    path, pos, length = chunks[i][:3]
    if kind == "header":
        at, n = rng.randrange(48), 1  # the header's fields
    elif kind == "zeros":
        n = rng.randint(1, min(256, length))
        at = pos + rng.randrange(length - n + 1)
    else:
        at, n = pos + rng.randrange(length), 1
    return {"kind": kind, "chunk": i, "path": path, "at": at, "n": n,
            "bit": rng.randrange(8), "byte": rng.randrange(1, 256)}


def _apply(d: dict[str, Any]) -> bytes:
    """Damage the file as ``d`` says; returns the bytes it replaced."""
    fd = os.open(d["path"], os.O_RDWR)
    try:
        old = os.pread(fd, d["n"], d["at"])
        if d["kind"] == "zeros":
            new = bytes(d["n"])
        elif d["kind"] == "bit":
            new = bytes([old[0] ^ (1 << d["bit"])])
        else:
            new = bytes([old[0] ^ d["byte"]])  # never the same byte
        os.pwrite(fd, new, d["at"])
        return old
    finally:
        os.close(fd)


def _restore(d: dict[str, Any], old: bytes) -> None:
    fd = os.open(d["path"], os.O_RDWR)
    try:
        os.pwrite(fd, old, d["at"])
    finally:
        os.close(fd)


def _run_case(root: str, d: dict[str, Any], expected: list[int], verify: bool) -> dict[str, Any]:
    from tier_store import MAPS
    from tier_store.errors import CorruptSegment, PafkaError
    out = {"outcome": "correct", "rows": 0, "wrong": 0, "lost": 0, "dup": 0,
           "kind": f"{d['kind']}/{d['path_kind']}"}
    old = _apply(d)
    seen: set[int] = set()
    try:
        for at, b in _batches(d["path_kind"], root, verify, d if d.get("forged") else None):
            try:
                b.validate(full=True)
            except pa.ArrowException as e:
                out["outcome"] = "invalid"
                out["error"] = str(e)[:200]
                return out
            keys = b.column("key").to_pylist()  # where an invalid batch may crash
            b.column("value").to_pylist()
            for k, key in enumerate(keys):
                out["rows"] += 1
                if at + k in seen:
                    out["dup"] += 1
                seen.add(at + k)
                if not 0 <= at + k < len(expected) or expected[at + k] != key:
                    out["wrong"] += 1
        out["lost"] = len(expected) - len(seen & set(range(len(expected))))
        if out["wrong"] or out["dup"] or out["lost"]:
            out["outcome"] = "wrong"
    except CorruptSegment as e:
        out["outcome"] = "clean" if d["path"] in str(e) else "unnamed"
        out["error"] = str(e)[:200]
    except PafkaError as e:
        out["outcome"] = "pafka"
        out["error"] = f"{type(e).__name__}: {e}"[:200]
    except Exception as e:  # noqa: BLE001 - what the fault injection counts
        out["outcome"] = "bare"
        out["error"] = f"{type(e).__module__}.{type(e).__name__}: {e}"[:200]
    finally:
        _restore(d, old)
        MAPS.clear()
    return out


def child(job_file: str) -> None:
    """Entry point of a child process: run the job's cases from ``start``, one JSON line
    each (flushed, so a crash loses only the case it happened in)."""
    with open(job_file) as f:
        job = json.load(f)
    expected = _keys(job["records"])
    for i in range(job["start"], len(job["cases"])):
        r = _run_case(job["root"], job["cases"][i], expected, job["verify"])
        r["case"] = i
        print(json.dumps(r), flush=True)


# -- the parent ------------------------------------------------------------------------------
def _child_env(tier: str) -> dict[str, str]:
    env = dict(os.environ)
    if tier == "pmem":
        env["PMEM_IS_PMEM_FORCE"] = "1"
    return env


def _run_child(code: str, tier: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=_child_env(tier))


def build_store(tier: str, root: str) -> dict[str, Any]:
    """Build the damaged store's pristine copy in a child (the PMEM tier with libpmem's
    PMem path forced on), returning its chunks."""
    os.makedirs(root, exist_ok=True)
    code = ("import json, sys; from tests.test_chunk_damage import _build; "
            "print(json.dumps(_build(sys.argv[1], sys.argv[2])))")
    r = _run_child(code, tier, tier, root)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


def make_cases(built: dict[str, Any], n: int, seed: int, forged: bool = False
               ) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        d = _damage(rng, "byte" if forged and i % 2 else
                    "bit" if forged else KINDS[i % len(KINDS)], built["chunks"])
        d["path_kind"] = "execute" if forged else PATHS[i // len(KINDS) % len(PATHS)]
        d["forged"] = forged
        cases.append(d)
    return cases


def run_cases(tier: str, root: str, built: dict[str, Any], cases: list[dict[str, Any]],
              verify: bool = True) -> dict[str, Any]:
    """Run ``cases`` in child processes, a new child after each crash; per outcome, how many
    cases, and rows checked, wrong, lost and duplicated in all."""
    pristine = {}
    for p in {c[0] for c in built["chunks"]}:
        with open(p, "rb") as f:
            pristine[p] = f.read()
    tally: dict[str, Any] = {"cases": len(cases), "rows": 0, "wrong_rows": 0, "lost": 0,
                             "dup": 0, "outcomes": {}, "by_kind": {}, "examples": {}}
    job_file = os.path.join(root, "job.json")
    start = 0
    code = "import sys; from tests.test_chunk_damage import child; child(sys.argv[1])"
    while start < len(cases):
        with open(job_file, "w") as f:
            json.dump({"root": root, "cases": cases, "start": start, "verify": verify,
                       "records": built["records"]}, f)
        r = _run_child(code, tier, job_file)
        done = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        for d in done:
            tally["outcomes"][d["outcome"]] = tally["outcomes"].get(d["outcome"], 0) + 1
            kind = tally["by_kind"].setdefault(d["kind"], {})
            kind[d["outcome"]] = kind.get(d["outcome"], 0) + 1
            if d.get("error"):
                tally["examples"].setdefault(d["outcome"], []).append(d["error"])
            tally["rows"] += d["rows"]
            tally["wrong_rows"] += d["wrong"]
            tally["lost"] += d["lost"]
            tally["dup"] += d["dup"]
        start = done[-1]["case"] + 1 if done else start
        if r.returncode == 0:
            assert start == len(cases), r.stderr[-3000:]
            break
        if r.returncode > 0:
            raise AssertionError(f"child failed: {r.stderr[-3000:]}")
        what = f"signal {signal.Signals(-r.returncode).name}"
        tally["outcomes"]["crash"] = tally["outcomes"].get("crash", 0) + 1
        tally["examples"].setdefault("crash", []).append(f"{what} in case {cases[start]}")
        for p, data in pristine.items():  # the crashed case's damage stays: undo it
            with open(p, "r+b") as f:
                f.write(data)
        start += 1
    return tally


@pytest.fixture(params=["file", "pmem"])
def damaged(request, tmp_path, shm_dir):
    """(tier, root, built store): on the file tier under tmp_path, or on a PMEM tier on
    /dev/shm."""
    root = str(tmp_path) if request.param == "file" else shm_dir
    return request.param, root, build_store(request.param, root)


def test_a_damaged_chunk_or_header_is_a_clean_corrupt_segment_never_a_row_or_a_crash(damaged):
    tier, root, built = damaged
    tally = run_cases(tier, root, built, make_cases(built, CASES, seed=20))
    print(tier, json.dumps(tally))
    outcomes = tally["outcomes"]
    assert set(outcomes) <= {"clean", "correct"}, tally
    # Zeroing bytes that were zeros changes nothing: the rows are then right, and all of them.
    assert outcomes.get("clean", 0) >= CASES * 0.8, tally
    assert tally["wrong_rows"] == tally["lost"] == tally["dup"] == 0, tally


def test_a_forged_checksum_over_a_damaged_chunk_never_crashes_or_escapes_bare(damaged):
    """A chunk damaged and its checksum made to match (what only a hostile writer of both the
    segment and the commit log can do): the bytes pass verification, and still neither a
    crash, nor a bare exception, nor a batch of another schema or row count comes out.
    Batches whose buffers are too small for them are CorruptSegment; a crafted offset inside
    a string column passes (only Arrow's full validation, not run, would see it)."""
    tier, root, built = damaged
    tally = run_cases(tier, root, built, make_cases(built, CASES // 2, seed=21, forged=True))
    print(tier, json.dumps(tally))
    outcomes = tally["outcomes"]
    assert not set(outcomes) & {"crash", "bare", "unnamed"}, tally
    assert tally["lost"] == tally["dup"] == 0, tally
    assert not any("too small" in e for e in tally["examples"].get("invalid", [])), tally


_EVERY_BYTE = """
import json
import pyarrow as pa
from tier_store.chunk import EncodedChunk
from tier_store.chunk_decoder import ChunkDecoder
from tier_store.errors import CorruptSegment
from tests.conftest import SCHEMA, make_batch

def encode(batch, compression):
    c = EncodedChunk.of([batch], SCHEMA, compression)
    out = pa.allocate_buffer(c.size)
    c.write_into(out)
    return out

tally = {}
for compression in ("none", "zstd"):
    good = encode(make_batch(0, 20), compression)
    for primed in (False, True):
        for at in range(good.size):
            for flip in (0x01, 0x80, 0xFF):
                raw = bytearray(good.to_pybytes())
                raw[at] ^= flip
                d = ChunkDecoder()
                if primed:  # the single-batch fast path
                    d.batches(encode(make_batch(100, 3), compression), lambda: "first")
                try:
                    d.batches(pa.py_buffer(bytes(raw)), lambda: "chunk")
                    what = "batches"
                except CorruptSegment:
                    what = "CorruptSegment"
                except Exception as e:
                    what = type(e).__name__
                tally[what] = tally.get(what, 0) + 1
print(json.dumps(tally))
"""


def test_every_changed_byte_of_a_chunk_decodes_to_batches_or_corrupt_segment():
    """Whatever Arrow raises on a damaged chunk (ArrowNotImplementedError, ArrowTypeError,
    ArrowKeyError, ArrowCapacityError, ArrowMemoryError, ...) comes out of the decoder as
    CorruptSegment, on the general path and on the single-batch fast path; the decoder's
    checks run unconditionally, so this holds for bytes that passed their checksum too."""
    r = _run_child(_EVERY_BYTE, "file")
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    tally = json.loads(r.stdout.splitlines()[-1])
    assert set(tally) <= {"batches", "CorruptSegment"}, tally
    assert tally["CorruptSegment"] > 0


_TRUNCATE = """
import os, sys
from tier_store import CorruptSegment, Store
t = Store.open(sys.argv[1], create=False).topic("t")
plan = t.plan_read(0, 0)
first = sum(b.num_rows for b in t.read(0, 0))  # maps the segments and caches the mappings
last = plan.chunks[-1]
# From outside the store, to the page the last chunk starts in: its pages lie past the
# end (a page the file still reaches into reads as zeros, past it a mapping faults).
os.truncate(last.path, last.pos - last.pos % 4096)
try:
    sum(b.num_rows for b in t.read(0, 0))
except CorruptSegment as e:
    print("clean" if last.path in str(e) else "unnamed", first, e, flush=True)
else:
    print("read", first, flush=True)
"""


def test_a_segment_truncated_under_a_cached_mapping_is_corrupt_segment_not_sigbus(damaged):
    """The reader's process maps the segments; a file is truncated from outside the store;
    the next read of it is CorruptSegment naming the file, where the cached mapping used to
    take the reader down with SIGBUS."""
    tier, root, built = damaged
    r = _run_child(_TRUNCATE, tier, os.path.join(root, "store"))
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.split()[:2] == ["clean", str(built["records"])], r.stdout


if __name__ == "__main__":  # measure: python -m tests.test_chunk_damage TIER ROOT VERIFY
    import tempfile
    _tier, _verify = sys.argv[1], sys.argv[2] == "1"
    _root = tempfile.mkdtemp(dir="/dev/shm" if _tier == "pmem" else None)
    _built = build_store(_tier, _root)
    for _forged in (False, True):
        _cases = make_cases(_built, CASES if not _forged else CASES // 2, 20 + _forged, _forged)
        print(_tier, "verify" if _verify else "trusted", "forged" if _forged else "damaged",
              json.dumps(run_cases(_tier, _root, _built, _cases, _verify)))
