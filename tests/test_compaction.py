"""Compaction and bundles on a store shared by many hosts, on a real radosgw.

Two simulated hosts: this process is host ``ha``, with tier 1 at ``<tmp>/t1``; host ``hb``
is a subprocess in a mount namespace of its own (``unshare -m``) where ``<tmp>/hb`` is
bind-mounted at ``<tmp>/t1``: the same path, another directory, as on two machines. The
migration service runs here (the driver) and compacts ``hb``'s segments, whose files it
cannot see, from their bundles.

Run as ``python -m tests.test_compaction ROLE JSON``, this module is what a host does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from .conftest import ROOT

SCHEMA = pa.schema([("id", pa.int64()), ("pad", pa.string())])
ROWS = 200  # per batch: about 11 KB per partition, so 64 KiB segments roll every ~5 batches
GRACE_MS = 300


def _can_simulate() -> str | None:
    if os.geteuid() != 0:
        return "simulated hosts need root (mount namespaces and bind mounts)"
    if shutil.which("unshare") is None:
        return "simulated hosts need unshare (util-linux)"
    return None


needs_hosts = pytest.mark.skipif(_can_simulate() is not None, reason=str(_can_simulate()))


def shared_conf(root: str, tier1: str, **extra: Any) -> dict[str, Any]:
    """A shared store: tier 1 per host at ``tier1``, then the REMOTE tier on the server."""
    return {"storage.tiers.types": "NVME,REMOTE", "storage.tiers.first.paths": tier1,
            "storage.tiers.first.sizes": "2m", "storage.tiers.second.paths": f"{root}-data",
            "log.segment.bytes": "64k", **extra}


def batch(start: int, n: int = ROWS) -> pa.Table:
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "pad": [f"{i:08d}" + "x" * 92 for i in range(start, start + n)]},
                    schema=SCHEMA)


def write(topic: Any, start: int, batches: int) -> int:
    """Commit ``batches`` batches of ids from ``start``, one write task (bundle) each."""
    for i in range(batches):
        topic.commit(topic.write_chunks(batch(start + i * ROWS), key="id"))
    return start + batches * ROWS


def tally(topic: Any) -> tuple[int, int]:
    """(rows, sum of ids) of the whole topic, each chunk checked."""
    n = total = 0
    for p in range(topic.partitions):
        for b in topic.read(p, 0):
            n += b.num_rows
            total += pc.sum(b.column("id")).as_py() or 0
    return n, total


def expected(ranges: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(b - a for a, b in ranges), sum(sum(range(a, b)) for a, b in ranges)


def bundles(store: Any, topic: Any) -> list[str]:
    shared = store.shared
    try:
        return sorted(os.path.basename(i) for i in shared.tier.fs.ls(
            shared.bundle_dir(topic.name, topic.id), refresh=True))
    except FileNotFoundError:
        return []


def local_files(tier1: str, topic: str = "t") -> list[str]:
    out = []
    for dirpath, _, names in os.walk(os.path.join(tier1, topic)):
        out += [os.path.join(os.path.relpath(dirpath, tier1), n) for n in names
                if n.endswith(".seg")]
    return sorted(out)


# -- what a host does ----------------------------------------------------------------------
def host_main(role: str, args: dict[str, Any]) -> dict[str, Any]:
    from tier_store import Store, read_counts
    store = Store.open(args["root"], shared_conf(args["root"], args["tier1"],
                                                 **args.get("conf", {})), create=False)
    t = store.topic("t")
    if role == "read-files":
        return {"files": local_files(args["tier1"]),
                "actives": {p: t.active_segment(p) for p in range(t.partitions)}}
    if role == "write":
        write(t, args["start"], args["batches"])
        return {"files": local_files(args["tier1"])}
    if role == "share":  # a write task killed after its upload, before its commit
        refs = t.share(t.write_chunks(batch(args["start"]), key="id"))
        print(json.dumps({"bundles": sorted({r.obj for r in refs})}), flush=True)
        time.sleep(600)
    if role == "read":
        n, total = tally(t)
        return {"rows": n, "sum": total, "counts": read_counts()}
    if role == "read-loop":  # reads until told to stop (a file appears), every row checked
        want, stop = tuple(args["want"]), args["stop"]
        loops, wrong = 0, []
        while not os.path.exists(stop):
            got = tally(t)
            loops += 1
            if got != want:
                wrong.append(got)
        return {"loops": loops, "wrong": wrong, "counts": read_counts()}
    if role == "evict":
        before = local_files(args["tier1"])
        r = store.evict_local()
        actives = {p: t.active_segment(p) for p in range(t.partitions)}
        return {"evicted": r.__dict__, "before": before, "after": local_files(args["tier1"]),
                "actives": actives}
    raise SystemExit(f"unknown role {role}")


class Host:
    """Host ``name``: its own directory ``own`` bind-mounted at ``tier1`` in a private mount
    namespace, ``PAFKA_HOST_ID=name``."""

    def __init__(self, name: str, own: str, tier1: str, root: str):
        self.name, self.own, self.tier1, self.root = name, own, tier1, root
        os.makedirs(own, exist_ok=True)

    def argv(self, argv: list[str]) -> list[str]:
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", self.own, self.tier1,
                *argv]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PAFKA_HOST_ID": self.name, "PYTHONPATH": ROOT}

    def _module(self, role: str, **args: Any) -> list[str]:
        args = {"root": self.root, "tier1": self.tier1, **args}
        return self.argv([sys.executable, "-m", "tests.test_compaction", role,
                          json.dumps(args)])

    def run(self, role: str, **args: Any) -> dict[str, Any]:
        p = subprocess.run(self._module(role, **args), env=self._env(), cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, f"host {self.name} {role}: {p.stderr[-3000:]}"
        return json.loads(p.stdout.strip().splitlines()[-1])

    def run_with(self, conf: dict[str, Any], role: str, **args: Any) -> dict[str, Any]:
        """:meth:`run` with ``conf`` added to the store's configuration on the host."""
        return self.run(role, conf=conf, **args)

    def start(self, role: str, **args: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(self._module(role, **args), env=self._env(), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv([sys.executable, "-m", "pafka_source.cli", *argv]),
                              env=self._env(), cwd=ROOT, capture_output=True, text=True,
                              timeout=180)


def open_two_hosts(root: str, tmp_path: Any, monkeypatch: Any) -> tuple[Any, Host]:
    """(store of host ``ha``, this process; host ``hb``): a shared store at ``root`` with
    topic ``t`` of two partitions and a grace period of 300 ms."""
    from tier_store import Store
    monkeypatch.setenv("PAFKA_HOST_ID", "ha")
    tier1 = str(tmp_path / "t1")
    os.makedirs(tier1)
    store = Store.open(root, shared_conf(root, tier1))
    store.create_topic("t", SCHEMA, 2, {"log.cleanup.grace.ms": GRACE_MS})
    return store, Host("hb", str(tmp_path / "hb"), tier1, root)


@pytest.fixture
def two_hosts(s3_root, tmp_path, monkeypatch):
    store, hb = open_two_hosts(s3_root, tmp_path, monkeypatch)
    yield store, hb
    store.close()


def _moved(done: list[Any]) -> set[int]:
    return {int(s.split("-")[1]) for r in done for s in r.sources}


def _reader(topic: Any, want: tuple[int, int], stop: threading.Event, out: dict[str, Any]
            ) -> None:
    loops, wrong = 0, []
    try:
        while not stop.is_set():
            got = tally(topic)
            loops += 1
            if got != want:
                wrong.append(got)
    except BaseException as e:  # reported by the test
        out["error"] = repr(e)
    out.update(loops=loops, wrong=wrong)


@needs_hosts
def test_compaction_from_another_host_reads_bundles_and_reads_stay_exact(two_hosts):
    from migration import MigrationService
    from tier_store import Store, read_counts
    store, hb = two_hosts
    t = store.topic("t")
    shared = store.shared
    end_a = write(t, 0, 2)
    hb.run("write", start=10_000, batches=12)
    want = expected([(0, end_a), (10_000, 10_000 + 12 * ROWS)])
    c0 = read_counts()
    assert tally(t) == want
    c1 = read_counts()
    assert c1["remote_chunks"] > c0["remote_chunks"] and c1["local_chunks"] > c0["local_chunks"]
    on_b = hb.run("read")
    assert (on_b["rows"], on_b["sum"]) == want and on_b["counts"]["local_chunks"] > 0
    before = bundles(store, t)
    assert len(before) == 2 + 12

    # Readers on both hosts while the service compacts and reclaims.
    stop_file = os.path.join(hb.own, "..", "stop-readers")
    b_reader = hb.start("read-loop", want=list(want), stop=os.path.abspath(stop_file))
    stop, seen = threading.Event(), {}
    reader_store = Store.open(store.root, create=False)
    thread = threading.Thread(target=_reader, args=(reader_store.topic("t"), want, stop, seen))
    thread.start()
    svc = MigrationService(store)
    try:
        rolled = svc.run_once()
        assert {q for q in _moved(rolled) if q not in shared.seqs}, \
            f"no segment of host hb was compacted: {rolled}"
        # Only rolled segments (log.segment.ms is 7 days): the newest segment of each
        # host's range in each partition stays.
        for p in range(2):
            newest: dict[int, int] = {}
            for s in t.state().part(p).segments.values():
                newest[s.seq >> 40] = max(newest.get(s.seq >> 40, -1), s.seq)
            assert not set(newest.values()) & {int(r.segment.split("-")[1]) for r in rolled
                                              if r.partition == p}
        # A service whose log.segment.ms has passed: every segment is old enough.
        aged_store = Store.open(store.root, {"log.segment.ms": 1}, create=False)
        aged = MigrationService(aged_store)
        time.sleep(0.4)
        rest = aged.run_once()
        for _ in range(2):  # bundles no chunk names: seen, then deleted after the grace
            time.sleep(GRACE_MS / 1000 + 0.1)
            aged.run_once()
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join(60)
        with open(stop_file, "w"):
            pass
        out, err = b_reader.communicate(timeout=120)
        reader_store.close()
        if "aged_store" in locals():
            aged_store.close()
    assert "error" not in seen, seen
    assert seen["loops"] > 0 and seen["wrong"] == []
    assert b_reader.returncode == 0, err[-3000:]
    on_b_during = json.loads(out.strip().splitlines()[-1])
    assert on_b_during["loops"] > 0 and on_b_during["wrong"] == []
    assert all(s.tier == 2 for s in t.state().segments.values()), rest
    after = bundles(store, t)
    moves = rolled + rest
    print(f"bundles: {len(before)} before compaction, {len(after)} after; segments "
          f"compacted: {len(rolled)} rolled, then {len(rest)} aged; {sum(r.bytes for r in moves)}"
          f" bytes in {sum(r.seconds for r in moves):.2f} s (max "
          f"{max(r.seconds for r in moves):.3f} s a move); reader loops here {seen['loops']}, "
          f"on hb {on_b_during['loops']}")
    assert after == []
    assert tally(t) == want
    on_b = hb.run("read")
    assert (on_b["rows"], on_b["sum"]) == want


@needs_hosts
def test_uncommitted_bundle_is_reclaimed_and_committed_one_never(two_hosts):
    import signal

    from tier_store.maintenance.bundles import reclaim_bundles, referenced
    store, hb = two_hosts
    t = store.topic("t")
    hb.run("write", start=0, batches=1)
    committed = bundles(store, t)
    assert len(committed) == 1
    task = hb.start("share", start=1_000)
    line = task.stdout.readline()
    task.send_signal(signal.SIGKILL)  # killed after its upload, before its commit
    task.wait(30)
    uploaded = time.time()
    orphan = json.loads(line)["bundles"]
    assert len(orphan) == 1 and len(bundles(store, t)) == 2
    gone_after = None
    while time.time() - uploaded < 20:
        n = reclaim_bundles(t)
        if n:
            gone_after = time.time() - uploaded
            assert n == 1
            break
        time.sleep(0.05)
    # Older than the grace period, and seen unreferenced for the grace period too.
    assert gone_after is not None and gone_after > GRACE_MS / 1000
    print(f"uncommitted bundle reclaimed {gone_after:.2f} s after its upload")
    assert bundles(store, t) == committed
    for _ in range(3):
        time.sleep(GRACE_MS / 1000 + 0.1)
        assert reclaim_bundles(t) == 0
    assert bundles(store, t) == committed == [f"{b}.chunks" for b in referenced(t.state())]
    assert tally(t) == expected([(0, ROWS)])
    assert hb.run("read")["rows"] == ROWS


@needs_hosts
def test_a_name_that_is_not_a_bundle_is_left_alone(two_hosts, caplog):
    from tier_store.maintenance.bundles import reclaim_bundles
    store, hb = two_hosts
    t = store.topic("t")
    hb.run("write", start=0, batches=1)
    fs, where = store.shared.tier.fs, store.shared.bundle_dir("t", t.id)
    fs.pipe(f"{where}/notes.txt", b"hello")
    fs.pipe(f"{where}/{'A' * 32}.chunks", b"upper case: not ours")
    time.sleep(GRACE_MS / 1000 + 0.1)
    reclaim_bundles(t)
    time.sleep(GRACE_MS / 1000 + 0.1)
    assert reclaim_bundles(t) == 0
    names = bundles(store, t)
    assert "notes.txt" in names and f"{'A' * 32}.chunks" in names and len(names) == 3
    assert "is not a bundle" in caplog.text


def test_plan_compaction_moves_every_movable_tier1_segment_oldest_first():
    from migration.policy import SegmentView, plan_compaction
    segs = [SegmentView("t", "0-5", 0, 5, 1, 100, 30, True),
            SegmentView("t", "0-1099511627776", 0, 2**40, 1, 100, 10, True),
            SegmentView("t", "1-7", 1, 7, 1, 100, 20, False),  # maybe a host's active one
            SegmentView("t", "1-3", 1, 3, 2, 100, 5, True)]  # on the shared tier already
    moves = plan_compaction(segs, 2)
    assert [(m.segments, m.source, m.target) for m in moves] == [
        (("0-1099511627776",), 1, 2), (("0-5",), 1, 2)]


if __name__ == "__main__":
    import logging
    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(host_main(sys.argv[1], json.loads(sys.argv[2]))), flush=True)
