"""Options of the ``pafka`` format, parsed and validated once on the driver.

Spark hands options over lower-cased; every key is checked here so that a mistake fails at
``load()``/``start()`` with the option, the value and what is allowed. Store configuration
keys (``log.segment.bytes``, ``storage.tiers.first.paths``, ...) are accepted as options too and
take precedence over a ``pafka.config`` properties file, which takes precedence over the
store's saved configuration.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tier_store import ConfigError, PafkaError
from tier_store.config import KEYS, key_for, load_config

SOURCE_OPTIONS = {
    "path": "store root directory (or load(root))",
    "topic": "one topic to read",
    "subscribe": "comma-separated topics to read",
    "subscribepattern": "regular expression of topics to read",
    "startingoffsets": "earliest | latest | JSON {topic: {partition: offset}} (-2 earliest, -1 "
                       "latest)",
    "endingoffsets": "latest | JSON (batch reads only)",
    "startingtimestamp": "milliseconds since the epoch: start at the first record committed "
                         "then or later",
    "startingoffsetsbytimestamp": "JSON {topic: {partition: timestamp ms}}",
    "failondataloss": "true | false",
    "includemetadata": "true | false: add _topic, _partition, _offset, _timestamp",
    "maxoffsetspertrigger": "positive integer: records per micro-batch at most",
    "maxrecordspertrigger": "alias of maxOffsetsPerTrigger",
    "maxbytespertrigger": "positive size: bytes per micro-batch at most (approximate)",
    "minoffsetspertrigger": "positive integer: wait for this many records ...",
    "maxtriggerdelay": "... but no longer than this (e.g. 15m, 30s, 500ms)",
    "minpartitions": "positive integer: at least this many Spark partitions per batch",
    "maxrecordsperpartition": "positive integer: at most this many records per Spark partition",
    "consumergroup": "name under which the query's committed offsets are recorded",
    "verifychecksums": "true | false: verify every chunk's checksum while reading",
    "pafka.config": "path of a .properties file with store configuration",
}
SINK_OPTIONS = {
    "path": "store root directory (or save(root)/start(root))",
    "topic": "the topic to write",
    "key": "column whose stable hash routes rows to partitions",
    "partitions": "partition count of a topic created by this write",
    "compression": "none | lz4 | zstd",
    "timestampcolumn": "event-time column whose min/max the log keeps per chunk",
    "writerid": "id that makes replays of a batch idempotent (default: the query id)",
    "checkpointlocation": "Spark's checkpoint location",
    "pafka.config": "path of a .properties file with store configuration",
}

# The spelling users write (Spark hands options over lower-cased).
NAMES = {k.lower(): k for k in (
    "subscribePattern", "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "failOnDataLoss", "includeMetadata", "maxOffsetsPerTrigger",
    "maxRecordsPerTrigger", "maxBytesPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition", "consumerGroup", "verifyChecksums",
    "timestampColumn", "writerId", "checkpointLocation")}

_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|sec|m|min|h|d|seconds?|minutes?|hours?|days?)?\s*$",
                          re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000, "m": 60_000,
            "min": 60_000, "minute": 60_000, "minutes": 60_000, "h": 3_600_000,
            "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000, "day": 86_400_000,
            "days": 86_400_000}


def _bad(option: str, value: Any, allowed: str) -> PafkaError:
    return PafkaError(f"invalid value {value!r} for option {option!r}: expected {allowed}")


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    v = opts.get(name)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s not in ("true", "false"):
        raise _bad(name, v, "true or false")
    return s == "true"


def _positive(opts: Mapping[str, str], name: str) -> int | None:
    v = opts.get(name)
    if v is None:
        return None
    try:
        n = int(str(v).strip())
    except ValueError:
        raise _bad(name, v, "a positive integer") from None
    if n <= 0:
        raise _bad(name, v, "a positive integer")
    return n


def _duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    v = opts.get(name)
    if v is None:
        return default
    m = _DURATION_RE.match(str(v))
    if not m:
        raise _bad(name, v, "a duration such as 500ms, 30s, 15m or 1h")
    return int(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()]


def _check_known(opts: Mapping[str, str], known: Mapping[str, str], what: str) -> None:
    for name in opts:
        if name in known or name in KEYS or name.startswith("storage.tiers."):
            continue
        candidates = list(known) + list(KEYS)
        close = difflib.get_close_matches(name, candidates, n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise PafkaError(f"unknown {what} option {name!r}{hint} Known options: "
                         f"{', '.join(sorted(known))}, and the store keys of "
                         "conf/pafka.properties")


def markdown_tables() -> str:
    """The README's tables of source and sink options."""
    out = []
    for title, table in (("Source", SOURCE_OPTIONS), ("Sink", SINK_OPTIONS)):
        out += [f"| {title} option | meaning |", "|---|---|"]
        out += [f"| `{NAMES.get(k, k)}` | {v.replace('|', chr(92) + '|')} |"
                for k, v in table.items()]
        out.append("")
    return "\n".join(out).rstrip()


