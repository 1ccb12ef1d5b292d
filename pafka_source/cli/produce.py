"""``pafka produce``: records from a Parquet, CSV, JSON-lines or Arrow IPC file into a topic.

The file is read in batches, never whole; each batch is validated as Arrow data (an Arrow
file from elsewhere may hold offsets out of bounds or strings that are not UTF-8), checked
against the topic's schema (a missing, extra or unconvertible column is one error naming the
column, the file and both types), cast to it, and appended (durable and visible) before the
next batch is read. A failure part way says how many records went in before it.

In CSV only an empty cell is null (and in a string column, none): ``nan``, ``NaN`` and
``-nan`` in a float column are NaN, ``NULL`` is text. ``null_values`` replaces that list.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import pyarrow as pa

from tier_store import InvalidArgument, SchemaMismatch, Store, Topic, check_valid

from ..schema_text import type_text

log = logging.getLogger(__name__)
FORMATS = ("parquet", "csv", "json", "arrow")
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".tsv": "csv",
             ".json": "json", ".jsonl": "json", ".ndjson": "json", ".arrow": "arrow",
             ".arrows": "arrow", ".ipc": "arrow", ".feather": "arrow"}
_COMPRESSED = (".gz", ".bz2", ".zst", ".lz4")
_CSV_ERROR = re.compile(r"In CSV column #(\d+): (?:Row #(\d+): )?CSV conversion error to "
                        r"([^:]+): (.*)")
_JSON_ERROR = re.compile(r"JSON parse error: Column\(/([^)]*)\) changed from (\w+) to (\w+)")


def file_format(path: str, given: str | None) -> str:
    """``given``, or the format ``path``'s suffix names (a compression suffix aside)."""
    if given is not None:
        if path == "-" and given not in ("csv", "json", "arrow"):
            raise InvalidArgument(f"--format {given} cannot be read from stdin (it needs to "
                                  "seek): give a file, or use csv, json or arrow")
        return given
    if path == "-":
        raise InvalidArgument("reading stdin ('-') needs --format csv, json or arrow")
    name = path.lower()
    for z in _COMPRESSED:
        name = name.removesuffix(z)
    fmt = _SUFFIXES.get(os.path.splitext(name)[1])
    if fmt is None:
        raise InvalidArgument(f"cannot tell the format of {path} from its suffix: give --format "
                              f"{'|'.join(FORMATS)} (suffixes: {', '.join(sorted(_SUFFIXES))})")
    return fmt


