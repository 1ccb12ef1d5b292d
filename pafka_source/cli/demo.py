"""``pafka demo``: runs the end-to-end demo of :mod:`pafka_source.demo` and prints its story
and summary (or its facts as JSON)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import output as out


def demo_ok(s: dict[str, Any]) -> bool:
    """Whether the demo's facts hold: every click announced written and counted, no lag,
    the freshness order."""
    return s["counted"] == s["written"] == s["announced"] > 0 and s["lag"] == 0 and \
        not s["order_violations"]


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run
    s = run(seconds=args.seconds, rows_per_second=args.rate,
            say=None if args.json else (lambda line: out.echo(line, flush=True)))
    if args.json:
        out.echo(json.dumps(s, indent=1, default=str))
    else:
        out.echo_lines(out.render_demo(s))
    return 0 if demo_ok(s) else 1
