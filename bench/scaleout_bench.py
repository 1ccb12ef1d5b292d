"""A store shared by two hosts: what write-through adds to each micro-batch, and throughput.

On two simulated hosts (``tests/hosts.py``: network and mount namespaces, a tier 1 each) with
the store's root and its shared tier on a Ceph radosgw on the hosts' bridge:

1. **Micro-batches.** A long-lived writer on each host plays one Spark write task per batch:
   it appends ``--rows`` rows over ``--partitions`` partitions, flushes, and uploads them as
   one object (``Topic.share``). The driver (this process, host 0) then commits both tasks'
   chunks in one entry. Timed per batch: the upload (the slower task's) and the commit. The
   same batches on a local-root store on one host give the commit it replaces; the
   difference at p50 is the added latency. Objects written per batch are counted.
2. **Throughput on one host.** One process appends ``--big-rows`` rows per batch, shared and
   committed, on the shared store and on a local-root store: rows/s and their ratio.

The report goes to bench/RESULTS.md only with ``--write-results``. Needs root, ``ip``,
``unshare`` and Ceph's packages (``.ci/setup`` with ``PAFKA_SETUP_S3=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bench.bench_common import Output, add_output_args, fail, int_range, ratio  # noqa: E402
from migration import MigrationService  # noqa: E402
from tier_store import ChunkRef, Store  # noqa: E402

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.binary())])
SECTION = "scaleout"


def _table(start: int, rows: int, size: int) -> pa.Table:
    keys = np.arange(start, start + rows, dtype=np.int64)
    value = pa.array([b"v" * size] * rows, pa.binary())
    return pa.table({"key": keys, "value": value})


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs) * 1000, q))


# -- a host's writer: one task per line read, its references written back -------------------
def host_writer(root: str, conf: dict[str, Any], rows: int, size: int) -> None:
    """Serve write tasks: each input line ``<start>`` writes, flushes and shares one task."""
    store = Store.open(root, conf, create=False)
    topic = store.topic("batches")
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        start = int(line)
        t0 = time.perf_counter()
        refs = topic.write_chunks(_table(start, rows, size), key="key", durable=False)
        topic.sync()
        t1 = time.perf_counter()
        refs = topic.share(refs)
        t2 = time.perf_counter()
        print(json.dumps({"refs": [r.to_dict() for r in refs], "write": t1 - t0,
                          "upload": t2 - t1}), flush=True)


def micro_batches(hosts: Any, env: dict[str, str], root: str, conf: dict[str, Any],
                  args: argparse.Namespace) -> dict[str, Any]:
    """Per batch: the slower task's upload, the driver's commit; objects written."""
    with Store.open(root, conf) as s:
        s.create_topic("batches", SCHEMA, args.partitions)
    cmd = [sys.executable, os.path.abspath(__file__), "--host-writer", root, json.dumps(conf),
           str(args.rows), str(args.record_size)]
    procs = [subprocess.Popen(hosts.command(k, cmd, env), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT) for k in (1, 2)]
    try:
        for p in procs:
            if not json.loads(p.stdout.readline()).get("ready"):  # type: ignore[union-attr]
                raise fail("a host writer did not start")
        uploads, commits, writes, objects, live = [], [], [], 0, []
        with Store.open(root, conf, create=False) as s:
            topic = s.topic("batches")
            service = MigrationService(s)
            shared = s.shared
            assert shared is not None
            bundles = shared.bundle_dir("batches", topic.id)
            t_start = time.perf_counter()
            for b in range(args.batches):
                if b and b % args.compact_every == 0:
                    # The migration service of the store (on the driver): compacts what the
                    # hosts sealed, reclaims the objects no chunk names any more.
                    service.run_once()
                    live.append((time.perf_counter() - t_start,
                                 len(shared.tier.fs.ls(bundles, refresh=True))))
                for i, p in enumerate(procs):
                    p.stdin.write(f"{(2 * b + i) * args.rows}\n")  # type: ignore[union-attr]
                    p.stdin.flush()  # type: ignore[union-attr]
                answers = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore
                refs = [ChunkRef.from_dict(d) for a in answers for d in a["refs"]]
                objects += len({r.obj for r in refs})
                t0 = time.perf_counter()
                topic.commit(refs)
                commits.append(time.perf_counter() - t0)
                uploads.append(max(a["upload"] for a in answers))
                writes.append(max(a["write"] for a in answers))
            rows = sum(topic.latest_offsets().values())
            wall = time.perf_counter() - t_start
            compacted = service.stats.segments_down
        if rows != 2 * args.batches * args.rows:
            raise fail(f"the shared store holds {rows} rows, expected "
                       f"{2 * args.batches * args.rows}")
    finally:
        for p in procs:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(60)
    return {"upload": uploads, "commit": commits, "write": writes,
            "objects_per_batch": objects / args.batches, "objects": objects, "live": live,
            "wall": wall, "compacted": compacted}


def local_batches(base: str, args: argparse.Namespace) -> list[float]:
    """The same batches on a local-root store: the commit alone, per batch."""
    root = os.path.join(base, "local")
    conf = {"storage.tiers.types": "NVME", "storage.tiers.first.paths": f"{root}-tier1"}
    times = []
    with Store.open(root, conf) as s:
        topic = s.create_topic("batches", SCHEMA, args.partitions)
        for b in range(args.batches):
            refs = []
            for i in range(2):
                refs += topic.write_chunks(_table((2 * b + i) * args.rows, args.rows,
                                                  args.record_size), key="key", durable=False)
            topic.sync()
            t0 = time.perf_counter()
            topic.commit(refs)
            times.append(time.perf_counter() - t0)
    return times


def throughput(root: str, conf: dict[str, Any], args: argparse.Namespace) -> float:
    """Rows/s of one process appending big batches (written, shared, committed)."""
    with Store.open(root, conf) as s:
        topic = s.create_topic("big", SCHEMA, args.partitions)
        table = _table(0, args.big_rows, args.record_size)
        t0 = time.perf_counter()
        for _ in range(args.big_batches):
            refs = topic.write_chunks(table, key="key", durable=False)
            topic.sync()
            topic.commit(topic.share(refs))
        return args.big_rows * args.big_batches / (time.perf_counter() - t0)


def report(mb: dict[str, Any], local: list[float], tput: float, tput_local: float,
           args: argparse.Namespace) -> str:
    added = [u + c - lc for u, c, lc in zip(mb["upload"], mb["commit"], local, strict=True)]
    per_hour = mb["objects_per_batch"] * 3600
    lines = [
        "## Two hosts sharing a store (`bench/scaleout_bench.py`)",
        "",
        f"Two simulated hosts, each writing one task per micro-batch: {args.rows:,} records of "
        f"{args.record_size} bytes over {args.partitions} partitions. The root and the shared "
        f"tier are on a one-node Ceph radosgw. {args.batches} micro-batches; times in ms.",
        "",
        "| per micro-batch | p50 | p99 |",
        "|---|---|---|",
        f"| write and flush to tier 1 (slower task) | {_pct(mb['write'], 50):.1f} | "
        f"{_pct(mb['write'], 99):.1f} |",
        f"| upload: one object per task (slower task) | {_pct(mb['upload'], 50):.1f} | "
        f"{_pct(mb['upload'], 99):.1f} |",
        f"| commit on the shared store | {_pct(mb['commit'], 50):.1f} | "
        f"{_pct(mb['commit'], 99):.1f} |",
        f"| commit on a local-root store (one host) | {_pct(local, 50):.1f} | "
        f"{_pct(local, 99):.1f} |",
        f"| **added: upload + shared commit − local commit** | **{_pct(added, 50):.1f}** | "
        f"{_pct(added, 99):.1f} |",
        "",
        f"Objects written per micro-batch: {mb['objects_per_batch']:.1f} (one per task). At a "
        f"1-second trigger that is {per_hour:,.0f} objects an hour before compaction.",
        "",
        f"Compaction ran every {args.compact_every} micro-batches (log.segment.ms "
        f"{args.segment_ms}, log.cleanup.grace.ms {args.grace_ms}), compacting "
        f"{mb['compacted']} segments: of {mb['objects']} task "
        f"objects written in {mb['wall']:.0f} s, "
        f"{mb['live'][-1][1] if mb['live'] else mb['objects']} were left at the last run, at "
        f"most {max((n for _, n in mb['live']), default=0)} at once. Live objects stay "
        "bounded by the segments not yet sealed and two grace periods, not by time.",
        "",
        f"Throughput on one host, {args.big_batches} appends of {args.big_rows:,} records: "
        f"{tput:,.0f} records/s on the shared store against {tput_local:,.0f} on a local "
        f"root: {ratio(tput, tput_local, 'shared/local throughput'):.2f}×.",
        "",
        f"Target: at most 100 ms added at p50 per micro-batch. Measured: "
        f"{_pct(added, 50):.1f} ms.",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int_range(5, 100_000), default=200,
                    help="micro-batches to time (default 200)")
    ap.add_argument("--rows", type=int_range(1, 10_000_000), default=2000,
                    help="records per task and micro-batch (default 2000)")
    ap.add_argument("--record-size", type=int_range(1, 1 << 20), default=100,
                    help="bytes of each record's value (default 100)")
    ap.add_argument("--partitions", type=int_range(1, 1024), default=8,
                    help="partitions of the topic (default 8)")
    ap.add_argument("--big-rows", type=int_range(1, 100_000_000), default=200_000,
                    help="records per append in the throughput run (default 200000)")
    ap.add_argument("--big-batches", type=int_range(1, 10_000), default=10,
                    help="appends in the throughput run (default 10)")
    ap.add_argument("--segment-ms", type=int_range(100, 10**9), default=3000,
                    help="log.segment.ms of the micro-batch store (default 3000)")
    ap.add_argument("--grace-ms", type=int_range(100, 10**9), default=2000,
                    help="log.cleanup.grace.ms of the micro-batch store (default 2000)")
    ap.add_argument("--compact-every", type=int_range(1, 10**6), default=20,
                    help="micro-batches between two runs of the migration service (default "
                         "20)")
    add_output_args(ap)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--host-writer"]:
        host_writer(argv[1], json.loads(argv[2]), int(argv[3]), int(argv[4]))
        return
    args = parse_args(argv)
    from tests.hosts import SimulatedHosts, missing_tools
    from tests.s3server import S3Server, missing_binaries
    missing = missing_tools() + missing_binaries()
    if missing:
        raise fail(f"two simulated hosts need root, ip, unshare, mount and Ceph; missing: "
                   f"{', '.join(missing)}")
    base = tempfile.mkdtemp(prefix="pafka-scaleout-")
    try:
        with SimulatedHosts(2) as hosts:
            server = S3Server.start(host=hosts.bridge_address)
            try:
                os.environ.update(server.env)
                bucket = server.new_bucket()
                conf = {"storage.tiers.types": "NVME,REMOTE",
                        "storage.tiers.first.paths": hosts.tier1,
                        "storage.tiers.second.paths": f"s3://{bucket}/shared"}
                env = {**server.env, "PYTHONPATH": ROOT}
                mb = micro_batches(hosts, env, f"s3://{bucket}/store", {
                    **conf, "log.segment.ms": args.segment_ms,
                    "log.cleanup.grace.ms": args.grace_ms}, args)
                local = local_batches(base, args)
                tput = throughput(f"s3://{bucket}/tput", {
                    **conf, "storage.tiers.first.paths": os.path.join(base, "tput-shared-t1"),
                    "storage.tiers.second.paths": f"s3://{bucket}/tput-shared"}, args)
                lconf = {"storage.tiers.types": "NVME",
                         "storage.tiers.first.paths": os.path.join(base, "tput-tier1")}
                tput_local = throughput(os.path.join(base, "tput"), lconf, args)
            finally:
                server.close()
        Output(args).report(SECTION, report(mb, local, tput, tput_local, args))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
