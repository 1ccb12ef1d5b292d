"""What the benchmark scripts share: where their report and figures go, and argument checks.

By default a benchmark prints its report (the Markdown of its RESULTS.md section) to stdout
and writes a figure only to ``--out DIR`` if given, or else to a fresh temporary directory:
no tracked file is rewritten. ``--write-results`` rewrites the script's section of
``bench/RESULTS.md`` and its figures under ``bench/``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS.md")

# bench/paired.py runs a benchmark against the library code of another tree: that tree comes
# first on this process's path and on its children's (Spark's Python workers).
CODE = os.environ.get("PAFKA_BENCH_CODE")
if CODE:
    sys.path.insert(0, CODE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (CODE, os.environ.get("PYTHONPATH")) if p)


def dump_raw(data: dict) -> None:
    """Write the run's raw figures as JSON to ``$PAFKA_BENCH_JSON`` if set (read by
    bench/paired.py); nothing otherwise."""
    path = os.environ.get("PAFKA_BENCH_JSON")
    if path:
        import json
        with open(path, "w") as f:
            json.dump(data, f, default=float)


class BenchError(SystemExit):
    """A run that cannot give a meaningful figure: exits with status 1 and the message."""

    def __init__(self, message: str):
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "benchmark"
        super().__init__(f"{script}: FAILED: {message}")


def fail(message: str) -> BenchError:
    """``raise fail("...")``: stop the benchmark with a non-zero status and the message."""
    return BenchError(message)


# -- argument types: argparse names the flag in front of each message -------------------------
def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range: allowed {_span(lo, hi)}")
        return v
    parse.__name__ = "integer"
    return parse


def float_range(lo: float | None = None, hi: float | None = None,
                lo_open: bool = False) -> Callable[[str], float]:
    """A finite float in [lo, hi] (or (lo, hi] with ``lo_open``)."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) \
            or (hi is not None and v > hi)
        if bad:
            raise argparse.ArgumentTypeError(
                f"{text} is out of range: allowed {_span(lo, hi, lo_open)}")
        return v
    parse.__name__ = "number"
    return parse


def _span(lo, hi, lo_open: bool = False) -> str:
    lo, hi = (f"{x:g}" if isinstance(x, float) else x for x in (lo, hi))
    if lo is not None and hi is not None:
        return f"{lo} {'<' if lo_open else '≤'} value ≤ {hi}"
    if lo is not None:
        return f"{'>' if lo_open else '≥'} {lo}"
    return f"≤ {hi}"


def out_dir(text: str) -> str:
    path = os.path.abspath(text)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory (--out takes "
                                         "a directory; the report goes to DIR/RESULTS.md)")
    if os.path.realpath(path) == os.path.realpath(HERE):
        raise argparse.ArgumentTypeError(f"{text!r} is bench/ itself, whose RESULTS.md and "
                                         "figures are tracked: use --write-results for them")
    return path


def add_output_args(ap: argparse.ArgumentParser, figures: tuple[str, ...] = ()) -> None:
    what = "its section of bench/RESULTS.md" + "".join(f" and bench/{f}" for f in figures)
    ap.add_argument("--write-results", action="store_true",
                    help=f"rewrite {what} (tracked files); without it the report is only "
                         "printed")
    ap.add_argument("--out", metavar="DIR", type=out_dir, default=None,
                    help="also write the report to DIR/RESULTS.md (this script's section)"
                         + (" and the figures to DIR" if figures else "")
                         + "; DIR is created" + ("; without --out and --write-results the "
                                                 "figures go to a fresh temporary directory"
                                                 if figures else ""))


class Output:
    """Where one run's report and figures go (see the module's docstring)."""

    def __init__(self, args: argparse.Namespace):
        self.write_results = bool(getattr(args, "write_results", False))
        self.out = getattr(args, "out", None)
        self._tmp: str | None = None

    def figure_dirs(self) -> list[str]:
        dirs = []
        if self.write_results:
            dirs.append(HERE)
        if self.out:
            os.makedirs(self.out, exist_ok=True)
            dirs.append(self.out)
        if not dirs:
            if self._tmp is None:
                self._tmp = tempfile.mkdtemp(prefix="pafka-bench-")
            dirs.append(self._tmp)
        return dirs

    def figure(self, name: str, draw: Callable[[str], None]) -> list[str]:
        """Draw the figure ``name`` once with ``draw(path)``; copy it to each destination."""
        dirs = self.figure_dirs()
        first = os.path.join(dirs[0], name)
        draw(first)
        paths = [first]
        for d in dirs[1:]:
            shutil.copyfile(first, os.path.join(d, name))
            paths.append(os.path.join(d, name))
        for p in paths:
            print(f"figure: {p}", flush=True)
        return paths

    def report(self, section: str, body: str) -> None:
        """Print the report; write it where asked."""
        print(body, flush=True)
        if self.write_results:
            update_section(RESULTS, section, body)
        if self.out:
            os.makedirs(self.out, exist_ok=True)
            update_section(os.path.join(self.out, "RESULTS.md"), section, body)
        if not (self.write_results or self.out):
            print("(report printed only; --write-results rewrites bench/RESULTS.md)",
                  flush=True)


def update_section(path: str, name: str, body: str) -> None:
    """Replace (or append) the section between ``name``'s markers in the file at ``path``,
    re-reading the file first and replacing it atomically (other scripts own other
    sections)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = "# Benchmark results\n\nEach section is written by the script it names.\n"
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    block = f"{start}\n{body}\n{end}"
    if start in text and end in text and text.index(start) < text.index(end):
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    print(f"wrote {path}", flush=True)


def positive(value: float, what: str) -> float:
    """``value`` if it is a finite number above 0; otherwise stop the run naming ``what``."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise fail(f"{what} is {value!r}: a degenerate measurement (expected a positive "
                   "time or rate)")
    return value


def ratio(num: float, den: float, what: str) -> float:
    """``num / den`` of two measured times or rates, both checked with :func:`positive`."""
    return positive(num, f"{what} (numerator)") / positive(den, f"{what} (denominator)")
