"""Parsing single values of the ``pafka`` format's options: booleans, counts, sizes,
durations and offsets, with errors that spell the option as users write it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tier_store import InvalidArgument, parse_size

# The spelling users write (Spark hands options over lower-cased).
NAMES = {k.lower(): k for k in (
    "subscribePattern", "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "failOnDataLoss", "includeMetadata", "maxOffsetsPerTrigger",
    "maxRecordsPerTrigger", "maxBytesPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "consumerGroup", "verifyChecksums",
    "timestampColumn", "writerId", "checkpointLocation", "mergeSchema", "pushFilters")}

_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|sec|m|min|h|d|seconds?|minutes?|hours?|days?)?\s*$",
                          re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000, "m": 60_000,
            "min": 60_000, "minute": 60_000, "minutes": 60_000, "h": 3_600_000,
            "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000, "day": 86_400_000,
            "days": 86_400_000}
_PARTITION_RE = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() accepts '٣' too
MAX_BYTES_LIMIT = 2**63 - 1  # Spark's ReadMaxBytes is a long


def display(name: str) -> str:
    """How users spell an option that Spark hands over lower-cased."""
    return NAMES.get(name.lower(), name)


def bad_value(option: str, value: Any, allowed: str) -> InvalidArgument:
    """The error for a bad option value: the option as users spell it, and what is allowed."""
    return InvalidArgument(f"invalid value {value!r} for option {display(option)!r}: "
                           f"expected {allowed}")


def parse_bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    """Option ``name``: true or false (``default`` when not given)."""
    v = opts.get(name)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s not in ("true", "false"):
        raise bad_value(name, v, "true or false")
    return s == "true"


def positive_int(opts: Mapping[str, str], name: str) -> int | None:
    """Option ``name``: an integer above 0 (None when not given)."""
    v = opts.get(name)
    if v is None:
        return None
    try:
        n = int(str(v).strip())
    except ValueError:
        raise bad_value(name, v, "a positive integer") from None
    if n <= 0:
        raise bad_value(name, v, "a positive integer")
    return n


def non_empty(opts: Mapping[str, str], name: str, what: str) -> str | None:
    """Option ``name``, stripped: ``what``, not blank (None when not given)."""
    v = opts.get(name)
    if v is None:
        return None
    if not str(v).strip():
        raise bad_value(name, v, f"{what} (not empty)")
    return str(v).strip()


def byte_size(opts: Mapping[str, str], name: str) -> int | None:
    """A byte size of its own range (not log.segment.bytes', which is 16 KiB to 1 TiB)."""
    v = opts.get(name)
    if v is None:
        return None
    allowed = ("a size in bytes from 1 to 2^63-1, such as 4096, 512k, 64m or 2g (suffixes k, "
               "m, g, t: KiB, MiB, GiB, TiB)")
    try:
        n = parse_size(str(v))
    except ValueError:
        raise bad_value(name, v, allowed) from None
    if not 1 <= n <= MAX_BYTES_LIMIT:
        raise bad_value(name, v, allowed)
    return n


def duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    """Option ``name``: a duration such as 30s or 15m, in milliseconds."""
    v = opts.get(name)
    if v is None:
        return default
    m = _DURATION_RE.match(str(v))
    if not m:
        raise bad_value(name, v, "a duration such as 500ms, 30s, 15m or 1h")
    return int(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()]


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    """The options with lower-cased names, as Spark hands them over."""
    return {str(k).lower(): v for k, v in options.items()}


OffsetSpec = str | dict[str, dict[str, int]]


def parse_json(name: str, raw: str, expected: str) -> Any:
    """Parse JSON, rejecting a key given twice (json.loads would keep the last silently)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise InvalidArgument(f"option {display(name)!r} gives {k!r} twice: {raw}")
            out[k] = v
        return out
    try:
        return json.loads(raw, object_pairs_hook=pairs)
    except InvalidArgument:
        raise  # a key given twice: its own message
    except ValueError:
        raise bad_value(name, raw, expected) from None


def parse_offsets(opts: Mapping[str, str], name: str, ending: bool = False
                  ) -> OffsetSpec | None:
    """``earliest`` | ``latest`` | JSON ``{topic: {partition: offset}}`` with -2/-1.

    An ending offset cannot be ``earliest``/-2, as in Kafka's source: such a read would end
    before anything it could read."""
    v = opts.get(name)
    if v is None:
        return None
    s = str(v).strip()
    example = '{"clicks": {"0": 23, "1": -1}}' if ending else '{"clicks": {"0": 23, "1": -2}}'
    expected = f"latest, or JSON like {example}" if ending else \
        f"earliest, latest, group (with consumerGroup), or JSON like {example}"
    if s.lower() in ("latest", "earliest", "group"):
        if s.lower() == "earliest" and ending:
            raise bad_value(name, v, f"{expected} (a read cannot end at the earliest offsets)")
        if s.lower() == "group" and ending:
            raise bad_value(name, v, f"{expected} (a read cannot end at a consumer group's "
                                     "offsets)")
        return s.lower()
    parsed = parse_json(name, s, expected)
    if ending:
        return offset_json(name, v, parsed, -1, "offsets integers >= -1 (-1: latest; -2, "
                                                "earliest, cannot end a read)")
    return offset_json(name, v, parsed, -2, "offsets integers >= -2 (-2: earliest, -1: "
                                            "latest)")


def offset_json(name: str, raw: Any, parsed: Any, lowest: int, allowed: str
                ) -> dict[str, dict[str, int]]:
    """Parsed JSON ``{topic: {partition: value}}`` checked: partitions non-negative integers
    (each once), values integers of at least ``lowest``; partitions in ascending order."""
    shape = 'JSON like {"clicks": {"0": 23, "1": -2}}'
    if not isinstance(parsed, dict) or not parsed:
        raise bad_value(name, raw, shape)
    out: dict[str, dict[str, int]] = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict) or not parts:
            raise bad_value(name, raw, shape)
        clean: dict[int, int] = {}
        spelled: dict[int, str] = {}
        for p, off in parts.items():
            if not _PARTITION_RE.fullmatch(str(p)) or isinstance(off, bool) or \
                    not isinstance(off, int) or off < lowest:
                raise InvalidArgument(
                    f"invalid entry {p!r}: {off!r} for topic {topic!r} in option "
                    f"{display(name)!r}: partitions are non-negative integers and {allowed}")
            if int(p) in clean:
                raise InvalidArgument(f"option {display(name)!r} gives partition {int(p)} of topic "
                                      f"{topic!r} twice (as {spelled[int(p)]!r} and {p!r})")
            clean[int(p)] = off
            spelled[int(p)] = p
        out[topic] = {str(p): clean[p] for p in sorted(clean)}
    return out
