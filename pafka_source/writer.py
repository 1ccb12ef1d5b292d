"""The ``pafka`` sink: executors append chunks durably, the driver commits them in one entry.

Exactly once for streaming: the commit records the writer id — Spark's persistent query id,
read on executors from ``sql.streaming.queryId`` and carried in the commit messages, or the
``writerId`` option — with the batch id; a batch replayed after a crash is acknowledged and
not appended again. ``abort`` never undoes a recorded commit: chunks of an aborted batch stay
invisible holes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tier_store import SEGMENT_HEADER_SIZE, ChunkRef, InvalidArgument, SchemaAdapter, Topic

from .handles import open_store
from .options import SinkOptions

log = logging.getLogger(__name__)

# Arrow batches of a task are gathered up to this size before they become chunks, or less:
# see chunk_target.
CHUNK_TARGET_BYTES = 32 * 1024 * 1024
# Room left in a segment for each chunk's IPC framing and alignment.
CHUNK_SLACK = 1 / 64
# Chunks handed to a task's writing thread and not yet written (each up to the size above).
IN_FLIGHT = 2

# glibc's malloc settings for a writing Python worker: see keep_freed_memory.
MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
MALLOC_TRIM_THRESHOLD = 256 * 1024 * 1024
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_malloc_kept: bool | None = None

def keep_freed_memory() -> bool:
    """Let glibc keep memory this process frees for its next allocations (once per process).

    A writing task holds up to a few hundred MB of Spark's Arrow batches while they become
    chunks. By default glibc gives memory that much freed back to the kernel (it trims the top
    of its heaps past twice its adaptive mmap threshold), so the next batches read from Spark's
    socket land on pages the kernel must fault in and zero again: about 90,000 faults and 6% of
    the sink's time per 10M rows of 120 bytes measured here. Buffers of up to
    ``MALLOC_MMAP_THRESHOLD`` then come from the heap, and up to ``MALLOC_TRIM_THRESHOLD`` free
    at its top stays there. Left alone where malloc is not glibc's or the process was started
    with malloc settings of its own (``GLIBC_TUNABLES``, ``MALLOC_*_``). Returns whether the
    settings were applied."""
    global _malloc_kept
    if _malloc_kept is not None:
        return _malloc_kept
    _malloc_kept = False
    own = any(k.startswith("MALLOC_") and k.endswith("_") for k in os.environ) or \
        "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
    if own or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # The mmap threshold first: setting either one ends glibc's adaptive thresholds.
    _malloc_kept = bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
                        and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))
    log.debug("glibc malloc keeps freed memory in this worker: %s", _malloc_kept)
    return _malloc_kept


# How often a writing process frees its host's tier 1 on a shared store, at most.
EVICT_EVERY_S = 10.0


def _evict_here(topic: Topic) -> None:
    """On a store shared by many hosts, free this host's tier 1 after a task wrote to it
    (each host evicts its own files; the driver cannot). Never fails the task."""
    try:
        done = topic.store.evict_local(every=EVICT_EVERY_S)  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 (logged: the chunks are written and shared)
        log.warning("topic %s: freeing this host's tier 1 failed: %s", topic.name, e)
        return
    if done is not None:
        log.debug("topic %s: tier 1 of this host: %s", topic.name, done)


@dataclass
class PafkaCommitMessage(WriterCommitMessage):
    """What one task wrote: its chunks (not yet visible), the writer id and batch id."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    writer_id: str | None = None
    batch_id: int | None = None
    records: int = 0


def chunk_target(segment_bytes: int) -> int:
    """Bytes of Arrow data gathered into one chunk: at most CHUNK_TARGET_BYTES, and small
    enough that two chunks fit in one segment (a chunk just over half a segment would fill
    one alone, and every chunk would cost a segment roll)."""
    room = (segment_bytes - SEGMENT_HEADER_SIZE) // 2
    return max(1, min(CHUNK_TARGET_BYTES, int(room * (1 - CHUNK_SLACK))))