class _Source:
    """One input file (or stdin) of one format: its batches, as the file holds them."""

    def __init__(self, path: str, fmt: str, schema: pa.Schema, batch_records: int,
                 null_values: list[str] | None = None, linger_ms: int | None = None):
        self.path, self.fmt, self.schema, self.batch_records = path, fmt, schema, batch_records
        self.null_values = null_values
        self.name = "stdin" if path == "-" else path
        self.total: int | None = None  # records, when the file says
        # Lines of stdin go out at most this long after they arrive (CSV and JSON lines).
        self.linger_ms = linger_ms if path == "-" and fmt in ("csv", "json") else None
        self._block: bytes | None = None

    def _stream(self) -> BinaryIO | Any:
        if self._block is not None:
            import io
            return io.BytesIO(self._block)
        if self.path == "-":
            return sys.stdin.buffer
        return pa.input_stream(self.path, compression="detect")

    def lingering(self) -> bool:
        return self.linger_ms is not None  # batches cut by time too (stdin, CSV or JSON)

    def _lingered(self, read: Callable[[], Iterator[pa.RecordBatch]]
                  ) -> Iterator[pa.RecordBatch]:
        """Stdin's lines in blocks of at most ``batch_records`` lines, each block out at most
        ``linger_ms`` after its first line came (as Kafka's console producer's linger.ms):
        ``tail -f log | pafka produce`` commits as lines arrive, not at the end."""
        import queue
        lines: queue.Queue[bytes | None] = queue.Queue(maxsize=4 * self.batch_records)
        stdin = sys.stdin.buffer

        def pump() -> None:
            try:
                for line in stdin:
                    lines.put(line)
            finally:
                lines.put(None)  # the end of stdin
        threading.Thread(target=pump, name="pafka-stdin", daemon=True).start()
        header = b""
        if self.fmt == "csv":  # each block is read as a CSV file of its own: header first
            if (first := lines.get()) is None:
                return
            header = first if first.endswith(b"\n") else first + b"\n"
        assert self.linger_ms is not None
        done, blocks = False, 0
        while not done:
            got: list[bytes] = []
            line = lines.get()  # wait as long as it takes for a block's first line
            if line is None:
                if self.fmt == "csv" and not blocks:  # a header alone: read it (and check it)
                    self._block = header
                    yield from read()
                break
            blocks += 1
            got.append(line)
            due = time.monotonic() + self.linger_ms / 1000
            while len(got) < self.batch_records:
                try:
                    line = lines.get(timeout=max(0.0, due - time.monotonic()))
                except queue.Empty:
                    break
                if line is None:
                    done = True
                    break
                got.append(line)
            self._block = header + b"".join(got) + (b"" if got[-1].endswith(b"\n") else b"\n")
            try:
                yield from read()
            finally:
                self._block = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The file's batches, each validated before anything reads its values."""
        row = 1  # a file's records counted from 1, as the CSV errors count them
        read = getattr(self, "_" + self.fmt)
        try:
            for b in (self._lingered(read) if self.lingering() else read()):
                check_valid(pa.Table.from_batches([b]), self.name, first_row=row, outcome="")
                row += b.num_rows
                yield b
        except (pa.ArrowException, OSError) as e:  # an IPC message unlike its body: OSError
            raise InvalidArgument(f"{self.name}: cannot read it as {self.fmt}: "
                                  f"{self._column_names(str(e))}") from None

    def _column_names(self, message: str) -> str:
        """pyarrow's CSV errors number columns, its JSON errors name JSON's types: name the
        column and the topic's type."""
        first = message.splitlines()[0]
        j = _JSON_ERROR.match(first)
        if j is not None:
            name = j.group(1)
            i = self.schema.get_field_index(name)
            want = type_text(self.schema.field(i).type) if i >= 0 else "no such column"
            return (f"column {name!r} is a JSON {j.group(3)} in a record, where the "
                    f"topic's {want} needs a JSON {j.group(2)}")
        m = _CSV_ERROR.match(first)
        if m is None:
            return first
        names = self._csv_header()
        i = int(m.group(1))
        name = repr(names[i]) if i < len(names) else f"#{i + 1}"
        row = f" in data row {int(m.group(2)) + 1}" if m.group(2) else ""
        return (f"column {name} is text in CSV, which does not convert to the topic's "
                f"{m.group(3)}{row}: {m.group(4)}")

    def _csv_header(self) -> list[str]:
        """The names in the CSV file's first line (none from stdin, which cannot be reread)."""
        if self.path == "-":
            return []
        import csv
        with pa.input_stream(self.path, compression="detect") as f:
            head = f.read(1 << 20).decode("utf-8", "replace").splitlines()[:1]
        delimiter = "\t" if self.path.lower().endswith(".tsv") else ","
        return next(csv.reader(head, delimiter=delimiter), [])

    def _parquet(self) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq
        f = pq.ParquetFile(self.path)
        self.total = f.metadata.num_rows
        yield from f.iter_batches(batch_size=self.batch_records)

    def _arrow(self) -> Iterator[pa.RecordBatch]:
        if self.path != "-":
            try:
                reader = pa.ipc.open_file(pa.memory_map(self.path))
            except pa.ArrowInvalid:
                pass  # not the file format: try the stream format
            else:
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
                self.total = sum(b.num_rows for b in batches)  # mapped, not read
                yield from batches
                return
        yield from pa.ipc.open_stream(self._stream())

    def _csv(self) -> Iterator[pa.RecordBatch]:
        import pyarrow.csv as pcsv
        # The topic's types where CSV text converts to them directly; a zoned timestamp is
        # inferred (with or without a zone offset) and cast, nested types cannot be in CSV.
        for f in self.schema:
            if pa.types.is_nested(f.type):
                raise InvalidArgument(f"column {f.name!r} of the topic is {type_text(f.type)}, "
                                      f"which CSV cannot hold: produce {self.name} as json, "
                                      "parquet or arrow")
        types = {f.name: f.type for f in self.schema
                 if not (pa.types.is_timestamp(f.type) and f.type.tz)}
        delimiter = "\t" if self.path.lower().endswith(".tsv") else ","
        # Arrow's default null list holds nan, NaN and -nan: NaN in a float column would be
        # stored as null. Only an empty cell is null, unless the user lists other values.
        given = self.null_values is not None
        convert = pcsv.ConvertOptions(column_types=types,
                                      null_values=self.null_values if given else [""],
                                      strings_can_be_null=given)
        reader = pcsv.open_csv(self._stream(),
                               read_options=pcsv.ReadOptions(block_size=4 << 20),
                               parse_options=pcsv.ParseOptions(delimiter=delimiter),
                               convert_options=convert)
        try:  # the reader's threads stop before leaving: a process exiting under them aborts
            header = reader.schema.names
            if not set(header) & set(self.schema.names):
                # A file without a header line: its first record would be taken for one.
                raise InvalidArgument(
                    f"{self.name}: the first line ({', '.join(header)[:80]}) names no column "
                    f"of the topic; a CSV input starts with a header line naming its columns "
                    f"({','.join(self.schema.names)})")
            yield from reader
        finally:
            reader.close()

    def _json(self) -> Iterator[pa.RecordBatch]:
        import pyarrow.json as pjson
        # Fields of the topic are parsed as its types; other fields are kept (inferred) so
        # that the check names them. A field missing from a line is null there, as in JSON.
        options = pjson.ParseOptions(explicit_schema=self.schema,
                                     unexpected_field_behavior="infer")
        read = pjson.ReadOptions(block_size=4 << 20)
        if hasattr(pjson, "open_json"):  # pyarrow 19 and later stream; older read it whole
            yield from pjson.open_json(self._stream(), read_options=read, parse_options=options)
        else:
            yield from pjson.read_json(self._stream(), read_options=read,
                                       parse_options=options).to_batches()


