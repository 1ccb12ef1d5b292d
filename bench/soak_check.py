"""The final check, the figures, the plots and the report of ``bench/soak.py`` (see its
docstring for what the check requires)."""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pyarrow as pa
from soak_roles import TOPIC, payload

MB = 1_000_000


def rows_read(work: str) -> int:
    """Rows the reader's micro-batches read so far (its progress file)."""
    try:
        with open(os.path.join(work, "reader-progress.jsonl")) as f:
            return sum(json.loads(line)["rows"] for line in f if line.endswith("\n"))
    except FileNotFoundError:
        return 0


def _log_files(d: str) -> dict[int, str]:
    return {int(os.path.basename(p)): p for p in glob.glob(os.path.join(d, "[0-9]*"))
            if os.path.basename(p).isdigit()}


def writer_batches(work: str) -> list[dict]:
    """Per batch of the writer's Spark checkpoint: its ids ``[start, end)``, the time its
    offsets were written (before any of its rows were), and whether Spark committed it."""
    ckpt = os.path.join(work, "writer-ckpt")
    offsets, commits = _log_files(os.path.join(ckpt, "offsets")), \
        _log_files(os.path.join(ckpt, "commits"))
    out, start = [], 0
    for b in sorted(offsets):
        with open(offsets[b]) as f:
            lines = [line for line in f.read().splitlines() if line.startswith("{")]
        end = int(json.loads(lines[-1])["offset"])
        out.append({"batch": b, "start": start, "end": end, "planned": os.stat(offsets[b]).st_mtime,
                    "committed": b in commits})
        start = end
    return out


def store_rows(root: str) -> tuple[dict[str, np.ndarray], int, list[str]]:
    """Every row the topic holds (id, partition, offset), the wrong payloads among them, and
    the problems ``Store.check`` finds (checksums verified)."""
    from tier_store import Store
    ids, parts, offs, wrong = [], [], [], 0
    with Store.open(root) as store:
        t = store.topic(TOPIC)
        problems = [p for r in store.check([TOPIC]) for p in r.problems]
        first, last = t.earliest_offsets(), t.latest_offsets()
        for p in range(t.partitions):
            n = 0
            for b in t.read(p, first[p], last[p]):
                i = b.column("id").to_numpy()
                wrong += sum(x != payload(int(k)) for k, x in zip(
                    i.tolist(), b.column("payload").to_pylist(), strict=True))
                ids.append(i)
                parts.append(np.full(len(i), p))
                offs.append(np.arange(first[p] + n, first[p] + n + len(i)))
                n += len(i)
            if n != last[p] - first[p]:
                problems.append(f"partition {p}: read {n} rows of offsets [{first[p]}, "
                                f"{last[p]})")
    return {"id": _cat(ids), "partition": _cat(parts), "offset": _cat(offs)}, wrong, problems