def check_option_names(options: Mapping[str, str]) -> None:
    """Reject a name that is neither a source nor a sink option nor a store key."""
    _check_known({str(k).lower(): v for k, v in options.items()},
                 {**SOURCE_OPTIONS, **SINK_OPTIONS}, "pafka")


def store_config(opts: Mapping[str, str]) -> dict[str, Any]:
    """Store configuration from options: the properties file, overridden by option keys."""
    conf: dict[str, Any] = {}
    if opts.get("pafka.config"):
        conf.update(load_config(opts["pafka.config"]))
    for name, value in opts.items():
        if name in KEYS or name.startswith("storage.tiers."):
            key = key_for(name)
            conf[key.name] = key.parse(value)
    return conf


def _root(opts: Mapping[str, str]) -> str:
    root = opts.get("path")
    if not root:
        raise PafkaError("no store root: pass it to load(root)/save(root)/start(root) or set "
                         "the 'path' option")
    return root


OffsetSpec = str | dict[str, dict[str, int]]


def parse_offsets(opts: Mapping[str, str], name: str, allow_earliest: bool = True
                  ) -> OffsetSpec | None:
    """``earliest`` | ``latest`` | JSON ``{topic: {partition: offset}}`` with -2/-1."""
    v = opts.get(name)
    if v is None:
        return None
    s = str(v).strip()
    if s.lower() in ("latest", "earliest"):
        if s.lower() == "earliest" and not allow_earliest:
            raise _bad(name, v, "latest or a JSON object of offsets")
        return s.lower()
    try:
        parsed = json.loads(s)
    except ValueError:
        raise _bad(name, v, 'earliest, latest, or JSON like {"clicks": {"0": 23, "1": -2}}'
                   ) from None
    return _offset_json(name, v, parsed, lowest=-2)


