"""``pafka`` commands that manage topics: create-topic, add-partitions, config, produce.

Each ``*_topic``/``*_config`` function takes a store and returns data; the ``cmd_*``
handlers parse arguments, draw progress bars, and print through :mod:`.output`.

Only ``create-topic --create-store`` creates a store. A mistyped root must stay an error, as
in every other command; but a shell user with no Python and no Spark job needs a way to
start one, so the flag makes that choice explicit, with the layout in ``--store-config``.
"""

from __future__ import annotations

import argparse
from typing import Any

import pyarrow as pa

from tier_store import (
    CONFIG_KEYS,
    TOPIC_CONFIG_KEYS,
    ConfigError,
    InvalidArgument,
    Store,
    StoreNotFound,
    TopicExists,
    check_topic_config,
    root_location,
    schema_changes,
    topic_key,
    unset_key,
)

from ..schema_text import ALLOWED_TYPES, parse_schema, schema_text, type_text
from . import output as out
from . import store_commands as sc
from .args import add_json, add_root, add_topic, whole
from .produce import FORMATS, file_format, produce

CONFIG_HELP = ("a topic-level key: " + ", ".join(TOPIC_CONFIG_KEYS) +
               " (Kafka's retention.ms, retention.bytes, segment.ms also work)")


def key_values(items: list[str] | None, option: str) -> dict[str, str]:
    """``KEY=VALUE`` items of ``option`` as a dict; a malformed or repeated key is an error."""
    conf: dict[str, str] = {}
    for item in items or []:
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise InvalidArgument(f"{option} takes KEY=VALUE, got {item!r}")
        if k.strip() in conf:
            raise InvalidArgument(f"{option} {k.strip()} is given twice")
        conf[k.strip()] = v.strip()
    return conf


# -- the commands' data -------------------------------------------------------------------------
def read_schema_file(path: str) -> pa.Schema:
    """The schema of an Arrow IPC file or stream (its records are not read)."""
    with open(path, "rb") as f:  # a missing or unreadable file: the OSError names it
        head = f.read(6)
    try:
        if head == b"ARROW1":
            return pa.ipc.open_file(pa.memory_map(path)).schema
        return pa.ipc.open_stream(pa.OSFile(path)).schema
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidArgument(f"--schema-file {path}: not an Arrow IPC file or stream "
                              f"({str(e).splitlines()[0]}); or give --schema \"id long, ...\"")\
            from None


def create_topic(store: Store, name: str, schema: pa.Schema, partitions: int | None,
                 config: dict[str, str]) -> dict[str, Any]:
    """Create topic ``name`` (the store checks ``config``); what it is now."""
    try:
        t = store.create_topic(name, schema, partitions, config)
    except TopicExists as e:
        raise TopicExists(f"{e}: pafka describe shows it, pafka delete-topic deletes it; or "
                          "pick another name") from None
    return {"root": store.root, "topic": t.name, "id": t.id, "partitions": t.partitions,
            "schema": schema_text(t.schema), "config": t.config}


def add_partitions(store: Store, name: str, n: int | None = None,
                   total: int | None = None) -> dict[str, Any]:
    """Add ``n`` partitions to topic ``name``, or as many as make ``total`` (Kafka's
    ``--partitions``: a count below the topic's is an error, as there): its count before
    and after."""
    t = store.topic(name)
    before = t.partitions
    if total is not None:
        if total <= before:
            raise InvalidArgument(f"--total {total}: topic {name!r} has {before} partitions "
                                  "already; the count can only grow (--total names the new "
                                  "count, --add how many to add)")
        n = total - before
    assert n is not None
    return {"topic": name, "before": before, "added": n, "partitions": t.add_partitions(n)}


def _one_column(text: str, option: str) -> pa.Field:
    """The one column ``text`` names as ``"name type"`` (Spark DDL)."""
    fields = list(parse_schema(text))
    if len(fields) != 1:
        raise InvalidArgument(f"{option} {text!r}: give one column as \"name type\", e.g. "
                              f"\"country string\" (repeat {option} for more)")
    return fields[0]


