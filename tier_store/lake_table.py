"""A topic incarnation's Delta Lake table, written with delta-rs (``deltalake``).

pafka writes the table's files itself (:mod:`tier_store.lake`) and commits them with one add
action each. Each commit carries an application transaction: app id
``pafka-<topic id>-<partition>``, version the last source segment's sequence + 1. What the
table holds is decided by its files, not by that version: a file is named by the source
segments it holds (:func:`tier_store.lake.file_rel`), and Delta keys files by path, so a
file is added at most once whoever commits it, and demotions may go in any order. Commits
racing each other are rebased by delta-rs (appends do not conflict).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import posixpath
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa

from .errors import PafkaError
from .lake import (
    OFFSET,
    PARTITION,
    TIMESTAMP,
    LakeFile,
    add_stats,
    parse_rel,
    table_name,
    table_schema,
)
from .stats import domain

log = logging.getLogger(__name__)


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError:
        raise PafkaError("a LAKE tier needs the deltalake package: pip install "
                         "'pafka-spark[lake]'") from None
    return deltalake


F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """One call at a time on a table handle: the service's threads share it, and a delta-rs
    table object is not to be used by two threads at once."""
    @functools.wraps(method)
    def run(self: LakeTable, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


def app_id(topic_id: str, partition: int) -> str:
    """The Delta application id of a partition's demotions."""
    return f"pafka-{topic_id}-{partition}"


STATS_KEY = "delta.dataSkippingStatsColumns"
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def stats_columns(schema: pa.Schema) -> str:
    """The columns whose statistics the table's add actions hold (Delta's table property):
    the lake's two, then the topic's orderable columns (of plain names)."""
    names = [f.name for f in schema if domain(f.type) is not None and
             _PLAIN_NAME.fullmatch(f.name) and f.name not in (OFFSET, TIMESTAMP, PARTITION)]
    return ",".join([OFFSET, TIMESTAMP, *names])


