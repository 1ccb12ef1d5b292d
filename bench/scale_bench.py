"""Scaling benchmark: how each hot path's cost grows with history, partitions and topics.

    .venv/bin/python bench/scale_bench.py [--commits 100000] [--partitions 1,256,1024]
                                          [--topics 2000] [--read-gb 2] [--write-results]

Every figure stands beside the same path's small-size figure from the same run, as a ratio
(the target of issue "a log that grows old" in brackets):

* history: 1-record commits to one topic of 8 partitions (a chunk per partition each);
  commit p50/p99 of the last 10% beside the first 10% (≤ 1.5×), the slowest commit after
  the first 10%, checkpoint bytes written per commit at the start and the end (flat), and
  the ``_log/`` directory's size;
* partitions: 1-record appends to a topic of P partitions, in turn; p50 beside 1 partition
  (≤ 1.5×), and a read's fixed cost per partition (a one-chunk read of each, ≤ 50 µs);
* topics: a new segment in a store of T topics, from a warm and from a fresh handle, beside
  a store of 1 topic (≤ 2×); ``Store.open`` + ``topics()`` (≤ 100 ms);
* open: ``Store.open`` + ``topic`` + ``latest_offsets`` on the history topic, right at a
  checkpoint and entries after it (≤ 20 ms);
* memory: peak RSS (anonymous and file-backed) of a process reading ``--read-gb`` from start
  to end (≈ 1 GiB at most);
* Spark driver: the stream reader's ``latestOffset`` + ``reportLatestOffset`` +
  ``partitions`` at 1,024 partitions, without Spark (≤ 20 ms);
* defaults: ``Store.open(root)`` with no configuration takes a ``--default-write-gb`` write.

The report is printed; ``--write-results`` rewrites this script's section of
``bench/RESULTS.md``, ``--out DIR`` writes it to ``DIR/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from bench_common import Output, add_output_args, dump_raw, int_range  # noqa: E402

from tier_store import Store  # noqa: E402

MARK = "scale-bench"
SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.string())])
ONE = pa.record_batch([pa.array([1], pa.int64()), pa.array(["x" * 100])], schema=SCHEMA)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q)) if xs else float("nan")


def _dir_bytes(path: str) -> tuple[int, int]:
    """(files, bytes) under ``path``."""
    files = size = 0
    for d, _, names in os.walk(path):
        for n in names:
            try:
                size += os.path.getsize(os.path.join(d, n))
                files += 1
            except FileNotFoundError:
                pass
    return files, size


# -- history ------------------------------------------------------------------------------------
WINDOW = 10_000  # commits: the first and last windows compared
SECTIONS = ("history", "partitions", "topics", "memory", "driver", "defaults")


def history(base: str, commits: int, partitions: int = 8, grace_ms: int = 600_000) -> dict:
    root = os.path.join(base, "history")
    store = Store.open(root, {"log.segment.bytes": "64m", "storage.tiers.first.sizes": "64g",
                              "log.cleanup.grace.ms": grace_ms})
    topic = store.create_topic("h", SCHEMA, partitions=partitions)
    log_dir = os.path.join(root, "h", "_log")
    times: list[float] = []
    cpu: list[float] = []  # the process's CPU time per commit: its own work, not waits
    cp_bytes: list[tuple[int, int]] = []  # (commit, checkpoint bytes)
    seen: set[str] = set()
    sizes: dict[int, tuple[int, int]] = {}
    marks = {commits // 10, commits}
    # The open figure at 1M chunks (the size), at a checkpoint and 50 entries on.
    million = -(-1_000_000 // partitions)
    opens: dict[int, float] = {}
    peer: list[tuple[int, float]] = []  # (commit, a plain file's create + fsync + unlink)
    for i in range(1, commits + 1):
        refs = []
        for p in range(partitions):
            refs += topic.write_chunks(ONE, partition=p, durable=False)
        topic.sync()
        c0, t0 = time.process_time(), time.perf_counter()
        topic.commit(refs)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if i % 100 == 0:  # a checkpoint was just written: its size
            for n in os.listdir(log_dir):
                if n.endswith(".checkpoint") and n not in seen:
                    seen.add(n)
                    try:
                        cp_bytes.append((i, os.path.getsize(os.path.join(log_dir, n))))
                    except FileNotFoundError:
                        pass
            peer.append((i, _peer_commit(base)))
        if i in marks:
            sizes[i] = _dir_bytes(log_dir)
        if i in (million, million + 50):
            opens[i - million] = _open_once(root)
    tenth = max(1, min(commits // 10, WINDOW))  # the windows: 10,000 commits
    first, last = times[:tenth], times[-tenth:]
    after = times[tenth:]
    worst = int(np.argmax(after)) + tenth if after else 0
    early = [b for c, b in cp_bytes if c <= tenth] or [0]
    late = [b for c, b in cp_bytes if c > commits - tenth] or [0]
    store.close()
    peer_first = [t for c, t in peer if c <= tenth] or [0.0]
    peer_last = [t for c, t in peer if c > commits - tenth] or [0.0]
    # The run's course, a tenth at a time: where a ratio grows, and whether the peer did too.
    step = max(1, commits // 10)
    course = [(i + step, _pct(times[i:i + step], 50), _pct(cpu[i:i + step], 50),
               _pct([t for c, t in peer if i < c <= i + step] or [0.0], 50))
              for i in range(0, commits - step + 1, step)]
    return {"commits": commits, "partitions": partitions, "window": tenth, "course": course,
            "peer_first_p50": _pct(peer_first, 50), "peer_last_p50": _pct(peer_last, 50),
            "open_at_million": opens,
            "cpu_first_p50": _pct(cpu[:tenth], 50), "cpu_last_p50": _pct(cpu[-tenth:], 50),
            "first_p50": _pct(first, 50), "first_p99": _pct(first, 99),
            "last_p50": _pct(last, 50), "last_p99": _pct(last, 99),
            "max_after_first": max(after) if after else 0.0, "max_at": worst + 1,
            # What the slowest waited on: its CPU time against its wall time, and whether it
            # wrote a checkpoint (every 100th).
            "max_cpu": cpu[worst] if after else 0.0,
            "checkpoint_bytes_early": statistics.median(early),
            "checkpoint_bytes_late": statistics.median(late),
            "log_dir": {str(k): v for k, v in sorted(sizes.items())}, "root": root,
            "grace_ms": grace_ms}


def _peer_commit(base: str) -> float:
    """A commit's plain-file peer: create a 1 KB file, fsync it and its directory, unlink
    it. Timed beside the commits, it shows whether the machine itself slowed down."""
    path = os.path.join(base, "peer.json")
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"x" * 1024)
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(base, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    t = time.perf_counter() - t0
    os.unlink(path)
    return t


def _open_once(root: str) -> float:
    """Median of 5: Store.open + topic + latest_offsets on the history topic, each in a
    fresh process."""
    code = ("import time, sys; t0 = time.perf_counter(); from tier_store import Store; "
            "t1 = time.perf_counter(); s = Store.open(sys.argv[1]); "
            "s.topic('h').latest_offsets(); print(time.perf_counter() - t1)")

    def once() -> float:
        out = subprocess.run([sys.executable, "-c", code, root], capture_output=True,
                             text=True, check=True, cwd=os.path.dirname(HERE))
        return float(out.stdout.strip())
    return statistics.median(once() for _ in range(5))


def open_costs(root: str, commits: int, extra: int = 50) -> dict:
    """Store.open + topic + latest_offsets on the history topic: at its checkpoint and
    ``extra`` entries after it (appended now)."""
    at_cp = _open_once(root)
    topic = Store.open(root).topic("h")
    for _ in range(extra):
        topic.append(ONE, partition=0)
    after = _open_once(root)
    return {"at_checkpoint": at_cp, "after": after, "extra": extra,
            "version": topic.version, "chunks": commits * 8 + extra}


# -- partitions ---------------------------------------------------------------------------------
def partitions(base: str, counts: list[int], appends: int = 2000) -> dict:
    out = {}
    for n in counts:
        root = os.path.join(base, f"parts-{n}")
        store = Store.open(root, {"log.segment.bytes": "1m", "storage.tiers.first.sizes": "64g"})
        topic = store.create_topic("p", SCHEMA, partitions=n)
        for p in range(n):  # every partition has its segment before timing
            topic.append(ONE, partition=p)
        times = []
        for i in range(appends):
            t0 = time.perf_counter()
            topic.append(ONE, partition=i % n)
            times.append(time.perf_counter() - t0)
        sample = list(range(0, n, max(1, n // 256)))

        def read_pass(root: str = root, sample: list[int] = sample) -> float:
            reader = Store.open(root).topic("p")  # fresh each time, as an executor task's
            t0 = time.perf_counter()
            for p in sample:
                for _ in reader.read(p, 0, 1):
                    pass
            return (time.perf_counter() - t0) / len(sample)
        out[str(n)] = {"append_p50": _pct(times, 50), "append_p99": _pct(times, 99),
                       "read_per_partition": statistics.median(read_pass() for _ in range(5)),
                       "read_peer": _peer_reads(os.path.join(root, "peer"), len(sample))}
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


def _peer_reads(where: str, files: int) -> float:
    """The peer of a fresh read per partition: one record from each of ``files`` plain Arrow
    IPC files, each opened, read and closed (median of 5 passes)."""
    os.makedirs(where)
    paths = [os.path.join(where, f"{i}.arrow") for i in range(files)]
    for path in paths:
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, SCHEMA) as w:
            w.write_batch(ONE)

    def one_pass() -> float:
        t0 = time.perf_counter()
        for path in paths:
            with pa.OSFile(path) as f:
                pa.ipc.open_file(f).get_batch(0)
        return (time.perf_counter() - t0) / files
    return statistics.median(one_pass() for _ in range(5))


# -- topics -------------------------------------------------------------------------------------
_NEW_SEGMENT = """
import sys, time
from tier_store import Store
import pyarrow as pa
t0 = time.perf_counter()
s = Store.open(sys.argv[1])
t = s.topic("t0")
t1 = time.perf_counter()
p = t.partitions - 1
t.append(pa.record_batch([pa.array([1]), pa.array(["x"])], names=["key", "value"]), partition=p)
print(time.perf_counter() - t1)
"""


def topics(base: str, count: int, sized: bool = False) -> dict:
    """A new segment with 1 and ``count`` topics: tier 1 sized by its filesystem (the
    default), or with ``sized`` of a fixed size, whose usage placement counts."""
    out = {}
    conf = {"log.segment.bytes": "1m"}
    if sized:
        conf["storage.tiers.first.sizes"] = "64g"
    for n in (1, count):
        root = os.path.join(base, f"topics-{n}")
        store = Store.open(root, conf)
        for i in range(n):
            store.create_topic(f"t{i}", SCHEMA, partitions=1)
            store.topic(f"t{i}").append(ONE)
            if i:  # its handle let go: two descriptors each would pass 20,000 topics' worth
                store.forget_topic(f"t{i}")
        t = store.topic("t0")
        warm = []
        for _ in range(20):  # each: a new partition's first segment, on a warm handle
            t.add_partitions(1)
            p = t.partitions - 1
            t0 = time.perf_counter()
            t.append(ONE, partition=p)
            warm.append(time.perf_counter() - t0)
        fresh = []
        for _ in range(5):
            t.add_partitions(1)
            r = subprocess.run([sys.executable, "-c", _NEW_SEGMENT, root], capture_output=True,
                               text=True, check=True, cwd=os.path.dirname(HERE))
            fresh.append(float(r.stdout.strip()))
        t0 = time.perf_counter()
        names = Store.open(root).topics()
        listed = time.perf_counter() - t0
        assert len(names) == n
        out[str(n)] = {"new_segment_warm": statistics.median(warm),
                       "new_segment_fresh": statistics.median(fresh),
                       "open_and_topics": listed}
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


# -- memory -------------------------------------------------------------------------------------
_READ_ALL = """
import resource, sys
from tier_store import Store
t = Store.open(sys.argv[1]).topic("m")
n = 0
for p in range(t.partitions):
    for b in t.read(p, 0):
        n += b.num_rows
rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(n, rss_kb * 1024)
"""


def memory(base: str, gb: float) -> dict:
    root = os.path.join(base, "memory")
    store = Store.open(root, {"storage.tiers.first.sizes": "64g"})
    topic = store.create_topic("m", SCHEMA, partitions=2)
    rows = 1 << 16
    batch = pa.record_batch([pa.array(np.arange(rows)),
                             pa.array(["v" * 1000] * rows)], schema=SCHEMA)
    total = int(gb * 1e9)
    written = 0
    i = 0
    while written < total:
        topic.append(batch, partition=i % 2)
        written += batch.nbytes
        i += 1
    store.close()
    r = subprocess.run([sys.executable, "-c", _READ_ALL, root], capture_output=True, text=True,
                       check=True, cwd=os.path.dirname(HERE))
    n, peak = map(int, r.stdout.split())
    shutil.rmtree(root, ignore_errors=True)
    return {"read_bytes": written, "records": n, "peak_rss": peak}


# -- the Spark driver ---------------------------------------------------------------------------
def driver(base: str, n: int = 1024) -> dict:
    """In a process of its own, as a streaming query's Python reader runs: a process that
    holds this bench's other sections would pay for their objects in every collection."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--driver-child",
                          base, str(n)], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(HERE))
    return json.loads(out.stdout.strip().splitlines()[-1])