def alter_topic(store: Store, name: str, add: list[str] | None = None,
                widen: list[str] | None = None, nullable: list[str] | None = None
                ) -> dict[str, Any]:
    """Change topic ``name``'s schema in one step: add nullable columns (``"name type"``),
    widen columns' types (``"name type"``), make columns nullable (names). The store refuses
    any change Delta would not allow, naming the column and the rule."""
    t = store.topic(name)
    before = t.schema
    fields = list(before)

    def column(col: str, option: str, given: str) -> int:
        if col not in before.names:
            raise InvalidArgument(f"{option} {given!r}: topic {name!r} has no column {col!r}; "
                                  f"its columns: {', '.join(before.names)}")
        return before.get_field_index(col)

    for text in widen or []:
        f = _one_column(text, "--widen")
        i = column(f.name, "--widen", text)
        fields[i] = pa.field(f.name, f.type, fields[i].nullable, fields[i].metadata)
    for col in nullable or []:
        i = column(col, "--nullable", col)
        fields[i] = fields[i].with_nullable(True)
    for text in add or []:
        f = _one_column(text, "--add-column")
        if f.name in [g.name for g in fields]:
            raise InvalidArgument(f"--add-column {text!r}: topic {name!r} has a column "
                                  f"{f.name!r} already (--widen changes its type)")
        fields.append(f)
    after = t.evolve(pa.schema(fields, metadata=before.metadata))
    return {"topic": name, "version": t.version, "before": schema_text(before),
            "schema": schema_text(after), "changes": schema_changes(before, after, type_text)}


