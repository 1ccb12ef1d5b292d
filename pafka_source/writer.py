"""The ``pafka`` sink: executors append chunks durably, the driver commits them in one entry.

Exactly once for streaming: the commit records the writer id — Spark's persistent query id,
read on executors from ``sql.streaming.queryId`` and carried in the commit messages, or the
``writerId`` option — with the batch id; a batch replayed after a crash is acknowledged and
not appended again. ``abort`` never undoes a recorded commit: chunks of an aborted batch stay
invisible holes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tier_store import ChunkRef, PafkaError, Store, Topic
from tier_store.layout import STORE_FILE

from .options import SinkOptions

log = logging.getLogger(__name__)

# Arrow batches of a task are gathered up to this size before they become chunks.
CHUNK_TARGET_BYTES = 32 * 1024 * 1024

_stores: dict[tuple[str, str], tuple[tuple[int, int] | None, Store]] = {}
_stores_lock = threading.Lock()


def _identity(root: str) -> tuple[int, int] | None:
    try:
        st = os.stat(os.path.join(root, STORE_FILE))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def open_store(root: str, config: dict[str, Any]) -> Store:
    """One store handle per root and config in each process (Python workers are reused).

    A handle is reused only while the store's ``_store.json`` is the same file: a store
    deleted and created again under the same root gets a fresh handle."""
    key = (root, json.dumps(config, sort_keys=True, default=str))
    with _stores_lock:
        cached = _stores.get(key)
        ident = _identity(root)
        if cached is not None and cached[0] == ident and ident is not None:
            return cached[1]
        s = Store.open(root, config or None)
        _stores[key] = (_identity(root), s)
        return s


@dataclass
class PafkaCommitMessage(WriterCommitMessage):
    """What one task wrote: its chunks (not yet visible), the writer id and batch id."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    writer_id: str | None = None
    batch_id: int | None = None
    records: int = 0


class _Writing:
    def __init__(self, opts: SinkOptions, schema: pa.Schema, partitions: int):
        self.opts = opts
        self.topic_schema = schema
        self.partitions = partitions

    def _topic(self) -> Topic:
        return open_store(self.opts.root, self.opts.config).topic(self.opts.topic)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PafkaCommitMessage:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx is not None else 0
        query_id = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch_prop = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        batch_id = int(batch_prop) if batch_prop is not None else None
        topic = self._topic()
        refs: list[ChunkRef] = []
        # Without a key, each Arrow batch is sliced (zero-copy) over all partitions in turn,
        # so that even one task fills every partition; slices bound for one partition are
        # gathered into chunks of up to CHUNK_TARGET_BYTES. With a key, the store routes rows.
        pending: dict[int | None, list[pa.RecordBatch]] = {}
        sizes: dict[int | None, int] = {}
        records = 0
        turn = task + (batch_id or 0)

        def flush(p: int | None) -> None:
            batches = pending.pop(p, [])
            sizes.pop(p, None)
            if batches:
                # One record batch per chunk: readers then hand Spark a few big batches
                # instead of many slices of Spark's 10,000-row ones (a copy here, at memory
                # speed, saves per-batch overhead on every read).
                table = pa.Table.from_batches(batches).combine_chunks()
                refs.extend(topic.write_chunks(table, partition=p,
                                               key=self.opts.key,
                                               timestamp_column=self.opts.timestamp_column,
                                               durable=False))

        def add(p: int | None, batch: pa.RecordBatch) -> None:
            pending.setdefault(p, []).append(batch)
            sizes[p] = sizes.get(p, 0) + batch.nbytes
            if sizes[p] >= CHUNK_TARGET_BYTES:
                flush(p)

        for batch in iterator:
            n = batch.num_rows
            if n == 0:
                continue
            records += n
            if self.opts.key is not None:
                add(None, batch)
                continue
            k = min(topic.partitions, n)
            at = 0
            for j in range(k):
                rows = n // k + (1 if j < n % k else 0)
                add((turn + j) % topic.partitions, batch.slice(at, rows))
                at += rows
            turn += k
        for p in list(pending):
            flush(p)
        # One flush per segment touched, before the driver may make the chunks visible:
        # flushing each chunk as it is written stalls the task on the device.
        topic.sync()
        return PafkaCommitMessage([r.to_dict() for r in refs],
                                  self.opts.writer_id or query_id, batch_id, records)

    def _commit(self, messages: list[PafkaCommitMessage | None], batch_id: int | None) -> None:
        msgs = [m for m in messages if m is not None]
        refs = [ChunkRef.from_dict(d) for m in msgs for d in m.chunks]
        writer_id = self.opts.writer_id or next((m.writer_id for m in msgs if m.writer_id), None)
        topic = self._topic()
        if batch_id is not None and writer_id is None:
            raise PafkaError("cannot commit a streaming batch without a writer id: set the "
                             "'writerId' option")
        if not refs:
            return
        res = topic.commit(refs, writer_id=writer_id if batch_id is not None else None,
                           batch_id=batch_id)
        log.info("topic %s: batch %s committed %d records in %d chunks%s", topic.name, batch_id,
                 sum(r.records for r in res), len(refs), "" if res else " (a replay: skipped)")

    def _abort(self, messages: list[PafkaCommitMessage | None], batch_id: int | None) -> None:
        n = sum(len(m.chunks) for m in messages if m is not None)
        log.warning("topic %s: batch %s aborted; its %d written chunks stay invisible",
                    self.opts.topic, batch_id, n)


class PafkaBatchWriter(_Writing, DataSourceArrowWriter):
    """``df.write.format("pafka").mode("append")``: one atomic append of the whole write."""

    def commit(self, messages: list[PafkaCommitMessage | None]) -> None:  # type: ignore[override]
        self._commit(messages, None)

    def abort(self, messages: list[PafkaCommitMessage | None]) -> None:  # type: ignore[override]
        self._abort(messages, None)


class PafkaStreamWriter(_Writing, DataSourceStreamArrowWriter):
    """``df.writeStream.format("pafka")``: one commit-log entry per micro-batch, exactly once."""

    def commit(self, messages: list[PafkaCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._commit(messages, batchId)

    def abort(self, messages: list[PafkaCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._abort(messages, batchId)
