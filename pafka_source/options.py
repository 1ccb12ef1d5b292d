"""Options of the ``pafka`` format, parsed and validated once on the driver.

Spark hands options over lower-cased; every key is checked here so that a mistake fails at
``load()``/``save()`` (a stream: when the query starts) with the option, spelled as users
write it, the value and what is allowed. Store configuration keys (``log.segment.bytes``,
``storage.tiers.first.paths``, ...) are accepted as options too and take precedence over a
``pafka.config`` properties file, which takes precedence over the store's saved configuration.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tier_store import CONFIG_KEYS, InvalidArgument, key_for, load_config

from .option_values import (
    NAMES,
    OffsetSpec,
    bad_value,
    byte_size,
    display,
    duration_ms,
    lower_keys,
    non_empty,
    offset_json,
    parse_bool,
    parse_json,
    parse_offsets,
    positive_int,
)

SOURCE_OPTIONS = {
    "path": "store root directory (or load(root))",
    "topic": "one topic to read",
    "subscribe": "comma-separated topics to read",
    "subscribepattern": "regular expression of topics to read",
    "startingoffsets": "earliest | latest | group | JSON {topic: {partition: offset}} (-2 "
                       "earliest, -1 latest). group: the committed offsets of consumerGroup "
                       "(a partition it has none for starts at earliest; a group the topics do "
                       "not have is an error); a batch read then reads from them to the end, "
                       "recording nothing",
    "endingoffsets": "latest | JSON {topic: {partition: offset}} (-1 latest; batch reads only)",
    "startingtimestamp": "milliseconds since the epoch: start at the first record committed "
                         "then or later",
    "startingoffsetsbytimestamp": "JSON {topic: {partition: timestamp ms}}",
    "failondataloss": "true | false: false skips ranges lost to retention and chunks that fail "
                      "their checksum or validation, with a warning",
    "includemetadata": "true | false: add _topic, _partition, _offset, _timestamp",
    "pushfilters": "true | false: take the filters Spark pushes to a batch read (PySpark 4.1+ "
                   "with spark.sql.python.filterPushdown.enabled, which SPARK_CONF sets): "
                   "filters on _topic, _partition, _offset and _timestamp skip what they "
                   "exclude before it is read, and filters on columns skip chunks by their "
                   "statistics and the key they were routed by",
    "columns": "comma-separated columns of the topic to read, in that order; "
               "only their bytes are decoded, as Spark cannot tell a Python source which "
               "columns a query needs",
    "maxoffsetspertrigger": "positive integer: records per micro-batch at most",
    "maxrecordspertrigger": "alias of maxOffsetsPerTrigger",
    "maxbytespertrigger": "size (1 byte or more; suffixes k, m, g, t): bytes per micro-batch at "
                          "most (approximate)",
    "minoffsetspertrigger": "positive integer: wait for this many records ...",
    "maxtriggerdelay": "... but no longer than this (e.g. 15m, 30s, 500ms)",
    "minpartitions": "positive integer: at least this many Spark partitions per batch",
    "maxrecordsperpartition": "positive integer: at most this many records per Spark partition",
    "consumergroup": "name under which a streaming query's committed offsets are recorded "
                     "(each batch's end, once the next batch starts); with "
                     "startingOffsets=group, also where a new query starts",
    "verifychecksums": "true | false (default true): verify every chunk's checksum before "
                       "decoding it; false trusts the bytes (a damaged chunk may then give "
                       "wrong rows or crash the worker)",
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
    "mergeschema": "true | false: evolve the topic's schema to take the DataFrame's new "
                   "columns and wider types (Delta's mergeSchema); columns it lacks are written "
                   "as nulls",
    "checkpointlocation": "Spark's checkpoint location",
    "pafka.config": "path of a .properties file with store configuration",
}

# Options only a streaming read uses. A batch read accepts them and logs that they have no
# effect, as Kafka's source does with maxOffsetsPerTrigger on a batch query.
STREAM_ONLY_SOURCE_OPTIONS = ("maxoffsetspertrigger", "maxrecordspertrigger",
                              "maxbytespertrigger", "minoffsetspertrigger", "maxtriggerdelay",
                              "consumergroup")

def _is_store_key(name: str) -> bool:
    return name in CONFIG_KEYS or name.startswith("storage.tiers.")


def _listing(table: Mapping[str, str]) -> str:
    return ", ".join(sorted((display(k) for k in table), key=str.lower))


def _check_known(opts: Mapping[str, str], known: Mapping[str, str], side: str) -> None:
    """Reject a name that is neither in ``known`` (the ``side``'s options: 'source' or 'sink')
    nor a store key, naming only that side's options."""
    for name in opts:
        if name in known or _is_store_key(name):
            continue
        if name in SOURCE_OPTIONS | SINK_OPTIONS:
            other = "write" if side == "source" else "read"
            raise InvalidArgument(f"option {display(name)!r} applies to a {other}, not to a "
                                  f"{'read' if side == 'source' else 'write'}. Known {side} "
                                  "options: "
                                  f"{_listing(known)}")
        close = difflib.get_close_matches(name, list(known) + list(CONFIG_KEYS), n=2, cutoff=0.6)
        hint = f"; did you mean {' or '.join(display(c) for c in close)}? " if close else ". "
        raise InvalidArgument(f"unknown {side} option {name!r}{hint}Known {side} options: "
                              f"{_listing(known)}; and the store keys of conf/pafka.properties")


# What an option is when it is not given, for the README's tables.
SOURCE_DEFAULTS = {
    "topic": "one of topic, subscribe, subscribePattern",
    "startingoffsets": "latest (streaming), earliest (batch)",
    "endingoffsets": "latest", "failondataloss": "true", "includemetadata": "false",
    "maxoffsetspertrigger": "no limit", "maxbytespertrigger": "no limit",
    "minoffsetspertrigger": "none", "maxtriggerdelay": "15m", "minpartitions": "none",
    "maxrecordsperpartition": "1000000", "consumergroup": "none (no group recorded)",
    "verifychecksums": "true", "pushfilters": "false", "columns": "all",
}
SINK_DEFAULTS = {
    "key": "none (round-robin per task and chunk)", "partitions": "num.partitions",
    "compression": "compression.type", "writerid": "the query id", "mergeschema": "false",
}


def markdown_tables() -> str:
    """The README's tables of source and sink options, with their defaults."""
    out = []
    for title, table, defaults in (("Source", SOURCE_OPTIONS, SOURCE_DEFAULTS),
                                   ("Sink", SINK_OPTIONS, SINK_DEFAULTS)):
        out += [f"| {title} option | default | meaning |", "|---|---|---|"]
        out += [f"| `{NAMES.get(k, k)}` | {defaults.get(k, '-')} | "
                f"{v.replace('|', chr(92) + '|')} |" for k, v in table.items()]
        out.append("")
    return "\n".join(out).rstrip()


def store_config(opts: Mapping[str, str]) -> dict[str, Any]:
    """Store configuration from options: the properties file, overridden by option keys."""
    conf: dict[str, Any] = {}
    if opts.get("pafka.config"):
        conf.update(load_config(opts["pafka.config"]))
    for name, value in opts.items():
        if _is_store_key(name):
            key = key_for(name)
            conf[key.name] = key.parse(value)
    return conf


def _root(opts: Mapping[str, str]) -> str:
    root = opts.get("path")
    if not root:
        raise InvalidArgument("no store root: pass it to load(root)/save(root)/start(root) or set "
                              "the 'path' option")
    return root


def _columns(opts: Mapping[str, str]) -> tuple[str, ...] | None:
    raw = opts.get("columns")
    if raw is None:
        return None
    names = tuple(c.strip() for c in str(raw).split(","))
    if not all(names):
        raise InvalidArgument(f"option 'columns' is {raw!r}: give column names separated by "
                              "commas, e.g. 'user,url'")
    return names


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
    verify: bool = True
    config: dict[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()  # option names set (lower-cased), for warnings
    columns: tuple[str, ...] | None = None  # checked against the topic when it is opened
    push_filters: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = lower_keys(options)
        _check_known(opts, SOURCE_OPTIONS, "source")
        chosen = [k for k in ("topic", "subscribe", "subscribepattern") if opts.get(k)]
        if len(chosen) != 1:
            raise InvalidArgument("set exactly one of the options 'topic', 'subscribe' and "
                                  "'subscribePattern' (got "
                                  f"{[display(k) for k in chosen] or 'none'})")
        topics: tuple[str, ...] = ()
        pattern = None
        if "topic" in chosen:
            topics = (opts["topic"].strip(),)
        elif "subscribe" in chosen:
            topics = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
            if not topics:
                raise bad_value("subscribe", opts["subscribe"], "a comma-separated list of topics")
        else:
            pattern = opts["subscribepattern"]
            try:
                re.compile(pattern)
            except re.error as e:
                raise bad_value("subscribePattern", pattern,
                                f"a regular expression ({e})") from None
        max_records = positive_int(opts, "maxoffsetspertrigger")
        alias = positive_int(opts, "maxrecordspertrigger")
        if max_records is not None and alias is not None and max_records != alias:
            raise InvalidArgument("maxOffsetsPerTrigger and its alias maxRecordsPerTrigger "
                                  "disagree: "
                                  "set one")
        max_records = max_records if max_records is not None else alias
        min_records = positive_int(opts, "minoffsetspertrigger")
        if min_records is not None and max_records is not None and min_records > max_records:
            raise InvalidArgument(f"minOffsetsPerTrigger={min_records} is above "
                                  "maxOffsetsPerTrigger="
                                  f"{max_records}: a micro-batch could never hold that many "
                                  "records; "
                                  "set minOffsetsPerTrigger <= maxOffsetsPerTrigger")
        starting_ts = None
        if opts.get("startingtimestamp") is not None:
            raw = opts["startingtimestamp"]
            try:
                starting_ts = int(str(raw).strip())
            except ValueError:
                starting_ts = -1
            if starting_ts < 0:
                raise bad_value("startingTimestamp", raw,
                                "milliseconds since the epoch (an integer >= 0)")
        by_ts = None
        if opts.get("startingoffsetsbytimestamp") is not None:
            raw = opts["startingoffsetsbytimestamp"]
            shape = 'JSON like {"clicks": {"0": 1700000000000}}'
            by_ts = offset_json("startingoffsetsbytimestamp", raw,
                                parse_json("startingoffsetsbytimestamp", raw, shape), 0,
                                "timestamps integers >= 0 (milliseconds since the epoch)")
        given = [k for k in ("startingoffsets", "startingtimestamp",
                             "startingoffsetsbytimestamp") if opts.get(k) is not None]
        if len(given) > 1:
            raise InvalidArgument(f"set at most one of {', '.join(display(k) for k in given)}")
        starting = parse_offsets(opts, "startingoffsets")
        group = non_empty(opts, "consumergroup", "a consumer group name")
        if starting == "group" and group is None:
            raise InvalidArgument("option 'startingOffsets' is 'group', but no 'consumerGroup' is "
                                  "set: name the group to start from with "
                                  ".option('consumerGroup', NAME)")
        return cls(
            root=_root(opts), topics=topics, pattern=pattern,
            starting=starting,
            ending=parse_offsets(opts, "endingoffsets", ending=True),
            starting_timestamp=starting_ts, starting_by_timestamp=by_ts,
            fail_on_data_loss=parse_bool(opts, "failondataloss", True),
            include_metadata=parse_bool(opts, "includemetadata", False),
            max_records=max_records,
            max_bytes=byte_size(opts, "maxbytespertrigger"),
            min_records=min_records,
            max_trigger_delay_ms=duration_ms(opts, "maxtriggerdelay", 15 * 60_000),
            min_partitions=positive_int(opts, "minpartitions"),
            max_records_per_partition=positive_int(opts, "maxrecordsperpartition") or 1_000_000,
            consumer_group=group,
            verify=parse_bool(opts, "verifychecksums", True),
            config=store_config(opts),
            given=frozenset(k for k, v in opts.items() if v is not None),
            columns=_columns(opts),
            push_filters=parse_bool(opts, "pushfilters", False),
        )

    def ignored_in_batch(self) -> list[str]:
        """The streaming-only options set (display names): a batch read ignores them.
        consumerGroup counts only without startingOffsets=group, which a batch read uses."""
        used = ("consumergroup",) if self.starting == "group" else ()
        return [display(k) for k in STREAM_ONLY_SOURCE_OPTIONS
                if k in self.given and k not in used]


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
    merge_schema: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = lower_keys(options)
        _check_known(opts, SINK_OPTIONS, "sink")
        if not opts.get("topic") or not str(opts["topic"]).strip():
            raise InvalidArgument("the 'topic' option is required to write: "
                                  ".option('topic', 'clicks')")
        compression = opts.get("compression")
        config = store_config(opts)
        if compression is not None:
            config["compression.type"] = key_for("compression.type").parse(compression)
        return cls(
            root=_root(opts), topic=opts["topic"].strip(),
            key=non_empty(opts, "key", "a column name"),
            partitions=positive_int(opts, "partitions"), compression=compression,
            timestamp_column=non_empty(opts, "timestampcolumn", "a column name"),
            writer_id=non_empty(opts, "writerid", "an id"), config=config,
            merge_schema=parse_bool(opts, "mergeschema", False),
        )