def _offset_json(name: str, raw: Any, parsed: Any, lowest: int) -> dict[str, dict[str, int]]:
    shape = 'JSON like {"clicks": {"0": 23, "1": -2}}'
    if not isinstance(parsed, dict) or not parsed:
        raise _bad(name, raw, shape)
    out: dict[str, dict[str, int]] = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict):
            raise _bad(name, raw, shape)
        clean: dict[int, int] = {}
        for p, off in parts.items():
            if not str(p).isdigit() or isinstance(off, bool) or not isinstance(off, int) or \
                    off < lowest:
                raise PafkaError(
                    f"invalid entry {p!r}: {off!r} for topic {topic!r} in option {name!r}: "
                    f"partitions are non-negative integers and offsets integers >= {lowest}")
            clean[int(p)] = off
        out[topic] = {str(p): clean[p] for p in sorted(clean)}
    return out


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of a ``pafka`` read."""

    root: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: OffsetSpec | None = None
    ending: OffsetSpec | None = None
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[str, dict[str, int]] | None = None
    fail_on_data_loss: bool = True
    include_metadata: bool = False
    max_records: int | None = None
    max_bytes: int | None = None
    min_records: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int = 1_000_000
    consumer_group: str | None = None
    verify: bool = False
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        _check_known(opts, SOURCE_OPTIONS, "source")
        chosen = [k for k in ("topic", "subscribe", "subscribepattern") if opts.get(k)]
        if len(chosen) != 1:
            raise PafkaError("set exactly one of the options 'topic', 'subscribe' and "
                             f"'subscribePattern' (got {chosen or 'none'})")
        topics: tuple[str, ...] = ()
        pattern = None
        if "topic" in chosen:
            topics = (opts["topic"].strip(),)
        elif "subscribe" in chosen:
            topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
            if not topics:
                raise _bad("subscribe", opts["subscribe"], "a comma-separated list of topics")
        else:
            pattern = opts["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as e:
                raise _bad("subscribePattern", pattern, f"a regular expression ({e})") from None
        max_records = _positive(opts, "maxoffsetspertrigger")
        alias = _positive(opts, "maxrecordspertrigger")
        if max_records is not None and alias is not None and max_records != alias:
            raise PafkaError("maxOffsetsPerTrigger and its alias maxRecordsPerTrigger disagree: "
                             "set one")
        max_bytes = None
        if opts.get("maxbytespertrigger") is not None:
            try:
                max_bytes = key_for("log.segment.bytes").parse(opts["maxbytespertrigger"])
            except ConfigError:
                raise _bad("maxBytesPerTrigger", opts["maxbytespertrigger"],
                           "a positive size such as 64m") from None
            if max_bytes <= 0:
                raise _bad("maxBytesPerTrigger", opts["maxbytespertrigger"], "a positive size")
        starting_ts = None
        if opts.get("startingtimestamp") is not None:
            try:
                starting_ts = int(str(opts["startingtimestamp"]).strip())
            except ValueError:
                raise _bad("startingTimestamp", opts["startingtimestamp"],
                           "milliseconds since the epoch") from None
        by_ts = None
        if opts.get("startingoffsetsbytimestamp") is not None:
            raw = opts["startingoffsetsbytimestamp"]
            try:
                by_ts = _offset_json("startingOffsetsByTimestamp", raw, json.loads(raw), 0)
            except ValueError:
                raise _bad("startingOffsetsByTimestamp", raw,
                           'JSON like {"clicks": {"0": 1700000000000}}') from None
        given = [k for k in ("startingoffsets", "startingtimestamp",
                             "startingoffsetsbytimestamp") if opts.get(k) is not None]
        if len(given) > 1:
            raise PafkaError(f"set at most one of {', '.join(given)}")
        return cls(
            root=_root(opts), topics=topics, pattern=pattern,
            starting=parse_offsets(opts, "startingoffsets"),
            ending=parse_offsets(opts, "endingoffsets", allow_earliest=False),
            starting_timestamp=starting_ts, starting_by_timestamp=by_ts,
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            include_metadata=_bool(opts, "includemetadata", False),
            max_records=max_records if max_records is not None else alias,
            max_bytes=max_bytes,
            min_records=_positive(opts, "minoffsetspertrigger"),
            max_trigger_delay_ms=_duration_ms(opts, "maxtriggerdelay", 15 * 60_000),
            min_partitions=_positive(opts, "minpartitions"),
            max_records_per_partition=_positive(opts, "maxrecordsperpartition") or 1_000_000,
            consumer_group=opts.get("consumergroup") or None,
            verify=_bool(opts, "verifychecksums", False),
            config=store_config(opts),
        )


@dataclass(frozen=True)
class SinkOptions:
    """The parsed options of a ``pafka`` write."""

    root: str
    topic: str
    key: str | None = None
    partitions: int | None = None
    compression: str | None = None
    timestamp_column: str | None = None
    writer_id: str | None = None
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = {str(k).lower(): v for k, v in options.items()}
        _check_known(opts, SINK_OPTIONS, "sink")
        if not opts.get("topic"):
            raise PafkaError("the 'topic' option is required to write: "
                             ".option('topic', 'clicks')")
        compression = opts.get("compression")
        config = store_config(opts)
        if compression is not None:
            config["compression.type"] = key_for("compression.type").parse(compression)
        return cls(
            root=_root(opts), topic=opts["topic"].strip(), key=opts.get("key") or None,
            partitions=_positive(opts, "partitions"), compression=compression,
            timestamp_column=opts.get("timestampcolumn") or None,
            writer_id=opts.get("writerid") or None, config=config,
        )
