"""Run a benchmark against the library code of two commits, alternating rounds, and report
each figure beside its peer from the same round as a ratio.

    .venv/bin/python bench/paired.py --base REV [--rounds 4] store|spark [-- BENCH ARGS]

The benchmark script is this tree's (``bench/store_bench.py`` or ``bench/spark_bench.py``);
only the code it imports (``tier_store``, ``pafka_source``, ``migration``) differs: ``REV``,
checked out as a temporary git worktree, against this working tree. Rounds alternate which
side runs first. For every figure both sides report (seconds, or rates), the report gives
the median over rounds of each side and the median per-round ratio this tree / ``REV``.
Nothing tracked is written; ``--out FILE`` writes the Markdown table there.
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SCRIPTS = {"store": "store_bench.py", "spark": "spark_bench.py"}


def flatten(data: object, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of nested dicts and lists, by dotted path."""
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.update(flatten(v, f"{prefix}{i}."))
    elif isinstance(data, int | float) and not isinstance(data, bool):
        out[prefix[:-1]] = float(data)
    return out


def run_side(tree: str, script: str, args: list[str], tmp: str, tag: str) -> dict[str, float]:
    raw = os.path.join(tmp, f"{tag}.json")
    env = dict(os.environ, PAFKA_BENCH_CODE=tree, PAFKA_BENCH_JSON=raw)
    cmd = [sys.executable, os.path.join(HERE, script), *args, "--out", os.path.join(tmp, tag)]
    print(f"-- {tag}: {' '.join(cmd[1:])}", flush=True)
    r = subprocess.run(cmd, env=env, cwd=REPO)
    if r.returncode != 0 or not os.path.exists(raw):
        raise SystemExit(f"paired.py: FAILED: {tag} exited with {r.returncode} and no figures")
    with open(raw) as f:
        return flatten(json.load(f))


def table(base: str, results: list[tuple[dict[str, float], dict[str, float]]]) -> str:
    keys = sorted(set.intersection(*(set(a) & set(b) for a, b in results)))
    lines = [f"| figure | {base} (median) | this tree (median) | this tree / {base} "
             "(median of rounds) |", "|---|---|---|---|"]
    for k in keys:
        olds = [a[k] for a, _ in results]
        news = [b[k] for _, b in results]
        ratios = [n / o for o, n in zip(olds, news, strict=True) if o]
        ratio = f"{statistics.median(ratios):.3f}" if ratios else "—"
        lines.append(f"| {k} | {statistics.median(olds):.4g} | {statistics.median(news):.4g} "
                     f"| {ratio} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the commit whose library code is the peer")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds (default 4)")
    ap.add_argument("--out", help="write the Markdown table to this file as well")
    ap.add_argument("bench", choices=sorted(SCRIPTS), help="which benchmark")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    rev = subprocess.run(["git", "rev-parse", "--short", a.base], cwd=REPO, text=True,
                         capture_output=True)
    if rev.returncode != 0:
        ap.error(f"--base {a.base}: not a commit of {REPO}")
    base = rev.stdout.strip()
    tmp = tempfile.mkdtemp(prefix="pafka-paired-")
    tree = os.path.join(tmp, "base")
    subprocess.run(["git", "worktree", "add", "--detach", tree, base], cwd=REPO, check=True,
                   capture_output=True)
    try:
        results = []
        for i in range(a.rounds):
            sides = [("base", tree), ("new", REPO)]
            if i % 2:
                sides.reverse()
            got = {tag: run_side(path, SCRIPTS[a.bench], args, tmp, f"{tag}-{i}")
                   for tag, path in sides}
            results.append((got["base"], got["new"]))
        report = (f"{a.bench} benchmark, {a.rounds} alternating rounds, args "
                  f"`{' '.join(args) or '(defaults)'}`: library code of {base} against this "
                  f"tree.\n\n" + table(base, results))
        print(report)
        if a.out:
            with open(a.out, "w") as f:
                f.write(report + "\n")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=REPO,
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
