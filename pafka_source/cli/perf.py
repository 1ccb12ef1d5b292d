"""``pafka perf produce|consume``: throughput and latency of appends or reads, in several
processes at once, as ``kafka-producer-perf-test`` and Pafka's multi-client benchmark report.

``--records`` is the total, as Kafka's ``--num-records``: ``--processes`` processes share it.
To produce, each appends its share to a partition of its own, ``--batch-records`` at a time. To
consume, the partitions are dealt out as a consumer group's are, and each process reads its
partitions from their earliest offsets; the first ``--records`` records of the topic are read,
each once. The latency of one append covers its write and its commit, that of one read the
planning, mapping and checksum check of its records. All processes start together.
Figures are per process and in total: records/s, MB/s (10^6 bytes of Arrow data) and latency
(average and percentiles), then Kafka's one-line summary. A missing topic (with ``--create``)
gets a partition per process, holding an int64 ``key`` and a binary ``value`` of
``--record-size`` bytes (Arrow adds a 4-byte offset per value).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa

from tier_store import InvalidArgument, PafkaError, Store, TopicNotFound

from . import output as out
from .args import positive, whole
from .store_commands import open_store

SCHEMA = pa.schema([("key", pa.int64()), ("value", pa.binary())])
START_TIMEOUT = 300.0  # seconds for every process to open the store (a loaded machine)


class PerfFailed(PafkaError):
    """A process of ``pafka perf`` failed or died."""


def add_commands(command: Any) -> None:
    """Add ``pafka perf`` with ``command(name, help)``."""
    c = command("perf", "measure appends (produce) or reads (consume) of a topic: records/s, "
                        "MB/s and latency percentiles, over several processes at once")
    c.epilog = ("Example: pafka perf produce ROOT perf --create --records 1000000 "
                "--record-size 104 --processes 2 --batch-records 10000. A record-size of 104 "
                "makes 116-byte "
                "records, as bench/store_bench.py writes.")
    c.add_argument("mode", choices=("produce", "consume"),
                   help="produce: append records; consume: read them from the earliest offsets")
    c.add_argument("root", metavar="ROOT",
                   help="the store's root directory (or s3:// URL); it must exist")
    c.add_argument("topic", metavar="TOPIC",
                   help="the topic; a missing one is an error unless --create is given")
    c.add_argument("--create", action="store_true",
                   help="create the topic if it is missing, with a partition per process "
                        "(consume fills it with --records records first)")
    c.add_argument("--records", type=whole(1, 10**12), required=True, metavar="N",
                   help="records appended or read in all, shared by the processes (Kafka's "
                        "--num-records)")
    c.add_argument("--record-size", type=whole(0, 16 << 20), metavar="B",
                   help="bytes of each record's value (required to produce, or to create a "
                        "topic to consume)")
    c.add_argument("--throughput", type=positive("records per second"), metavar="T",
                   help="at most T records per second per process (default: no limit)")
    c.add_argument("--processes", type=whole(1, 64), default=1, metavar="K",
                   help="processes running at once (default 1)")
    c.add_argument("--batch-records", type=whole(1, 10**8), default=10_000, metavar="R",
                   help="records per append or per read (default 10000)")
    c.add_argument("--json", action="store_true", help="print JSON instead of text")
    c.set_defaults(func=cmd_perf, parser=c, check_usage=lambda a: (
        "produce needs --record-size B (the bytes of each record's value)"
        if a.mode == "produce" and a.record_size is None else None))


# -- the data ----------------------------------------------------------------------------------
def perf_batch(records: int, record_size: int, seed: int = 0) -> pa.RecordBatch:
    """``records`` records: keys 0, 1, ... and random values of ``record_size`` bytes."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=records * record_size, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (records + 1) * record_size, max(record_size, 1), dtype=np.int32)
    if record_size == 0:
        offsets = np.zeros(records + 1, dtype=np.int32)
    values = pa.Array.from_buffers(pa.binary(), records,
                                   [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])
    return pa.record_batch([pa.array(np.arange(records, dtype=np.int64)), values],
                           schema=SCHEMA)