class _ChunkWriting:
    """A task's chunks, combined and written on one thread of their own, in order.

    Spark's JVM blocks as soon as the task stops reading its batches; written inline, every
    wait for the page cache or the device (direct I/O) held it up. At most ``IN_FLIGHT``
    chunks wait, so memory stays bounded; the first error is raised in the task."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pafka-sink")
        self._futures: list[Future[list[ChunkRef]]] = []

    def submit(self, job: Callable[[], list[ChunkRef]]) -> None:
        waiting = [f for f in self._futures if not f.done()]
        if len(waiting) >= IN_FLIGHT:
            wait(waiting, return_when=FIRST_COMPLETED)
        for f in self._futures:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        self._futures.append(self._pool.submit(job))

    def refs(self) -> list[ChunkRef]:
        """Every chunk written, in the order submitted (waits for the last)."""
        return [r for f in self._futures for r in f.result()]

    def close(self) -> None:
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True)


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
        keep_freed_memory()
        topic = self._topic()
        writing = _ChunkWriting()
        try:
            records = self._write(iterator, topic, task + (batch_id or 0), writing)
            refs = writing.refs()
        finally:
            writing.close()
        # One flush per segment touched, before the driver may make the chunks visible:
        # flushing each chunk as it is written stalls the task on the device.
        topic.sync()
        # On a store shared by many hosts: one object on the shared tier holds every chunk
        # of this task, so a committed batch survives the loss of this host.
        refs = topic.share(refs)
        _evict_here(topic)
        return PafkaCommitMessage([r.to_dict() for r in refs],
                                  self.opts.writer_id or query_id, batch_id, records)

    def _write(self, iterator: Iterator[pa.RecordBatch], topic: Topic, turn: int,
               writing: _ChunkWriting) -> int:
        # Without a key, each Arrow batch is sliced (zero-copy) over all partitions in turn,
        # so that even one task fills every partition; slices bound for one partition are
        # gathered into chunks of up to chunk_target(). With a key, the store routes rows.
        pending: dict[int | None, list[pa.RecordBatch]] = {}
        sizes: dict[int | None, int] = {}
        records = 0
        target = chunk_target(topic.store.config["log.segment.bytes"])
        # Partitions fill at one rate, so chunks of equal size would come due together and
        # queue up behind the writing thread while Spark waits; the first chunk of the i-th
        # of k partitions is cut at (i+1)/k of the target, and one comes due at a time.
        limits: dict[int | None, int] = {}
        spread = 1 if self.opts.key is not None else topic.partitions

        adapted: list[SchemaAdapter] = []  # the last one made (a task's batches share one)

        def write(p: int | None, batches: list[pa.RecordBatch]) -> list[ChunkRef]:
            # The store joins the slices into one record batch per chunk as it writes them,
            # without a copy: readers then hand Spark a few big batches instead of many
            # slices of Spark's 10,000-row ones.
            if self.opts.merge_schema and \
                    not batches[0].schema.equals(self.topic_schema, check_metadata=False):
                # mergeSchema: the topic's columns the DataFrame lacks are written as nulls.
                if not adapted or not adapted[0].source.equals(batches[0].schema):
                    adapted[:] = [SchemaAdapter(batches[0].schema, self.topic_schema)]
                batches = [adapted[0](b) for b in batches]
            table = pa.Table.from_batches(batches)
            return topic.write_chunks(table, partition=p, key=self.opts.key,
                                      timestamp_column=self.opts.timestamp_column,
                                      durable=False)

        def flush(p: int | None) -> None:
            batches = pending.pop(p, [])
            sizes.pop(p, None)
            limits[p] = target
            if batches:
                writing.submit(lambda: write(p, batches))

        def add(p: int | None, batch: pa.RecordBatch) -> None:
            size = batch.nbytes
            limit = limits.get(p)
            if limit is None:
                limit = limits[p] = max(1, target * (len(limits) % spread + 1) // spread)
            if p in sizes and sizes[p] + size > limit:
                flush(p)
            pending.setdefault(p, []).append(batch)
            sizes[p] = sizes.get(p, 0) + size

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
        return records

    def _commit(self, messages: list[PafkaCommitMessage | None], batch_id: int | None) -> None:
        msgs = [m for m in messages if m is not None]
        refs = [ChunkRef.from_dict(d) for m in msgs for d in m.chunks]
        writer_id = self.opts.writer_id or next((m.writer_id for m in msgs if m.writer_id), None)
        topic = self._topic()
        if batch_id is not None and writer_id is None:
            raise InvalidArgument("cannot commit a streaming batch without a writer id: set the "
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