class LakeTable:
    """The Delta table of one topic incarnation under a lake root (a directory or URL)."""

    def __init__(self, root: str, topic: str, topic_id: str, schema: pa.Schema,
                 storage_options: dict[str, str] | None = None):
        self.topic, self.topic_id = topic, topic_id
        self.uri = posixpath.join(root.rstrip("/"), table_name(topic, topic_id))
        self.schema = table_schema(schema)
        self.storage_options = storage_options
        self._dt: Any = None
        self._lock = threading.RLock()
        # The table's files by partition and (first, last) source sequence, as of version
        # _files_at: kept up to date from the commits after it, not from the whole table.
        self._files: dict[int, dict[tuple[int, int], str]] | None = None
        self._files_at = -1
        self.loads = 0  # full loads of the table's state and of its files' list (tests count)
        self.retention_checked = -math.inf  # time.monotonic() of lake retention's last look
        self._evolved: pa.Schema | None = None  # the topic schema evolve() last applied

    def __repr__(self) -> str:
        return f"LakeTable({self.uri!r})"

    def _open(self, create: bool = False) -> Any:
        """The table, loaded once per handle and brought up to date incrementally after (a
        load reads every file's add action: a demotion asks three times)."""
        dl = _deltalake()
        if self._dt is not None:
            try:
                self._dt.update_incremental()
                return self._dt
            except Exception as e:  # noqa: BLE001 - a fresh load below says what is wrong
                # A kept handle that failed once (an object store's error) is not trusted
                # again: loaded afresh, as without the cache.
                log.info("%s: the kept table handle failed to update (%s); loading it again",
                         self, e)
                self._dt, self._files = None, None
        try:
            self._dt = dl.DeltaTable(self.uri, storage_options=self.storage_options)
            self.loads += 1
            return self._dt
        except dl.exceptions.TableNotFoundError:
            if not create:
                return None
        self._dt = dl.DeltaTable.create(
            self.uri, self.schema, mode="ignore", partition_by=[PARTITION],
            name=self.topic, description=f"pafka topic {self.topic!r} ({self.topic_id})",
            configuration={"delta.dataSkippingStatsColumns": stats_columns(self.schema)},
            storage_options=self.storage_options)
        return self._dt

    @_locked
    def held(self, partition: int) -> dict[tuple[int, int], str]:
        """The files of ``partition`` the table holds, by (first, last) source sequence."""
        dt = self._open()
        if dt is None:
            return {}
        version = int(dt.version())
        if self._files is not None and self._files_at <= version:
            try:  # the commits since the last look: a demotion's cost stays flat in files
                for v in range(self._files_at + 1, version + 1):
                    self._apply_commit(_read_commit(self.uri, v))
                self._files_at = version
                return dict(self._files.get(partition, {}))
            except (OSError, ValueError, TypeError, AttributeError) as e:
                log.info("%s: commits after version %d not read (%s): the files' list is read "
                         "whole", self, self._files_at, e)
        self._files, self._files_at = {}, version
        self.loads += 1
        for path in pa.table(dt.get_add_actions(flatten=False)).column("path").to_pylist():
            self._file(path, True)
        return dict(self._files.get(partition, {}))

    def _apply_commit(self, text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                action = json.loads(line)
                for kind in ("add", "remove"):
                    if kind in action:
                        self._file(urllib.parse.unquote(action[kind]["path"]), kind == "add")

    def _file(self, path: str, added: bool) -> None:
        got = parse_rel(path)
        if got is None or self._files is None:
            return  # not a file pafka wrote: not one a demotion looks for
        files = self._files.setdefault(got[0], {})
        if added:
            files[(got[1], got[2])] = path
        else:
            files.pop((got[1], got[2]), None)

    @_locked
    def committed_version(self, partition: int) -> int:
        """The transaction version of ``partition``'s last demotion (its last segment's
        sequence + 1); 0 if none (or no table yet)."""
        dt = self._open()
        if dt is None:
            return 0
        return dt.transaction_version(app_id(self.topic_id, partition)) or 0

    @_locked
    def summary(self) -> dict[str, Any]:
        """The table as ``pafka describe`` and ``pafka tiers`` show it: where it is, its
        version, and its files, rows and bytes (from the Delta log: no data file is read)."""
        dt = self._open()
        out: dict[str, Any] = {"table": self.uri, "version": -1, "files": 0, "rows": 0,
                               "bytes": 0}
        if dt is None:
            return out
        adds = pa.table(dt.get_add_actions(flatten=True))
        out.update(version=int(dt.version()), files=adds.num_rows,
                   rows=sum(adds.column("num_records").to_pylist()),
                   bytes=sum(adds.column("size_bytes").to_pylist()))
        return out

    @_locked
    def expired_ends(self, cutoff_ms: int) -> dict[int, int]:
        """Per partition, the offset below which every file's rows were committed before
        ``cutoff_ms``: the end of its oldest run of such files (partitions without one are
        left out). From the Delta log's statistics: no data file is read."""
        dt = self._open()
        if dt is None:
            return {}
        self.loads += 1
        adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        files: dict[int, list[tuple[int, int, int]]] = {}
        for p, lo, hi, ts in zip(adds["partition._partition"], adds["min._offset"],
                                 adds["max._offset"], adds["max._timestamp"], strict=True):
            if None in (lo, hi, ts):
                continue  # no statistics: never judged old
            files.setdefault(int(p), []).append((lo, hi, int(ts.timestamp() * 1000)))
        ends = {}
        for p, fs in files.items():
            # Files of interleaved writers overlap in offsets: the cut lies below every file
            # kept, so that no file is cut through (a rewrite would move rows the log names).
            end = min((lo for lo, _, ts in fs if ts >= cutoff_ms), default=None)
            while True:
                def goes(f: tuple[int, int, int], end: int | None = end) -> bool:
                    return f[2] < cutoff_ms and (end is None or f[1] < end)
                top = max((hi + 1 for f in fs if goes(f) for hi in (f[1],)), default=0)
                below = min((f[0] for f in fs if not goes(f)), default=top)
                if below >= top:
                    break
                end = below
            if top:
                ends[p] = top
        return ends

    @_locked
    def remove_below(self, ends: dict[int, int], vacuum_hours: int) -> int:
        """Remove the rows of each partition ``p`` below offset ``ends[p]`` (whole files, by
        :meth:`expired_ends`), then vacuum files unreferenced for ``vacuum_hours``. Returns
        the rows removed."""
        dt = self._open()
        if dt is None or not ends:
            return 0
        predicate = " OR ".join(f"({PARTITION} = {int(p)} AND _offset < {int(e)})"
                                for p, e in sorted(ends.items()))
        metrics = dt.delete(predicate)
        dt.vacuum(retention_hours=vacuum_hours, dry_run=False, enforce_retention_duration=False)
        return int(metrics.get("num_deleted_rows", 0) or 0)

    @_locked
    def evolve(self, topic_schema: pa.Schema) -> list[str]:
        """Make the table's schema the topic's ``topic_schema`` (an allowed evolution of the
        one it had): add the columns it lacks, nullable, and drop NOT NULL where the topic
        dropped it. Returns what it changed. A type cannot widen here (delta-rs has no type
        widening): :class:`PafkaError` naming the column. Files written before read the added
        columns as nulls, in every engine."""
        if self._evolved is not None and self._evolved.equals(topic_schema):
            return []  # this handle made it so already: a demotion asks each time
        self.schema = table_schema(topic_schema)
        dt = self._open()
        if dt is None:
            return []  # made with the topic's schema at the first demotion
        dl = _deltalake()
        have = {f.name: f for f in dt.schema().fields}  # Delta's types, not Arrow's
        done = []
        for f in topic_schema:
            held = have.get(f.name)
            want = dl.Schema.from_arrow(pa.schema([f.with_nullable(True)])).fields
            if held is None:
                dt.alter.add_columns(want)
                done.append(f"added {f.name}")
            elif str(held.type) != str(want[0].type):
                raise PafkaError(f"{self}: column {f.name!r} is {held.type} in the Delta table; "
                                 f"it cannot become {want[0].type} there (delta-rs has no type "
                                 "widening)")
            elif f.nullable and not held.nullable:
                dt.alter.drop_column_not_null(f.name)
                done.append(f"made {f.name} nullable")
        cols = stats_columns(self.schema)
        if any(d.startswith("added") for d in done) and \
                dt.metadata().configuration.get(STATS_KEY) not in (None, cols):
            dt.alter.set_table_properties({STATS_KEY: cols})  # readers skip by the new ones
        self._evolved = topic_schema
        return done

    @_locked
    def version(self) -> int:
        """The table's latest version (-1: no table yet)."""
        dt = self._open()
        return -1 if dt is None else int(dt.version())

    @_locked
    def add(self, partition: int, f: LakeFile, min_ts: int, max_ts: int, txn: int) -> int:
        """Commit file ``f`` (written already) of ``partition`` with transaction version
        ``txn``; returns the table version that added it. Delta keys files by path: a file
        the table holds already is not added again (a commit racing ours adds it at most once
        too, delta-rs rebasing ours on it)."""
        dl = _deltalake()
        from deltalake.transaction import AddAction, CommitProperties, Transaction
        dt = self._open(create=True)
        app = app_id(self.topic_id, partition)
        before = dt.version()
        action = AddAction(f.rel, f.size, {PARTITION: str(partition)}, int(time.time() * 1000),
                           True, add_stats(f, min_ts, max_ts, self.schema))
        try:
            dt.create_write_transaction(
                [action], mode="append", schema=self.schema, partition_by=[PARTITION],
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app, txn)]))
        except dl.exceptions.CommitFailedError as e:
            raise PafkaError(f"{self}: the commit of {f.rel} failed ({e}); the demotion is "
                             "tried again later") from None
        version = self._version_of(app, txn, before)
        self._persist(version)
        return version

    def _persist(self, version: int) -> None:
        """Make commit ``version`` durable on a local table before the move entry that relies
        on it is published: delta-rs renames it into place without an fsync."""
        from .layout import fsync_dir, fsync_file, is_url
        if is_url(self.uri):
            return  # an object store's completed PUT is durable
        log_dir = os.path.join(self.uri, "_delta_log")
        fsync_file(os.path.join(log_dir, f"{version:020d}.json"))
        fsync_dir(log_dir)

    def _version_of(self, app: str, end: int, after: int) -> int:
        """The version after ``after`` whose commit carries transaction (``app``, ``end``)."""
        dt = self._open()
        # delta-rs exposes no commit's actions: they are read from the log itself.
        for v in range(after + 1, dt.version() + 1):
            for line in _read_commit(self.uri, v).splitlines():
                txn = json.loads(line).get("txn") if line.strip() else None
                if txn and txn.get("appId") == app and txn.get("version") == end:
                    return v
        raise PafkaError(f"{self}: the commit of {app} version {end} is not in the log")


def _read_commit(uri: str, version: int) -> str:
    from .tiers.remote import filesystem
    fs, path = filesystem(uri)
    with fs.open(posixpath.join(path, "_delta_log", f"{version:020d}.json"), "rb") as f:
        return f.read().decode()


__all__ = ["LakeTable", "app_id"]