def _driver(base: str, n: int, batches: int = 30) -> dict:
    from pyspark.sql.types import StructType

    from pafka_source.options import SourceOptions
    from pafka_source.reader import PafkaStreamReader
    from pafka_source.types import spark_schema
    root = os.path.join(base, "driver")
    store = Store.open(root, {"log.segment.bytes": "1m", "storage.tiers.first.sizes": "64g"})
    topic = store.create_topic("d", SCHEMA, partitions=n)

    def one_batch() -> None:
        refs = []
        for p in range(n):
            refs += topic.write_chunks(ONE, partition=p, durable=False)
        topic.sync()
        topic.commit(refs)

    one_batch()
    schema: StructType = spark_schema(topic.schema, include_metadata=False)
    reader = PafkaStreamReader(SourceOptions.parse({"path": root, "topic": "d",
                                                    "startingOffsets": "earliest"}), schema)
    start = reader.initialOffset()
    times = []
    for _ in range(batches):
        one_batch()
        t0 = time.perf_counter()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        reader.reportLatestOffset()
        reader.partitions(start, end)
        times.append(time.perf_counter() - t0)
        start = end
    store.close()
    return {"partitions": n, "per_batch": statistics.median(times), "fastest": min(times),
            "batches": batches}


# -- defaults -----------------------------------------------------------------------------------
def defaults(base: str, gb: float) -> dict:
    root = os.path.join(base, "defaults")
    store = Store.open(root)
    topic = store.create_topic("big", SCHEMA, partitions=1)
    rows = 1 << 16
    batch = pa.record_batch([pa.array(np.arange(rows)), pa.array(["d" * 1000] * rows)],
                            schema=SCHEMA)
    written = 0
    try:
        while written < gb * 1e9:
            topic.append(batch)
            written += batch.nbytes
        error = None
    except Exception as e:  # noqa: BLE001 - reported
        error = f"{type(e).__name__}: {str(e)[:300]}"
    store.close()
    shutil.rmtree(root, ignore_errors=True)
    return {"written": written, "error": error}