def topic_config(store: Store, name: str, set_: dict[str, str] | None = None,
                 unset: list[str] | None = None) -> dict[str, Any]:
    """Topic ``name``'s effective value of every key it may set (``source``: topic, store
    or default), after setting ``set_`` and unsetting ``unset`` in one commit-log entry."""
    t = store.topic(name)
    changes: dict[str, Any] = dict(set_ or {})
    own = t.config
    set_keys = {topic_key(k) for k in changes}
    for k in unset or []:
        key = unset_key(k)
        if k in changes or key in set_keys:
            raise InvalidArgument(f"--unset {k} and --set {k} contradict each other")
        if key not in own:
            raise InvalidArgument(f"--unset {k}: topic {name!r} has no value of its own for "
                                  f"{key}; its own keys: {', '.join(own) or '(none)'}")
        changes[key] = None
    before = own
    after = t.set_config(changes) if changes else own
    saved = store.config.explicit()
    rows = []
    for key in TOPIC_CONFIG_KEYS:
        source = "topic" if key in after else "store" if key in saved else "default"
        value = after[key] if key in after else store.config[key]
        rows.append({"key": key, "value": value, "source": source,
                     "allowed": CONFIG_KEYS[key].allowed()})
    changed = [{"key": k, "before": before.get(k), "after": after.get(k)}
               for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
    return {"topic": name, "version": t.version, "config": rows, "changed": changed}


def open_for_create(root: str, create_store: bool, store_config: dict[str, str]) -> Store:
    """The store a topic is created in: the existing one, or with ``create_store`` a new one
    laid out by ``store_config`` (the parser refuses it without ``create_store``)."""
    if not create_store:
        try:
            return sc.open_store(root)
        except StoreNotFound as e:
            raise StoreNotFound(f"{e}; or add --create-store (with --store-config KEY=VALUE "
                                "for its tiers) to make one here") from None
    sc.check_root(root)
    return Store.open(root_location(root), store_config or None, create=True)


# -- handlers -------------------------------------------------------------------------------
def cmd_create_topic(args: argparse.Namespace) -> int:
    schema = (parse_schema(args.schema) if args.schema is not None
              else read_schema_file(args.schema_file))
    config = key_values(args.config, "--config")
    check_topic_config(config, unset=False)  # before a store is made
    store = open_for_create(args.root, args.create_store,
                            key_values(args.store_config, "--store-config"))
    out.emit(create_topic(store, args.topic, schema, args.partitions, config), args.json,
             out.render_created)
    return 0


def cmd_add_partitions(args: argparse.Namespace) -> int:
    out.emit(add_partitions(sc.open_store(args.root), args.topic, args.add, args.total),
             args.json, out.render_partitions)
    return 0


def cmd_alter_topic(args: argparse.Namespace) -> int:
    out.emit(alter_topic(sc.open_store(args.root), args.topic, args.add_column, args.widen,
                         args.nullable), args.json, out.render_altered)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    store = sc.open_store(args.root)
    try:
        out.emit(topic_config(store, args.topic, key_values(args.set, "--set"), args.unset),
                 args.json, out.render_topic_config)
    except ConfigError as e:
        raise ConfigError(f"topic {args.topic!r}: {e}") from None
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    store = sc.open_store(args.root)
    with tqdm(unit=" records", unit_scale=True, desc="producing", disable=None) as bar:
        def progress(records: int, total: int | None) -> None:
            if total is not None and bar.total != total:
                bar.total = total
            bar.update(records - bar.n)
        summary = produce(store, args.topic, args.source, args.format, args.key,
                          args.partition, args.batch_records, progress,
                          null_values=_null_values(args.null_values), skip=args.skip,
                          linger_ms=args.linger_ms)
    out.emit(summary, args.json, out.render_produced)
    return 0


def file_format_or_none(args: argparse.Namespace) -> str | None:
    """The input's format as ``--format`` or its suffix says; None when neither does (the
    command itself then says what to give)."""
    try:
        return file_format(args.source, args.format)
    except InvalidArgument:
        return None


def _null_values(given: list[str] | None) -> list[str] | None:
    """``--null-values`` as a list: each flag a comma list, so ``--null-values NULL,NA``."""
    if given is None:
        return None
    return [v for g in given for v in g.split(",")]


# -- parsers ----------------------------------------------------------------------------------
def add_commands(command: Any) -> None:
    """Add create-topic, add-partitions, config and produce with ``command(name, help)``."""
    c = command("create-topic", "create a topic with a schema and a number of partitions")
    c.epilog = ('Example: pafka create-topic ROOT clicks --schema "user long, url string, ts '
                'timestamp" --partitions 4 --config retention.ms=86400000')
    add_root(c)
    add_topic(c, "the new topic's name")
    given = c.add_mutually_exclusive_group(required=True)
    given.add_argument("--schema", metavar="DDL",
                       help="columns as Spark's DDL: \"name type [NOT NULL], ...\"; types: "
                            + ALLOWED_TYPES.replace("%", "%%"))
    given.add_argument("--schema-file", metavar="FILE",
                       help="an Arrow IPC file or stream whose schema the topic takes")
    c.add_argument("--partitions", type=whole(1), metavar="N",
                   help="partition count (default: the store's num.partitions)")
    c.add_argument("--config", action="append", metavar="KEY=VALUE", help=CONFIG_HELP)
    c.add_argument("--create-store", action="store_true",
                   help="create the store at ROOT if it has none (without it, a root with no "
                        "store is an error, so a mistyped path makes nothing)")
    c.add_argument("--store-config", action="append", metavar="KEY=VALUE",
                   help="with --create-store: a store key such as storage.tiers.types=PMEM,HDD "
                        "or log.segment.bytes=64m (conf/pafka.properties lists them)")
    add_json(c)
    c.set_defaults(func=cmd_create_topic, parser=c, check_usage=lambda a: (
        "--store-config applies only with --create-store (the layout of an existing store "
        "is fixed; see pafka resize and relocate)"
        if a.store_config and not a.create_store else None))

    a = command("add-partitions", "add partitions to a topic (readers find them; existing "
                                  "records stay where they are)")
    add_root(a)
    add_topic(a)
    a.epilog = ("Example: pafka add-partitions ROOT clicks --total 8 (Kafka's "
                "--partitions 8: the new count); ... --add 2 (two more)")
    how = a.add_mutually_exclusive_group()
    how.add_argument("--total", "--partitions", type=whole(1), metavar="N",
                     help="the topic's new partition count, as Kafka's --partitions")
    how.add_argument("--add", type=whole(1), metavar="N", help="how many partitions to add")
    # A bare N meant "add N" before; Kafka's N is the new count: a bare one says which to use.
    a.add_argument("bare", nargs="?", help=argparse.SUPPRESS)
    add_json(a)
    a.set_defaults(func=cmd_add_partitions, parser=a, check_usage=lambda x: (
        f"a bare {x.bare} is ambiguous: give --add {x.bare} ({x.bare} more partitions) or "
        f"--total {x.bare} (the new count, as Kafka's --partitions)" if x.bare is not None
        else "give --add N (N more partitions) or --total N (the new count)"
        if x.add is None and x.total is None else None))

    e = command("alter-topic", "change a topic's schema as Delta allows: add nullable "
                               "columns, widen types, make columns nullable")
    e.epilog = ('Example: pafka alter-topic ROOT clicks --add-column "country string" '
                '--widen "user bigint"')
    add_root(e)
    add_topic(e)
    e.add_argument("--add-column", action="append", metavar="\"NAME TYPE\"",
                   help="add a nullable column (Spark DDL type); older records read it as null")
    e.add_argument("--widen", action="append", metavar="\"NAME TYPE\"",
                   help="widen a column: tinyint, smallint, int, bigint; float, double; a "
                        "decimal's precision at the same scale")
    e.add_argument("--nullable", action="append", metavar="NAME",
                   help="make a non-null column nullable")
    add_json(e)
    e.set_defaults(func=cmd_alter_topic, parser=e, check_usage=lambda a: (
        "give at least one of --add-column, --widen and --nullable"
        if not (a.add_column or a.widen or a.nullable) else None))

    g = command("config", "show a topic's configuration, its own values marked, or change "
                          "them for every process")
    g.epilog = ("Example: pafka config ROOT clicks --set retention.ms=3600000 --unset "
                "compression.type")
    add_root(g)
    add_topic(g)
    g.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="give the topic its own value: " + CONFIG_HELP)
    g.add_argument("--unset", action="append", metavar="KEY",
                   help="drop the topic's own value of KEY: the store's applies again")
    add_json(g)
    g.set_defaults(func=cmd_config)

    p = command("produce", "append the records of a Parquet, CSV, JSON-lines or Arrow IPC "
                           "file to a topic, in batches")
    p.epilog = "Example: pafka produce ROOT clicks --from clicks.parquet --key user"
    add_root(p)
    add_topic(p)
    p.add_argument("--from", dest="source", required=True, metavar="FILE",
                   help="the file to read; - reads stdin (with --format csv, json or arrow)")
    p.add_argument("--format", choices=FORMATS,
                   help="the file's format (default: from its suffix, e.g. .parquet, .csv, "
                        ".jsonl, .arrow)")
    to = p.add_mutually_exclusive_group()
    to.add_argument("--key", metavar="COLUMN",
                    help="route each record by the hash of COLUMN (default: round-robin)")
    to.add_argument("--partition", type=whole(0), metavar="P",
                    help="write every record to partition P")
    p.add_argument("--batch-records", type=whole(1), default=65536, metavar="N",
                   help="records read and appended at a time (default 65536)")
    p.add_argument("--linger-ms", type=whole(0), default=1000, metavar="MS",
                   help="stdin, CSV or JSON lines: commit what came within MS of a batch's "
                        "first line, as Kafka's linger.ms (default 1000)")
    p.add_argument("--skip", type=whole(0), default=0, metavar="N",
                   help="leave out the file's first N records (to resume an interrupted "
                        "produce: it names N)")
    p.add_argument("--null-values", action="append", metavar="V,...",
                   help="CSV: cells that are null (comma list; repeatable). Default: only an "
                        "empty cell, and in a string column none (nan is NaN, NULL is text)")
    add_json(p)
    p.set_defaults(func=cmd_produce, parser=p, check_usage=lambda a: (
        "--null-values applies only to CSV input"
        if a.null_values is not None and file_format_or_none(a) not in (None, "csv")
        else None))