def fit(batch: pa.RecordBatch, schema: pa.Schema, topic: str, source: str) -> pa.Table:
    """``batch`` with the topic's columns in its order, each cast to the topic's type; a
    missing, extra or unconvertible column is :class:`SchemaMismatch` naming it."""
    names = batch.schema.names
    missing = [n for n in schema.names if n not in names]
    extra = [n for n in names if n not in schema.names]
    if missing or extra:
        what = "; ".join(([f"no column {', '.join(map(repr, missing))}"] if missing else []) +
                         ([f"extra column {', '.join(map(repr, extra))}"] if extra else []))
        raise SchemaMismatch(f"{source} does not fit topic {topic!r}: {what}; the topic's "
                             f"columns: {', '.join(schema.names)}")
    cols = []
    for f in schema:
        col = batch.column(f.name)
        if not col.type.equals(f.type):
            try:
                col = col.cast(f.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                why = str(e).splitlines()[0]
                raise SchemaMismatch(
                    f"column {f.name!r} of {source} is {type_text(col.type)}, the topic "
                    f"{topic!r} has {type_text(f.type)}: {why}") from None
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema.with_metadata(None)
                                if schema.metadata else schema)


class _CommitGuard:
    """Defers Ctrl-C (SIGINT) while its block runs, then raises it; elsewhere Ctrl-C stops
    at once (also a read waiting on stdin). Only in the main thread, where signals land."""

    def __init__(self) -> None:
        self.inside = self.hit = False
        self.old: Any = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGINT, self._on_sigint)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if not self.inside:
            raise KeyboardInterrupt
        self.hit = True

    def __enter__(self) -> None:
        self.inside = True

    def __exit__(self, *exc: Any) -> None:
        self.inside = False
        if self.hit and exc[0] is None:
            raise KeyboardInterrupt

    def close(self) -> None:
        if self.old is not None:
            signal.signal(signal.SIGINT, self.old)
            self.old = None


def _skipped(batches: Iterator[pa.RecordBatch], n: int) -> Iterator[pa.RecordBatch]:
    """``batches`` without their first ``n`` rows."""
    for b in batches:
        if n >= b.num_rows:
            n -= b.num_rows
            continue
        yield b.slice(n) if n else b
        n = 0