def report(args: argparse.Namespace, r: dict) -> str:
    def ms(x: float) -> str:
        return f"{x * 1e3:.2f} ms"

    lines = ["## Scaling (`bench/scale_bench.py`)", "",
             f"Each figure beside its small-size peer from the same run; targets in brackets. "
             f"Command: `.venv/bin/python bench/scale_bench.py {' '.join(sys.argv[1:])}`."]
    if "history" in r:
        lines += _history_lines(r, ms)
    if "partitions" in r:
        lines += _partition_lines(r, ms)
    if "topics" in r:
        lines += _topic_lines(r, ms)
    if "memory" in r:
        m = r["memory"]
        lines += ["", f"**Memory**: reading {m['read_bytes'] / 1e9:.1f} GB start to end peaked "
                  f"at {m['peak_rss'] / 2**30:.2f} GiB RSS (≈ 1 GiB at most)."]
    if "driver" in r:
        d = r["driver"]
        lines += ["", f"**Spark driver** at {d['partitions']:,} partitions: `latestOffset` + "
                  f"`reportLatestOffset` + `partitions` took {ms(d['per_batch'])} per "
                  f"micro-batch (median of {d['batches']}; fastest {ms(d['fastest'])}; "
                  "≤ 20 ms), in a process of its own, as a query's reader runs."]
    if "defaults" in r:
        f = r["defaults"]
        lines += ["", f"**Defaults**: `Store.open(root)` took {f['written'] / 1e9:.2f} GB"
                  + (f", then failed: {f['error']}" if f["error"] else " without an error")
                  + "."]
    return "\n".join(lines) + "\n"