def _cat(xs: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(xs) if xs else np.zeros(0, np.int64)


def reader_rows(work: str) -> dict[str, np.ndarray]:
    with pa.memory_map(os.path.join(work, "read.arrow")) as f:
        t = pa.ipc.open_file(f).read_all()
    return {"id": t["id"].to_numpy(), "partition": t["_partition"].to_numpy(),
            "offset": t["_offset"].to_numpy(), "ok": t["ok"].to_numpy(zero_copy_only=False)}


def _dups(ids: np.ndarray) -> int:
    return int(len(ids) - len(np.unique(ids)))


def check(root: str, work: str, t_end: float, retention_s: float) -> dict:
    """The final check's figures (see ``bench/soak.py``)."""
    batches = writer_batches(work)
    planned_end = max((b["end"] for b in batches), default=0)
    horizon = t_end - retention_s
    must = [np.arange(b["start"], b["end"]) for b in batches
            if b["committed"] and b["planned"] > horizon]
    committed = [np.arange(b["start"], b["end"]) for b in batches if b["committed"]]
    must_ids = np.concatenate(must) if must else np.zeros(0, np.int64)
    w_ids = np.concatenate(committed) if committed else np.zeros(0, np.int64)
    s, s_wrong, store_problems = store_rows(root)
    r = reader_rows(work)
    # Where both have a (partition, offset), the ids must agree.
    s_key = s["partition"].astype(np.int64) << 40 | s["offset"]
    r_key = r["partition"].astype(np.int64) << 40 | r["offset"]
    _, si, ri = np.intersect1d(s_key, r_key, assume_unique=False, return_indices=True)
    # The reader must have read what the store still holds and what retention could not
    # have deleted; the rest of what it lacks, retention deleted before it came.
    should_read = np.union1d(must_ids, s["id"])
    unread = np.setdiff1d(w_ids, r["id"])
    return {
        "batches_planned": len(batches), "batches_committed": len(committed),
        "ids_planned": planned_end, "ids_committed": int(len(w_ids)),
        "ids_within_horizon": int(len(must_ids)), "t_end": t_end, "retention_s": retention_s,
        "store": {"rows": int(len(s["id"])), "duplicated": _dups(s["id"]),
                  "wrong": int(s_wrong + np.count_nonzero((s["id"] < 0) |
                                                          (s["id"] >= planned_end))),
                  "lost": int(len(np.setdiff1d(must_ids, s["id"]))),
                  "problems": store_problems},
        "reader": {"rows": int(len(r["id"])), "duplicated": _dups(r["id"]),
                   "wrong": int(np.count_nonzero(~r["ok"].astype(bool))
                                + np.count_nonzero((r["id"] < 0) | (r["id"] >= planned_end))
                                + np.count_nonzero(s["id"][si] != r["id"][ri])),
                   "lost": int(len(np.setdiff1d(should_read, r["id"]))),
                   "deleted_before_read": int(len(np.setdiff1d(unread, should_read)))},
    }


MOVE = re.compile(r"^moved \S+ \((\d+) segments?, .*\) tier ([\d/]+) -> (\d+) in ")


def migrator_moves(work: str) -> dict[str, int]:
    """Moves, segments moved down and up, segments merged away and failed runs, from the
    lines ``pafka migrate --follow`` prints."""
    out = {"moves": 0, "segments_down": 0, "segments_up": 0, "merged_segments": 0,
           "failed_runs": 0}
    with open(os.path.join(work, "migrator.log")) as f:
        for line in f:
            m = MOVE.match(line)
            if m:
                n, down = int(m[1]), int(m[3]) > min(int(x) for x in m[2].split("/"))
                out["moves"] += 1
                out["segments_down" if down else "segments_up"] += n
                out["merged_segments"] += n - 1
            elif "migration run failed" in line:
                out["failed_runs"] += 1
    return out


def summary(samples: list[dict], kills: list[float], crashes: list[str], root: str,
            stopping: float, work: str) -> dict:
    """Throughput, the migration's work and the processes' growth over the run (up to
    ``stopping``, when the writer was asked to stop)."""
    from tier_store import Store
    with Store.open(root) as store:
        totals = store.migration_totals()
    running = [s for s in samples if s["t"] < stopping]
    rates = [s["write_rate"] for s in running if "write_rate" in s]
    reads = [s["read_rate"] for s in running if "read_rate" in s]
    # Growth of the processes alive all along, from a fifth into the run to its end (the
    # writer restarts: its peak instead).
    steady = [s for s in running if "reader" in s["procs"]]
    growth = {}
    if steady:
        a, b = steady[len(steady) // 5], steady[-1]
        for role in ("reader", "migrator"):
            if role in a["procs"] and role in b["procs"]:
                growth[role] = {k: [a["procs"][role][k], b["procs"][role][k]]
                                for k in a["procs"][role]}
                growth[role]["t"] = [a["t"], b["t"]]
    peak = [s["procs"]["writer"] for s in running if "writer" in s["procs"]]
    if peak:
        growth["writer_peak"] = {k: max(p[k] for p in peak) for k in peak[0]}
    return {"seconds": stopping, "kills": kills, "crashes": crashes,
            "write_rate_mean": float(np.mean(rates)) if rates else 0.0,
            "read_rate_mean": float(np.mean(reads)) if reads else 0.0,
            "migration": {**migrator_moves(work),
                          "segments_deleted": totals.get("segments_deleted", 0),
                          "bytes_down": totals.get("bytes_down", 0),
                          "runs": totals.get("runs", 0)},
            "tier_peak": {str(t["tier"]): max(x["tiers"][i]["used"] for x in samples)
                          for i, t in enumerate(samples[-1]["tiers"])} if samples else {},
            "growth": growth}


def problems(f: dict) -> list[str]:
    out = []
    for side in ("store", "reader"):
        out += [f"{side}: {f[side][k]} {k} rows" for k in ("wrong", "duplicated", "lost")
                if f[side][k]]
    out += [f"store check: {p}" for p in f["store"]["problems"]]
    out += [f"crash: {c}" for c in f["crashes"]]
    if not f["ids_within_horizon"]:
        out.append("no committed batch within the retention horizon: nothing to check")
    return out


def passed(f: dict) -> bool:
    return not problems(f)


def plot(samples: list[dict], kills: list[float], stopping: float, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = [s["t"] / 60 for s in samples]
    fig, ax = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    ax[0].plot(t, [s.get("write_rate", np.nan) for s in samples], label="committed (store)")
    ax[0].plot(t, [s.get("read_rate", np.nan) for s in samples], label="read (reader)")
    ax[0].set_ylabel("rows/s")
    for i, tier in enumerate(samples[-1]["tiers"] if samples else []):
        n = tier["tier"]
        ax[1].plot(t, [s["tiers"][i]["used"] / MB for s in samples], label=f"tier {n} committed")
        ax[1].plot(t, [s["tiers"][i]["disk"] / MB for s in samples], "--",
                   label=f"tier {n} on disk")
    ax[1].set_ylabel("MB")
    roles = sorted({r for s in samples for r in s.get("procs", {})})
    for k, (what, scale, unit) in enumerate((("fds", 1, "open fds"), ("rss", MB, "RSS (MB)"))):
        for role in roles:
            for part in ("py", "jvm"):
                ys = [s["procs"][role][f"{part}_{what}"] / scale if role in s["procs"] else
                      np.nan for s in samples]
                if np.nanmax(ys, initial=0) > 0:
                    ax[2 + k].plot(t, ys, label=f"{role} {part}")
        ax[2 + k].set_ylabel(unit)
    for a in ax:
        for x in kills:
            a.axvline(x / 60, color="red", alpha=0.25, lw=0.8)
        a.axvline(stopping / 60, color="black", ls=":", lw=0.8)
        a.legend(fontsize=7, loc="upper left")
        a.grid(alpha=0.3)
    ax[0].set_title("Soak: writer SIGKILLed at the red lines; stop and drain after the "
                    "dotted one")
    ax[-1].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(f: dict) -> str:
    a = f["args"]
    m = f["migration"]
    cmd = f".venv/bin/python bench/soak.py --minutes {a['minutes']:g}"
    lines = [
        "## Soak (`bench/soak.py`): streaming through Spark with kills, migration, merging "
        "and retention", "",
        f"Command: `flock /tmp/h/spark.lock {cmd} --report`. A Spark `local[2]` streaming "
        f"writer (`rate-micro-batch`, {a['rows_per_batch']:,} rows per 1-s trigger) into a "
        "pafka topic of 4 partitions, SIGKILLed (its whole process tree) every "
        f"{a['kill_every']:.0f} s on average and restarted on its checkpoint; a Spark "
        "streaming reader (`failOnDataLoss=false`) into Parquet; `pafka migrate --follow`. "
        f"Tier 1: {a['tier1_type']} of {a['tier1']:g} MiB on /dev/shm, tier 2: HDD on disk; "
        f"`log.segment.bytes` {a['segment']} KiB, `log.segment.ms` {a['segment_s']:g} s, "
        f"`log.retention.ms` {a['retention']:.0f} s, `log.cleanup.grace.ms` 30 s.", "",
        "| figure | value |", "|---|---|",
        f"| duration (writer started → asked to stop) | {f['seconds'] / 60:.1f} min |",
        f"| writer SIGKILLs / restarts | {len(f['kills'])} |",
        f"| rows committed / s (mean of samples) | {f['write_rate_mean']:,.0f} |",
        f"| rows read / s (mean of samples) | {f['read_rate_mean']:,.0f} |",
        f"| batches planned / committed by Spark | {f['batches_planned']} / "
        f"{f['batches_committed']} |",
        f"| ids committed / within the retention horizon | {f['ids_committed']:,} / "
        f"{f['ids_within_horizon']:,} |",
        f"| segments moved down (merged away) / up | {m['segments_down']} "
        f"({m['merged_segments']}) / {m['segments_up']} |",
        f"| segments deleted by retention | {m['segments_deleted']} |",
        f"| migration runs / failed runs | {m['runs']} / {m['failed_runs']} |",
        "", "| output | rows checked | wrong | duplicated | lost | deleted before read |",
        "|---|---|---|---|---|---|",
    ]
    for side in ("store", "reader"):
        s = f[side]
        lines.append(f"| {side} | {s['rows']:,} | {s['wrong']} | {s['duplicated']} | "
                     f"{s['lost']} | {s.get('deleted_before_read', '—')} |")
    lines += ["", f"Process crashes: {len(f['crashes'])}. `Store.check` (checksums): "
              f"{len(f['store']['problems'])} problems. Result: "
              f"**{'PASS' if passed(f) else 'FAIL: ' + '; '.join(problems(f))}**.", ""]
    g = f["growth"]
    for role in ("reader", "migrator"):
        if role in g:
            x = g[role]
            lines.append(f"- {role}, {x['t'][0] / 60:.1f} → {x['t'][1] / 60:.1f} min: RSS Python "
                         f"{x['py_rss'][0] / MB:.0f} → {x['py_rss'][1] / MB:.0f} MB, JVM "
                         f"{x['jvm_rss'][0] / MB:.0f} → {x['jvm_rss'][1] / MB:.0f} MB; fds "
                         f"{x['py_fds'][0] + x['jvm_fds'][0]:.0f} → "
                         f"{x['py_fds'][1] + x['jvm_fds'][1]:.0f}; store maps "
                         f"{x['py_maps'][0] + x['jvm_maps'][0]:.0f} → "
                         f"{x['py_maps'][1] + x['jvm_maps'][1]:.0f}")
    if "writer_peak" in g:
        w = g["writer_peak"]
        lines.append(f"- writer (restarted), peak: RSS Python {w['py_rss'] / MB:.0f} MB, JVM "
                     f"{w['jvm_rss'] / MB:.0f} MB; fds {w['py_fds'] + w['jvm_fds']:.0f}")
    lines += ["", "![soak: throughput, tiers, fds, RSS](soak/soak.png)"]
    return "\n".join(lines)