def _rebatched(batches: Iterator[pa.RecordBatch], n: int) -> Iterator[pa.Table]:
    """Tables of ``n`` rows (the last fewer), from batches of any size."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for b in batches:
        while b.num_rows:
            take = b.slice(0, n - rows)
            held.append(take)
            rows += take.num_rows
            b = b.slice(take.num_rows)
            if rows == n:
                yield pa.Table.from_batches(held)
                held, rows = [], 0
    if rows:
        yield pa.Table.from_batches(held)


class Interrupted(InvalidArgument):
    """Ctrl-C during ``produce``: what went in, and how to go on."""


def produce(store: Store, topic: str, path: str, fmt: str | None = None,
            key: str | None = None, partition: int | None = None,
            batch_records: int = 65536,
            progress: Callable[[int, int | None], None] | None = None,
            null_values: list[str] | None = None, skip: int = 0,
            linger_ms: int = 1000) -> dict[str, Any]:
    """Append the records of file ``path`` (``-``: stdin) to ``topic`` in batches of
    ``batch_records``, after its first ``skip``; ``progress(records, total)`` after each.
    From stdin, CSV and JSON lines go out at most ``linger_ms`` after they arrive.
    ``null_values``: the CSV cells that are null (default: only an empty one). A column of
    the topic that no record of a JSON file holds is stored as nulls, with a warning. Ctrl-C
    stops after the batch being committed: :class:`Interrupted` says how many records went
    in and how to resume. The summary: records, bytes, records per partition, seconds."""
    t: Topic = store.topic(topic)
    if key is not None and key not in t.schema.names:
        raise InvalidArgument(f"--key {key}: not a column of topic {topic!r} (columns: "
                              f"{', '.join(t.schema.names)})")
    fmt = file_format(path, fmt)
    if path != "-" and not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", path)
    if path != "-" and os.path.isdir(path):
        raise IsADirectoryError(21, "Is a directory: give a file", path)
    if null_values is not None and fmt != "csv":
        raise InvalidArgument(f"null_values applies only to CSV input, not {fmt}")
    src = _Source(path, fmt, t.schema, batch_records, null_values, linger_ms)
    records, size, by_partition = 0, 0, dict.fromkeys(range(t.partitions), 0)
    started = time.perf_counter()
    absent = set(t.schema.names) if fmt == "json" else set()  # no value seen yet
    guard = _CommitGuard()
    try:
        batches = _skipped(src.batches(), skip)
        # A lingering source's batches are what arrived in time: each is committed as it is.
        tables = (pa.Table.from_batches([b]) for b in batches) if src.lingering() else \
            _rebatched(batches, batch_records)
        for table in tables:
            data = fit(table, t.schema, topic, src.name)
            absent -= {n for n in absent if data.column(n).null_count < data.num_rows}
            refs = t.write_chunks(data, partition=partition, key=key)
            with guard:  # Ctrl-C waits for the commit: the count below is then exact
                t.commit(refs)
                records += data.num_rows
            size += sum(r.length for r in refs)
            for r in refs:
                by_partition[r.partition] = by_partition.get(r.partition, 0) + r.records
            if progress is not None:
                progress(records, src.total)
    except (InvalidArgument, SchemaMismatch) as e:
        if records:  # say what is in the topic already
            raise type(e)(f"{e} (the {records:,} records before it were produced)") from None
        raise
    except KeyboardInterrupt:
        guard.close()
        raise Interrupted(
            f"interrupted: {records:,} records of {src.name} were produced to topic "
            f"{topic!r} (after the {skip:,} skipped); to go on, produce it again with "
            f"--skip {skip + records}") from None
    guard.close()
    for name in sorted(absent) if records else ():
        log.warning("no record of %s holds column %r of topic %r: stored as nulls", src.name,
                    name, topic)
    seconds = time.perf_counter() - started
    return {"topic": topic, "file": src.name, "format": fmt, "records": records, "bytes": size,
            "partitions": {str(p): n for p, n in sorted(by_partition.items())},
            "seconds": round(seconds, 3),
            "records_per_second": round(records / seconds) if seconds > 0 else None,
            "latest": {str(p): o for p, o in t.latest_offsets().items()}}


__all__ = ["FORMATS", "Interrupted", "file_format", "fit", "produce"]