def _history_lines(r: dict, ms: Callable[[float], str]) -> list[str]:
    h = r["history"]
    w = h.get("window", h["commits"] // 10)
    lines = ["", f"**History**: {h['commits']:,} commits to {h['partitions']} partitions (one "
             "1-record chunk each).", "",
             f"| figure | first {w:,} commits | last {w:,} | ratio |", "|---|---|---|---|",
             f"| commit p50 | {ms(h['first_p50'])} | {ms(h['last_p50'])} | "
             f"{h['last_p50'] / h['first_p50']:.2f}× (≤ 1.5×) |",
             f"| commit p99 | {ms(h['first_p99'])} | {ms(h['last_p99'])} | "
             f"{h['last_p99'] / h['first_p99']:.2f}× (≤ 1.5×) |",
             f"| checkpoint bytes | {h['checkpoint_bytes_early']:,.0f} | "
             f"{h['checkpoint_bytes_late']:,.0f} | "
             f"{h['checkpoint_bytes_late'] / max(1, h['checkpoint_bytes_early']):.1f}× (flat) |",
             "", f"Slowest commit after the first {w:,}: {ms(h['max_after_first'])} (commit "
             f"{h['max_at']:,}; target ≤ 100 ms"
             + (f"; {ms(h['max_cpu'])} of it on the CPU"
                + (", a checkpoint's commit" if h['max_at'] % 100 == 0 else "")
                if "max_cpu" in h else "")
             + "). `_log/` files and bytes: "
             + ", ".join(f"{int(k):,} commits: {v[0]:,} files, {v[1] / 1e6:,.1f} MB"
                         for k, v in h["log_dir"].items())
             + f" (the log keeps what was written within `log.cleanup.grace.ms`, "
             f"{h.get('grace_ms', 600_000) / 1000:,.0f} s here)."]
    if h.get("peer_first_p50"):
        lines += ["", "The machine over the same run: a plain file created, fsynced and "
                  f"unlinked every 100 commits took {ms(h['peer_first_p50'])} (p50) in the "
                  f"first window and {ms(h['peer_last_p50'])} in the last "
                  f"({h['peer_last_p50'] / h['peer_first_p50']:.2f}×). The commit's own CPU "
                  f"time (p50): {ms(h['cpu_first_p50'])} in the first window, "
                  f"{ms(h['cpu_last_p50'])} in the last "
                  f"({h['cpu_last_p50'] / max(h['cpu_first_p50'], 1e-9):.2f}×)."]
    if h.get("course"):
        lines += ["", "| commits up to | commit p50 | its CPU p50 | peer p50 |",
                  "|---|---|---|---|"]
        lines += [f"| {c:,} | {ms(t)} | {ms(u)} | {ms(q)} |" for c, t, u, q in h["course"]]
    o = r["open"]
    lines += ["", f"**Open** (`Store.open` + `topic` + `latest_offsets`, in a fresh process, "
              f"{o['chunks']:,} chunks): {ms(o['at_checkpoint'])} at a checkpoint, "
              f"{ms(o['after'])} {o['extra']} entries after it (≤ 20 ms)."]
    m = h.get("open_at_million") or {}
    if m:
        lines[-1] += (f" At 1,000,000 chunks, during the run: {ms(m[0])} at a checkpoint"
                      + (f", {ms(m[50])} 50 entries after it." if 50 in m else "."))
    return lines


def _partition_lines(r: dict, ms: Callable[[float], str]) -> list[str]:
    p = r["partitions"]
    one = p[min(p, key=int)]
    lines = ["", "**Partitions** (1-record appends, partitions in turn; a one-record read "
              "of each partition from a fresh handle):", "",
              "| partitions | append p50 | ratio to 1 partition | read, per partition "
              "| peer read | ratio |", "|---|---|---|---|---|---|"]
    for n, v in sorted(p.items(), key=lambda kv: int(kv[0])):
        peer = v.get("read_peer")
        lines.append(f"| {int(n):,} | {ms(v['append_p50'])} | "
                     f"{v['append_p50'] / one['append_p50']:.2f}× (≤ 1.5×) | "
                     f"{v['read_per_partition'] * 1e6:.0f} µs (≤ 50 µs) | "
                     + (f"{peer * 1e6:.0f} µs | {v['read_per_partition'] / peer:.2f}× |"
                        if peer else "| |"))
    lines += ["", "A read pass opens a fresh handle and reads one record of each of up to 256 "
              "partitions: the median of 5 passes. The peer opens a plain Arrow IPC file per "
              "partition, reads its record and closes it."]
    return lines


def _topic_lines(r: dict, ms: Callable[[float], str]) -> list[str]:
    t = r["topics"]
    many = int(max(t, key=int))
    lines = ["", f"**Topics** (a new segment; {many:,} topics beside 1; tier 1 sized by its "
              "filesystem, the default, and of a fixed size, whose usage placement counts):",
              "", "| figure | 1 topic | many | ratio |", "|---|---|---|---|"]
    for label, t in (("default", r["topics"]), ("fixed size", r["topics_sized"])):
        small, big = t["1"], t[str(many)]
        for key, what in (("new_segment_warm", "warm handle"),
                          ("new_segment_fresh", "fresh handle")):
            lines.append(f"| new segment, {what}, {label} | {ms(small[key])} | {ms(big[key])} "
                         f"| {big[key] / small[key]:.2f}× (≤ 2×) |")
    small, big = r["topics"]["1"], r["topics"][str(many)]
    lines.append(f"| `Store.open` + `topics()` | {ms(small['open_and_topics'])} | "
                 f"{ms(big['open_and_topics'])} | (≤ 100 ms) |")
    return lines


def _raise_open_files(want: int = 65536) -> int:
    """Raise this process's descriptor limit toward ``want`` (a writer holds two per topic
    handle and one per active segment, as a Kafka broker does); returns the limit now."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
        except (ValueError, OSError):  # not root: as far as the hard limit goes
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def main() -> None:
    if sys.argv[1:2] == ["--driver-child"]:
        print(json.dumps(_driver(sys.argv[2], int(sys.argv[3]))), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commits", type=int_range(1000, 10**8), default=100_000)
    ap.add_argument("--partitions", default="1,256,1024",
                    help="partition counts, comma-separated (default 1,256,1024)")
    ap.add_argument("--topics", type=int_range(2, 10**6), default=2000)
    ap.add_argument("--read-gb", type=float, default=2.0)
    ap.add_argument("--default-write-gb", type=float, default=2.0)
    ap.add_argument("--driver-partitions", type=int_range(1, 10**5), default=1024)
    ap.add_argument("--grace-ms", type=int_range(0, 10**9), default=600_000,
                    help="log.cleanup.grace.ms of the history run (default the store's): "
                         "the log keeps what was written within it")
    ap.add_argument("--keep-history", metavar="DIR",
                    help="move the history section's store to DIR when done (a new path), to "
                         "study a long log afterwards; by default it is deleted")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"which to run, comma-separated (default all: {','.join(SECTIONS)})")
    add_output_args(ap)
    args = ap.parse_args()
    run = set(args.sections.split(","))
    print(f"open files limit: {_raise_open_files()}", flush=True)
    if not run or not run <= set(SECTIONS):
        ap.error(f"--sections {args.sections!r}: each must be one of {', '.join(SECTIONS)}")
    if args.keep_history and os.path.lexists(args.keep_history):
        ap.error(f"--keep-history {args.keep_history!r}: give a path that does not exist yet")
    output = Output(args)
    base = tempfile.mkdtemp(prefix="pafka-scale-", dir=os.path.join(HERE))
    r: dict = {}
    try:
        if "history" in run:
            print("history", flush=True)
            r["history"] = history(base, args.commits, grace_ms=args.grace_ms)
            print(r["history"], flush=True)
            r["open"] = open_costs(r["history"].pop("root"), args.commits)
            print(r["open"], flush=True)
            if args.keep_history:
                shutil.move(os.path.join(base, "history"), args.keep_history)
                print(f"history store kept in {args.keep_history}", flush=True)
            shutil.rmtree(os.path.join(base, "history"), ignore_errors=True)
        if "partitions" in run:
            r["partitions"] = partitions(base, [int(x) for x in args.partitions.split(",")])
            print(r["partitions"], flush=True)
        if "topics" in run:
            r["topics"] = topics(base, args.topics)
            print(r["topics"], flush=True)
            r["topics_sized"] = topics(base, args.topics, sized=True)
            print(r["topics_sized"], flush=True)
        if "memory" in run:
            r["memory"] = memory(base, args.read_gb)
            print(r["memory"], flush=True)
        if "driver" in run:
            r["driver"] = driver(base, args.driver_partitions)
            print(r["driver"], flush=True)
        if "defaults" in run:
            r["defaults"] = defaults(base, args.default_write_gb)
            print(r["defaults"], flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    dump_raw(r)
    print(json.dumps(r, default=float)[:2000], flush=True)
    output.report(MARK, report(args, r))


if __name__ == "__main__":
    main()
