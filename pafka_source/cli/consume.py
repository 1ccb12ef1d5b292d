"""``pafka consume``: print a topic's records, as ``kafka-console-consumer`` does.

:func:`consume` returns the records as they are read (the command's data); the renderers
below turn them into lines, printed through :mod:`.output`. ``--follow`` tails the topic
until Ctrl-C, which ends it with status 0. With ``--group`` it starts from the group's
committed offsets and commits each batch once it is printed.
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as dt
import decimal
import io
import json
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from tier_store import Consumer, CorruptSegment, FetchedBatch, InvalidArgument, Store

from . import output as out
from .args import add_root, epoch_ms, offset_or_word, whole
from .store_commands import open_store

META = ("_partition", "_offset", "_timestamp")  # as the Spark source's includeMetadata
CELL = 60  # a table cell's widest text; json and csv print values whole
POLL_SECONDS = 0.2
# Records per poll: memory stays bounded on a long backlog, and --group commits as it goes.
POLL_RECORDS = 10_000


def add_commands(command: Any) -> None:
    """Add ``pafka consume`` with ``command(name, help)``."""
    c = command("consume", "print a topic's records (from the earliest offsets unless told), "
                           "or tail it with --follow until Ctrl-C")
    c.epilog = ("Examples: pafka consume ROOT clicks --max 10; pafka consume ROOT clicks "
                "--follow --offset latest --format json; pafka consume ROOT clicks --group "
                "billing --follow. Each record carries _partition, _offset and _timestamp "
                "(its commit time, ms since the epoch); binary values print in base64.")
    add_root(c)
    c.add_argument("topic", metavar="TOPIC", help="the topic to read")
    c.add_argument("--partition", type=whole(0), action="append", metavar="P",
                   help="read partition P only (repeatable; default: every partition)")
    start = c.add_mutually_exclusive_group()
    start.add_argument("--offset", type=offset_or_word, metavar="earliest|latest|N",
                       help="where each partition starts: its earliest or latest offset, or "
                            "offset N (within each partition's range). Default: earliest, or "
                            "the group's committed offsets with --group")
    start.add_argument("--from-beginning", dest="offset", action="store_const",
                       const="earliest", help="the same as --offset earliest (Kafka's flag)")
    start.add_argument("--from-time", type=epoch_ms, metavar="T",
                       help="start at the first record committed at or after T: milliseconds "
                            "since the epoch, or an ISO 8601 time (UTC unless it has a zone)")
    c.add_argument("--max", "--max-messages", type=whole(1), metavar="N",
                   help="stop after N records (with --follow too); --max-messages is Kafka's "
                        "name")
    c.add_argument("--time", choices=("ms", "iso"), default="ms",
                   help="_timestamp as milliseconds since the epoch (default) or as ISO 8601 "
                        "in UTC")
    c.add_argument("--follow", action="store_true",
                   help="keep printing records as they are committed, until Ctrl-C (exit 0)")
    start.add_argument("--group", metavar="G",
                       help="consumer group: start from its committed offsets (earliest where "
                            "it has none) and commit what is printed; not with --offset or "
                            "--from-time (pafka groups --reset-to moves a group)")
    c.add_argument("--skip-corrupt", action="store_true",
                   help="go past a chunk that fails its checksum or validation, with a warning "
                        "naming the offsets skipped (default: stop with an error)")
    c.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="table: aligned columns, long cells cut (default); json: one object "
                        "per line; csv: a header, then a line per record")
    c.add_argument("--json", action="store_const", dest="format", const="json",
                   help="the same as --format json")
    c.set_defaults(func=cmd_consume)


# -- the data ----------------------------------------------------------------------------------
def consume(store: Store, topic: str, partitions: list[int] | None = None,
            offset: str | int | None = None, from_time: int | None = None,
            max_records: int | None = None, follow: bool = False, group: str | None = None,
            skip_corrupt: bool = False) -> Iterator[FetchedBatch]:
    """Yield the records of ``topic`` as the command prints them. Without ``follow`` it stops
    once it has caught up with the latest offsets. With ``group``, each batch is committed
    when the caller asks for the next one (so what was printed, and only that). A corrupt
    chunk is an error naming it, or with ``skip_corrupt`` skipped with a warning."""
    if group is not None and (offset is not None or from_time is not None):
        raise InvalidArgument("--group starts from the group's committed offsets: give "
                              "--offset or --from-time without --group (pafka groups "
                              "--reset-to moves a group's offsets)")
    t = store.topic(topic)
    if isinstance(offset, int) and not partitions and t.partitions > 1:
        raise InvalidArgument(f"--offset {offset} needs --partition P: topic {topic!r} has "
                              f"{t.partitions} partitions, each with its own offsets")
    if partitions:
        for p in partitions:
            if not 0 <= p < t.partitions:
                raise InvalidArgument(f"--partition {p}: topic {topic!r} has partitions "
                                      f"0..{t.partitions - 1}")
    consumer = Consumer(None, t, group, partitions or None, skip_corrupt=skip_corrupt)
    for p in consumer.assignment():
        if from_time is not None:
            consumer.seek(p, t.offset_for_time(p, from_time))
        elif offset is not None:
            try:
                consumer.seek(p, offset)
            except InvalidArgument as e:
                raise InvalidArgument(f"--offset {offset}: {e}") from None
    left = max_records
    while left is None or left > 0:
        try:
            batches = consumer.poll(timeout=1.0 if follow else 0.0,
                                    max_records=min(left or POLL_RECORDS, POLL_RECORDS))
        except CorruptSegment as e:
            raise CorruptSegment(f"{e}; --skip-corrupt goes past it") from None
        if not batches and not follow:
            return
        for fb in batches:
            yield fb
            if left is not None:
                left -= fb.batch.num_rows
        if batches and group is not None:
            consumer.commit()


# -- rendering ---------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A value JSON can hold: bytes in base64, times in ISO 8601, decimals as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | dt.timedelta):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def rows(fb: FetchedBatch, iso: bool = False) -> list[dict[str, Any]]:
    """The batch's records as dicts: metadata first, then the topic's columns (``iso``: the
    commit time as ISO 8601 in UTC, to the millisecond)."""
    ts: Any = fb.timestamp
    if iso:
        ts = dt.datetime.fromtimestamp(ts / 1000, dt.UTC).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    return [{META[0]: fb.partition, META[1]: fb.offset + i, META[2]: ts,
             **{k: _plain(v) for k, v in row.items()}}
            for i, row in enumerate(fb.batch.to_pylist())]


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


class Printer:
    """Renders batches in one format: a header once (csv, table), then lines. A table's
    widths are set by its first rows; a longer value widens its own cell only."""

    def __init__(self, fmt: str, schema: pa.Schema, iso: bool = False):
        self.fmt, self.iso = fmt, iso
        self.columns = [*META, *schema.names]
        # Numbers right-aligned, as in every table of pafka.
        self.right = [True] * len(META) + [
            pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
            or pa.types.is_decimal(f.type) for f in schema]
        self.widths: list[int] | None = None

    def lines(self, fb: FetchedBatch) -> list[str]:
        """The lines printing ``fb``."""
        records = rows(fb, self.iso)
        if self.fmt == "json":
            return [json.dumps(r) for r in records]
        if self.fmt == "csv":
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            if self.widths is None:
                w.writerow(self.columns)
                self.widths = []
            w.writerows([[_text(r[c]) for c in self.columns] for r in records])
            return buf.getvalue().splitlines()
        return self._table(records)

    def _table(self, records: list[dict[str, Any]]) -> list[str]:
        cells = [[_cut(_text(r[c])) for c in self.columns] for r in records]
        lines = []
        if self.widths is None:
            heads = [c.upper() if c in META else c for c in self.columns]
            self.widths = [max([len(h)] + [len(row[i]) for row in cells])
                           for i, h in enumerate(heads)]
            lines.append(self._line(heads))
        return lines + [self._line(row) for row in cells]

    def _line(self, cells: list[str]) -> str:
        assert self.widths is not None
        return "  ".join(c.rjust(w) if right else c.ljust(w)
                         for c, w, right in zip(cells, self.widths, self.right, strict=True)
                         ).rstrip()


def _cut(text: str) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= CELL else text[:CELL - 1] + "…"


def cmd_consume(args: argparse.Namespace) -> int:
    """Print the records; a summary line on stderr at the end (also after Ctrl-C)."""
    store = open_store(args.root)
    records = consume(store, args.topic, args.partition, args.offset, args.from_time,
                      args.max, args.follow, args.group, args.skip_corrupt)
    printer = Printer(args.format, store.topic(args.topic).schema, args.time == "iso")
    count = 0
    try:
        for fb in records:
            lines = printer.lines(fb)
            if not lines:
                continue
            for line in lines[:-1]:
                out.echo(line)
            # Flushed per batch when tailing: a reader of the pipe sees records as they come.
            out.echo(lines[-1], flush=args.follow)
            count += fb.batch.num_rows
    except KeyboardInterrupt:
        if not args.follow:
            raise
    out.echo(f"consumed {out.plural(count, 'record')} from topic {args.topic}", err=True)
    return 0