def _prepare(store: Store, mode: str, topic: str, records: int, record_size: int | None,
             processes: int, batch_records: int, progress: Any, create: bool) -> bool:
    """Check or create the topic (only with ``create``); True if it was created."""
    if mode == "produce" and record_size is None:
        raise InvalidArgument("pafka perf produce needs --record-size B (the bytes of each "
                              "record's value)")
    if record_size is not None and min(batch_records, records) * record_size >= 1 << 31:
        # A binary column's offsets are int32: one batch holds under 2 GiB of values.
        raise InvalidArgument(f"--batch-records {batch_records} x --record-size {record_size} "
                              "is 2 GiB or more in one append; lower --batch-records")
    try:
        t = store.topic(topic)
    except TopicNotFound:
        if not create:  # a mistyped name must not become a topic
            topics = ", ".join(store.topics()) or "(none)"
            raise InvalidArgument(f"topic {topic!r} does not exist (topics: {topics}); check "
                                  "the name, or add --create to make it") from None
        if record_size is None:
            raise InvalidArgument(f"topic {topic!r} does not exist: give --record-size to "
                                  "create it" + (" and fill it" if mode == "consume" else "")
                                  ) from None
        t = store.create_topic(topic, SCHEMA, partitions=processes)
        if mode == "consume":  # what the readers read, written before they start
            batch = perf_batch(min(batch_records, records), record_size)
            for done in range(0, records, batch.num_rows):
                n = min(batch.num_rows, records - done)
                t.append(batch.slice(0, n), partition=(done // batch.num_rows) % processes)
                progress(n)
        return True
    if mode == "produce" and not t.schema.equals(SCHEMA):
        cols = ", ".join(f"{f.name} {f.type}" for f in t.schema)
        raise InvalidArgument(f"topic {topic!r} has columns ({cols}); pafka perf produce "
                              "writes key int64 and value binary: name a new topic")
    held = sum(t.latest_offsets().values()) - sum(t.earliest_offsets().values())
    if mode == "consume" and held < records:
        raise InvalidArgument(f"topic {topic!r} holds {held:,} records, fewer than --records "
                              f"{records:,}: lower --records, or produce more first")
    if mode == "consume" and t.partitions < processes:
        raise InvalidArgument(f"topic {topic!r} has {t.partitions} partition(s), fewer than "
                              f"--processes {processes}: a partition is read by one process "
                              "(as in a consumer group), so lower --processes")
    return False


def shares(records: int, processes: int) -> list[int]:
    """``records`` split over ``processes``, the first ones taking one more."""
    q, r = divmod(records, processes)
    return [q + (i < r) for i in range(processes)]


def read_ranges(earliest: dict[int, int], latest: dict[int, int], records: int,
                processes: int) -> list[list[tuple[int, int, int]]]:
    """Per process, the ``(partition, start, end)`` ranges it reads: partition ``p`` goes to
    process ``p % processes``, and each process takes its share of ``records`` from its
    partitions in turn. Every offset is read once."""
    parts = [sorted(p for p in earliest if p % processes == i) for i in range(processes)]
    held = [sum(latest[p] - earliest[p] for p in ps) for ps in parts]
    want = shares(records, processes)
    left = records - sum(min(w, h) for w, h in zip(want, held, strict=True))
    out = []
    for ps, w, h in zip(parts, want, held, strict=True):
        take = min(w, h)
        extra = min(left, h - take)  # a process short of records leaves its share to others
        take, left = take + extra, left - extra
        ranges = []
        for p in ps:
            n = min(take, latest[p] - earliest[p])
            if n:
                ranges.append((p, earliest[p], earliest[p] + n))
            take -= n
        out.append(ranges)
    return out


def _percentiles(seconds: np.ndarray) -> dict[str, float]:
    if not len(seconds):
        return {"avg": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "p99.9": 0.0, "max": 0.0}
    p50, p95, p99, p999 = np.percentile(seconds * 1000, [50, 95, 99, 99.9])
    return {"avg": float(seconds.mean() * 1000), "p50": float(p50), "p95": float(p95),
            "p99": float(p99), "p99.9": float(p999), "max": float(seconds.max() * 1000)}


def _figures(records: int, nbytes: int, seconds: float, lat: np.ndarray) -> dict[str, Any]:
    seconds = max(seconds, 1e-9)
    return {"records": records, "bytes": nbytes, "seconds": seconds,
            "batches": len(lat), "records_per_s": records / seconds,
            "mb_per_s": nbytes / seconds / 1e6, "latency_ms": _percentiles(lat)}


def run_perf(root: str, mode: str, topic: str, records: int, record_size: int | None,
             throughput: float | None = None, processes: int = 1, batch_records: int = 10_000,
             progress: Any = None, create: bool = False) -> dict[str, Any]:
    """Run the measurement (see the module's docstring). ``progress(phase, n)`` hears of
    each ``n`` records done; ``phase`` is "filling" (a new topic to consume) or ``mode``.
    Returns the figures per process and in total."""
    progress = progress or (lambda phase, n: None)
    store = open_store(root)
    created = _prepare(store, mode, topic, records, record_size, processes, batch_records,
                       lambda n: progress("filling", n), create)
    if mode == "produce":
        t = store.topic(topic)
        work: list[Any] = [(n, i % t.partitions) for i, n in
                           enumerate(shares(records, processes))]
    else:
        t = store.topic(topic)
        work = read_ranges(t.earliest_offsets(), t.latest_offsets(), records, processes)
    ctx = mp.get_context("spawn")  # no fork of a process holding locks and threads
    counters = ctx.Array("q", processes, lock=False)
    barrier = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    args = (mode, store.root, topic, record_size or 0, throughput, batch_records)
    procs = [ctx.Process(target=_worker, args=(i, work[i], *args, counters, barrier, results),
                         name=f"pafka-perf-{i}", daemon=True) for i in range(processes)]
    for p in procs:
        p.start()
    got: dict[int, dict[str, Any]] = {}
    try:
        barrier.wait(START_TIMEOUT)
    except Exception:  # a process failed to start: its error is in the queue
        pass
    shown = 0
    while len(got) < processes:
        try:
            i, r = results.get(timeout=0.2)
            got[i] = r
        except queue.Empty:
            dead = [p for i, p in enumerate(procs) if i not in got and not p.is_alive()]
            if dead and results.empty():
                time.sleep(0.5)  # a result put just before exiting is still in the pipe
                if results.empty():
                    raise PerfFailed(f"perf process {dead[0].name} died (exit code "
                                     f"{dead[0].exitcode}) before reporting") from None
        done = sum(counters[:])
        progress(mode, done - shown)
        shown = done
    for p in procs:
        p.join(30)
    errors = [f"perf process {i} failed: {r['error']}" for i, r in sorted(got.items())
              if r.get("error")]
    if not errors and any("error" in r for r in got.values()):
        errors = [f"the processes did not all start within {START_TIMEOUT:.0f} s"]
    if errors:
        raise PerfFailed("; ".join(errors))
    per = []
    for i in range(processes):
        r = got[i]
        per.append({"process": i, "partitions": r["partitions"],
                    **_figures(r["records"], r["bytes"], r["end"] - r["start"], r["lat"])})
    lat = np.concatenate([got[i]["lat"] for i in range(processes)])
    wall = max(r["end"] for r in got.values()) - min(r["start"] for r in got.values())
    total = _figures(sum(x["records"] for x in per), sum(x["bytes"] for x in per), wall, lat)
    return {"mode": mode, "root": store.root, "topic": topic, "created_topic": created,
            "records": records, "record_size": record_size, "batch_records": batch_records,
            "processes": processes, "throughput_cap": throughput,
            "per_process": per, "total": total}


def _worker(i: int, work: Any, mode: str, root: str, topic: str, record_size: int,
            throughput: float | None, batch_records: int, counters: Any, barrier: Any,
            results: Any) -> None:
    """One process's run: open, wait for the others, append or read ``work`` (produce: how
    many records, to which partition; consume: its ranges), report."""
    try:
        store = Store.open(root, create=False)
        t = store.topic(topic)
        if mode == "produce":
            records, partition = work
            batch = perf_batch(min(batch_records, max(records, 1)), record_size, seed=i)
            parts = [partition]
        else:
            parts = [p for p, _, _ in work]
        barrier.wait(START_TIMEOUT)
    except threading.BrokenBarrierError:  # another process failed: it reports why
        results.put((i, {"error": None}))
        return
    except BaseException as e:
        results.put((i, {"error": out.error_text(e)}))
        barrier.abort()
        return
    try:
        lat: list[float] = []
        done = nbytes = 0
        start = time.perf_counter()
        if mode == "produce":
            while done < records:
                n = min(batch_records, records - done)
                b = batch if n == batch.num_rows else batch.slice(0, n)
                t0 = time.perf_counter()
                t.append(b, partition=parts[0])
                lat.append(time.perf_counter() - t0)
                done += n
                nbytes += b.nbytes
                counters[i] = done
                _pace(start, done, throughput)
        else:
            for p, pos, stop in work:
                while pos < stop:
                    end = min(pos + batch_records, stop)
                    t0 = time.perf_counter()
                    for b in t.read(p, pos, end):
                        nbytes += b.nbytes
                    lat.append(time.perf_counter() - t0)
                    done += end - pos
                    pos = end
                    counters[i] = done
                    _pace(start, done, throughput)
        stop = time.perf_counter()
        store.close()
        results.put((i, {"records": done, "bytes": nbytes, "start": start, "end": stop,
                         "lat": np.array(lat), "partitions": parts}))
    except BaseException as e:
        results.put((i, {"error": out.error_text(e)}))


def _pace(start: float, done: int, throughput: float | None) -> None:
    """Sleep until ``done`` records are due at ``throughput`` per second (no cap: None)."""
    if throughput is not None:
        wait = start + done / throughput - time.perf_counter()
        if wait > 0:
            time.sleep(wait)


# -- rendering and the handler -----------------------------------------------------------------
def render_perf(r: dict[str, Any]) -> list[str]:
    """A line saying what ran, then a row per process and the total."""
    what = "appends" if r["mode"] == "produce" else "reads"
    size = f"{r['record_size']}-byte values, " if r["record_size"] is not None else ""
    cap = f", capped at {r['throughput_cap']:,.0f} records/s each" if r["throughput_cap"] \
        else ""
    procs = f"{r['processes']} process{'es' if r['processes'] != 1 else ''}"
    head = (f"{r['mode']} {r['topic']}: {r['records']:,} records over {procs} ({size}{what} "
            f"of {r['batch_records']:,}{cap})")
    rows = [[str(x["process"]), x] for x in r["per_process"]] + [["total", r["total"]]]
    heads = ["PROCESS", "RECORDS", "SECONDS", "RECORDS/S", "MB/S", "AVG MS", "P50 MS",
             "P95 MS", "P99 MS", "P99.9 MS", "MAX MS"]
    cells = [[name, f"{x['records']:,}", f"{x['seconds']:.2f}", f"{x['records_per_s']:,.0f}",
              f"{x['mb_per_s']:,.1f}",
              *(f"{x['latency_ms'][k]:.2f}" for k in LATENCIES)]
             for name, x in rows]
    lines = [head, *out.table(heads, cells, right=[False] + [True] * (len(heads) - 1)),
             kafka_line(r)]
    took = r["total"]["seconds"]
    if took < SHORT_RUN_S:  # caches, start-up and one slow batch dominate such a run
        enough = _round_up(r["records"] * 10 / took)
        lines.append(f"note: the run took {took:.2f} s, too short to measure steadily: for "
                     f"about 10 s, give --records {enough}")
    if r["created_topic"]:
        lines.append(f"note: created topic {r['topic']}" +
                     (" and filled it first (not measured)" if r["mode"] == "consume" else ""))
    return lines


LATENCIES = ("avg", "p50", "p95", "p99", "p99.9", "max")
SHORT_RUN_S = 2.0  # a shorter run is noted as too short to measure


def _round_up(n: float) -> int:
    """``n`` rounded up to two significant digits."""
    step = 10 ** max(0, len(str(int(n))) - 2)
    return int(-(-n // step) * step)


def kafka_line(r: dict[str, Any]) -> str:
    """The total as ``kafka-producer-perf-test`` prints it (latency per append or read of
    ``--batch-records``, not per record; MB of 10^6 bytes)."""
    x, lat = r["total"], r["total"]["latency_ms"]
    verb = "sent" if r["mode"] == "produce" else "read"
    return (f"{x['records']} records {verb}, {x['records_per_s']:.1f} records/sec "
            f"({x['mb_per_s']:.2f} MB/sec), {lat['avg']:.2f} ms avg latency, "
            f"{lat['max']:.2f} ms max latency, {lat['p50']:.0f} ms 50th, {lat['p95']:.0f} ms "
            f"95th, {lat['p99']:.0f} ms 99th, {lat['p99.9']:.0f} ms 99.9th.")


def cmd_perf(args: argparse.Namespace) -> int:
    """Run ``pafka perf`` with a progress bar on a terminal, then print the figures."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    bars: dict[str, Any] = {}
    totals = {"filling": args.records, args.mode: args.records}

    def progress(phase: str, n: int) -> None:
        if phase not in bars:  # a bar per phase, on a terminal only
            bars[phase] = tqdm(total=totals[phase], unit=" records", unit_scale=True,
                               desc=phase, disable=None)
        bars[phase].update(n)

    try:
        with logging_redirect_tqdm():
            report = run_perf(args.root, args.mode, args.topic, args.records,
                              args.record_size, args.throughput, args.processes,
                              args.batch_records, progress, args.create)
    finally:
        for bar in bars.values():
            bar.close()
    out.emit(report, args.json, render_perf)
    return 0
