"""Arguments shared by ``pafka``'s subcommands: their types (a bad value is a usage error:
argparse names the flag and exits 2) and the positional ROOT and TOPIC, and ``--json``."""

from __future__ import annotations

import argparse
import datetime as dt
import math
from collections.abc import Callable

ROOT_HELP = "the store's root: a directory, or s3://bucket/prefix"


def whole(least: int, most: int | None = None) -> Callable[[str], int]:
    """The type of an integer argument from ``least`` to ``most`` (no bound when None)."""
    allowed = f"an integer >= {least:,}" if most is None else \
        f"an integer from {least:,} to {most:,}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}") from None
        if value < least or (most is not None and value > most):
            raise argparse.ArgumentTypeError(f"expected {allowed}, got {text!r}")
        return value
    parse.__name__ = "integer"  # argparse's "invalid integer value" when it fails
    return parse


def positive(what: str) -> Callable[[str], float]:
    """The type of a positive, finite number argument; ``what`` names it in errors."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"expected {what} > 0, got {text!r}")
        return value
    parse.__name__ = "number"
    return parse


seconds = positive("a number of seconds")


def offset_or_word(text: str) -> str | int:
    """earliest | latest | an offset (an integer of 0 or more)."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected earliest, latest or an offset (an integer "
                                         f">= 0), got {text!r}")
    return value


def epoch_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 time (UTC unless it names a zone)."""
    try:
        value = int(text)
    except ValueError:
        try:
            when = dt.datetime.fromisoformat(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected milliseconds since the epoch or an ISO 8601 time such as "
                f"2024-05-01T12:00:00Z, got {text!r}") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        value = int(when.timestamp() * 1000)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a time at or after 1970, got {text!r}")
    return value


def add_root(p: argparse.ArgumentParser) -> None:
    """The ROOT argument every store command takes."""
    p.add_argument("root", metavar="ROOT", help=ROOT_HELP)


def add_topic(p: argparse.ArgumentParser, help: str = "the topic's name") -> None:
    """The TOPIC argument."""
    p.add_argument("topic", metavar="TOPIC", help=help)


def add_json(p: argparse.ArgumentParser, what: str = "") -> None:
    """``--json``: the command's data as JSON instead of text."""
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of text" + (f" ({what})" if what else ""))
