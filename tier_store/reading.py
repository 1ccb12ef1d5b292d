"""Reading: plan on one side (where the commit log is loaded), execute anywhere.

:meth:`Topic.plan_read` turns ``[start, end)`` of a partition into a :class:`ReadPlan`: the
chunks' files, byte ranges, offsets and commit times. A plan is small and picklable, so a
Spark driver can plan and an executor can execute without loading the commit log at all.
:func:`execute` memory-maps the files (ranged reads on a remote tier) and yields Arrow
record batches sliced exactly at the range. If a file is gone (the segment moved since
planning), it opens the store, plans again once, and goes on; a file still missing then is
:class:`DataLoss`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pyarrow as pa

from .chunk import checksum
from .chunk_decoder import ChunkDecoder
from .errors import CorruptSegment, DataLoss, TopicDeleted, TopicNotFound
from .ids import host_id
from .layout import is_url
from .pins import MAPS, pin_read

log = logging.getLogger(__name__)


@dataclass(slots=True)  # not frozen: a plan holds one per chunk, and frozen inits are slow
class PlannedChunk:
    """One committed chunk to read: file, byte range, offsets, commit time and checksum.
    Not changed once planned (``dataclasses.replace`` makes another).

    ``elsewhere`` names other copies of the same bytes, as (file, position) pairs: tried in
    order when ``path`` is missing or its bytes do not match the checksum (a shared tier's
    copy). ``host``, on a store shared by many hosts, names the host whose tier holds
    ``path``: elsewhere, ``path`` is not read at all."""

    path: str
    pos: int
    length: int
    base: int
    records: int
    timestamp: int
    checksum: int
    elsewhere: tuple[tuple[str, int], ...] = ()
    host: str | None = None
    lake: LakePart | None = None  # a row group of a lake file, not a chunk of a segment


class LakePart(NamedTuple):
    """What a read of a lake file's row group needs besides its range: the file's size, its
    footer's range and xxh3-64 (checked before Parquet sees it), and the topic's schema."""

    size: int
    footer_pos: int
    footer_length: int
    footer_checksum: int
    schema: pa.Schema


_LOCAL, _REMOTE = ("local_chunks", "local_bytes"), ("remote_chunks", "remote_bytes")


class ReadCounts:
    """Chunks and bytes this process read from a local tier and from elsewhere (a shared
    tier's copy, by ranged reads), since it started: how often reads found their data
    on the host that runs them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("local_chunks", "local_bytes", "remote_chunks",
                                      "remote_bytes"), 0)

    def add(self, local: bool, nbytes: int) -> None:
        """Count one chunk of ``nbytes`` read locally (``local``) or from elsewhere."""
        chunks, size = _LOCAL if local else _REMOTE
        with self._lock:
            self._counts[chunks] += 1
            self._counts[size] += nbytes

    def snapshot(self) -> dict[str, int]:
        """The counts so far, as a dict (``local_chunks``, ``local_bytes``,
        ``remote_chunks``, ``remote_bytes``)."""
        with self._lock:
            return dict(self._counts)


READS = ReadCounts()


def read_counts() -> dict[str, int]:
    """Chunks and bytes this process has read from a local tier and from elsewhere."""
    return READS.snapshot()


@dataclass(slots=True)  # not frozen (a driver makes one per partition per batch): as above
class ReadPlan:
    """What to read for ``[start, end)`` of one partition (picklable). Not changed once
    planned."""

    root: str
    topic: str
    partition: int
    start: int
    end: int
    chunks: tuple[PlannedChunk, ...]
    topic_id: str = ""  # the incarnation planned against
    # The topic's schema when planned: every chunk is read as it (older ones adapted).
    schema: pa.Schema | None = None
    columns: tuple[str, ...] | None = None  # only these (checked against ``schema``)

    @property
    def records(self) -> int:
        return self.end - self.start

    @property
    def bytes(self) -> int:
        return sum(c.length for c in self.chunks)


class PlannedBatch(NamedTuple):
    """A batch read by a plan: the records, the offset of its first row, its commit time.
    A named tuple: one per chunk read, and a frozen dataclass's init costs more."""

    batch: pa.RecordBatch
    offset: int
    timestamp: int


# Opens the plan's topic again: set by the store module, which sits above this one (the
# store calls the reader, never the reverse).
_open_topic: Callable[[str, str], Any] | None = None


def use_topic_opener(opener: Callable[[str, str], Any]) -> None:
    """Set how a plan's topic is opened to re-plan it: ``opener(root, topic)`` returns a
    handle with ``id`` and ``plan_read``, or raises :class:`TopicNotFound`."""
    global _open_topic
    _open_topic = opener


def _replan(plan: ReadPlan, start: int, c: PlannedChunk) -> ReadPlan:
    """``[start, plan.end)`` of the plan's partition planned again from the log: the same
    incarnation of the topic, or :class:`TopicDeleted`."""
    if _open_topic is None:
        raise DataLoss(f"topic {plan.topic!r} partition {plan.partition}: offsets {c.base}.."
                       f"{plan.end - 1} moved while being read, and no store is loaded to "
                       "plan the read again")
    try:
        topic = _open_topic(plan.root, plan.topic)
    except TopicNotFound:
        topic = None
    if topic is None or (plan.topic_id and topic.id != plan.topic_id):
        raise TopicDeleted(
            f"topic {plan.topic!r} partition {plan.partition}: offsets {c.base}.."
            f"{plan.end - 1} cannot be read, the topic was deleted"
            + (" and created again" if topic is not None else ""))
    plan_read: Callable[[int, int, int], ReadPlan] = topic.plan_read
    again = plan_read(plan.partition, start, plan.end)
    again.schema, again.columns = plan.schema, plan.columns  # its offsets are in that schema
    return again


def read_range(path: str, pos: int, length: int) -> pa.Buffer:
    """A chunk's bytes: a slice of a memory map on a local tier, a ranged read on a remote
    one (an fsspec URL). Raises FileNotFoundError when the file is gone."""
    if is_url(path):
        from .tiers.remote import read_range as remote_range
        return remote_range(path, pos, length)
    return MAPS.slice(path, pos, length)


# Told of each chunk a read skips as corrupt: the error, and the offsets [first, end) skipped.
SkipCorrupt = Callable[[CorruptSegment, int, int], None]


def skip_warning(who: str, then: Callable[[int], None] | None = None) -> SkipCorrupt:
    """A :data:`SkipCorrupt` that logs a warning naming the offsets ``who`` skips (and the
    error), then calls ``then(end)``: where reading goes on."""

    def skip(error: CorruptSegment, first: int, end: int) -> None:
        log.warning("%s skips offsets [%d, %d), a corrupt chunk: %s", who, first, end, error)
        if then is not None:
            then(end)

    return skip


def execute(plan: ReadPlan, verify: bool = True, replan: bool = True,
            skip_corrupt: SkipCorrupt | None = None) -> Iterator[PlannedBatch]:
    """Yield the plan's records as Arrow batches, zero-copy from memory-mapped chunks.

    With ``verify`` (the default) each chunk's checksum is checked before Arrow sees its
    bytes (:class:`CorruptSegment`); ``verify=False`` trusts the bytes, and a damaged chunk
    may then give wrong rows or crash the process.

    A segment may move (and on a pool tier its file be reused) between planning and reading:
    a file gone, or a chunk whose checksum does not match where the plan put it, makes the
    rest of the plan be planned again from the log, as often as the read has moved on since
    the last time; a file still missing then is :class:`DataLoss`, a chunk still not matching
    :class:`CorruptSegment`.

    With ``skip_corrupt``, a chunk that is :class:`CorruptSegment` (its checksum, its
    bytes, its record count) is not an error: ``skip_corrupt(error, first, end)`` is told
    the offsets skipped, and the read goes on with the next chunk, as a Kafka consumer seeks
    past a corrupt record. A missing file is still :class:`DataLoss`."""
    yield from _execute(plan, verify, -1 if replan else None, skip_corrupt)


def _read_elsewhere(c: PlannedChunk, verify: bool) -> tuple[pa.Buffer | None, bool]:
    """The chunk's bytes from the first of its other copies that has them (None if none),
    and whether a copy was found that does not match the checksum."""
    mismatch = False
    for path, pos in c.elsewhere:
        try:
            buf = read_range(path, pos, c.length)
        except FileNotFoundError:
            continue
        if not verify or checksum(buf) == c.checksum:
            return buf, mismatch
        mismatch = True
    return None, mismatch


def _execute(plan: ReadPlan, verify: bool, replanned_at: int | None,
             skip_corrupt: SkipCorrupt | None) -> Iterator[PlannedBatch]:
    """:func:`execute`; ``replanned_at`` is the offset of the last re-planning (-1 none yet),
    None when re-planning is off."""
    at_offset = plan.start
    decoder = ChunkDecoder(check=verify, key=plan.topic_id, target=plan.schema,
                           columns=plan.columns)
    # How far the plan reads into each local file: its mapping must reach that far, and the
    # file must still be that long when it is mapped (a file truncated from outside the store
    # is CorruptSegment then; truncated later, under the mapping, it may kill the process).
    # A file's chunks come in the order of their positions: its last one reaches farthest.
    # One pass, no comprehension: a fresh reader of many partitions plans one chunk each.
    reach: dict[str, int] = {}
    hosted = False
    for c in plan.chunks:
        if c.lake is None:
            reach[c.path] = c.pos + c.length
        hosted = hosted or c.host is not None
    local_paths = {path for path in reach if not is_url(path)} if reach else set()
    if local_paths:
        # This partition's segments the plan no longer names (moved, merged, deleted) are
        # unpinned now rather than when they go idle. Every local path of a plan is a file
        # of its partition (<tier>/<topic>/<p>/<seq>.seg).
        MAPS.forget(local_paths, {(plan.topic, str(plan.partition))})
    # The bytes of the segment being read (path, buffer, the file position it starts at):
    # its next chunks are sliced from it. A mapping pins its file, so the file is never
    # reused while we read it; a small read copies the plan's bytes of a file not mapped.
    mapped: tuple[str, pa.Buffer, int] | None = None
    here = host_id() if hosted else None
    # Per lake file read: its mapping (a local one) and its footer, fetched once.
    lake_files: dict[str, tuple[pa.Buffer | None, pa.Buffer]] = {}
    for c in plan.chunks:
        if c.lake is not None:
            at_offset = yield from _read_lake(plan, c, lake_files, at_offset, skip_corrupt)
            continue
        stale: str | None = None  # why the plan may no longer describe this chunk
        local = not is_url(c.path)
        try:
            if c.host is not None and c.host != here:
                # Another host's tier: the same path here is some other file, or none.
                raise FileNotFoundError(c.path)
            if mapped is not None and mapped[0] == c.path and mapped[2] <= c.pos and \
                    c.pos + c.length <= mapped[2] + mapped[1].size:
                buf = mapped[1].slice(c.pos - mapped[2], c.length)
            elif not local:
                buf = read_range(c.path, c.pos, c.length)
            else:
                need = max(reach[c.path], c.pos + c.length) - c.pos
                hit = MAPS.cached(c.path, c.pos, need)
                if hit is None and need <= MAPS.copy_bytes:
                    mapped = (c.path, pin_read(c.path, c.pos, need), c.pos)
                else:
                    mapped = (c.path, MAPS.whole(c.path, c.pos, need) if hit is None else hit, 0)
                buf = mapped[1].slice(c.pos - mapped[2], c.length)
        except FileNotFoundError:
            stale = "missing"
        else:
            # A host's own copy is a cache: always checked, as another file may hold its
            # name (a tier 1 wiped and written again).
            if (verify or c.host is not None) and checksum(buf) != c.checksum:
                stale = "checksum"
        if stale is not None and c.elsewhere:
            buf, mismatch = _read_elsewhere(c, verify)
            if buf is not None:
                stale, local = None, False
            elif mismatch:
                stale = "checksum"
        if stale is None:
            READS.add(local, c.length)
        if stale is not None:
            start = max(at_offset, c.base)
            if replanned_at is None or start <= replanned_at:
                shared = "".join(f" and {u} at byte {at}" for u, at in c.elsewhere)
                if stale == "missing":
                    raise DataLoss(
                        f"topic {plan.topic!r} partition {plan.partition}: offsets {c.base}.."
                        f"{c.base + c.records - 1} are in {c.path}{shared}, "
                        f"{'each' if shared else 'which is'} missing")
                bad = CorruptSegment(
                    f"topic {plan.topic!r} partition {plan.partition}: chunk with offsets "
                    f"[{c.base}, {c.base + c.records}) in {c.path}{shared} does not match its "
                    "checksum")
                if skip_corrupt is None:
                    raise bad
                at_offset = _skip(plan, c, bad, skip_corrupt)
                continue
            yield from _execute(_replan(plan, start, c), verify, start, skip_corrupt)
            return

        def where(c: PlannedChunk = c) -> str:
            return (f"topic {plan.topic!r} partition {plan.partition}: offsets "
                    f"[{c.base}, {c.base + c.records}) in {c.path}")

        try:
            batches = decoder.batches(buf, where)
            rows = batches[0].num_rows if len(batches) == 1 else \
                sum(b.num_rows for b in batches)
            if rows != c.records:
                raise CorruptSegment(f"{where()}: the chunk holds {rows} records, its commit "
                                     f"recorded {c.records}")
        except CorruptSegment as e:
            if skip_corrupt is None:
                raise
            at_offset = _skip(plan, c, e, skip_corrupt)
            continue
        row = c.base
        for batch in batches:
            b0, b1 = row, row + batch.num_rows
            row = b1
            lo, hi = max(plan.start, b0), min(plan.end, b1)
            if lo < hi:
                out = batch if (lo, hi) == (b0, b1) else batch.slice(lo - b0, hi - lo)
                yield PlannedBatch(out, lo, c.timestamp)
                at_offset = hi


def _read_lake(plan: ReadPlan, c: PlannedChunk,
               files: dict[str, tuple[pa.Buffer | None, pa.Buffer]], at_offset: int,
               skip_corrupt: SkipCorrupt | None) -> Generator[PlannedBatch, None, int]:
    """Yield the plan's records in lake row group ``c``, checked as
    :func:`tier_store.lake.decode_groups` does (always: a lake read is never unverified);
    returns the offset reading goes on from. A lake file never moves: a missing one is
    :class:`DataLoss` at once."""
    from .lake import LakeFile, LakeGroup, decode_timed
    lake = c.lake
    assert lake is not None
    where = (f"topic {plan.topic!r} partition {plan.partition}: offsets [{c.base}, "
             f"{c.base + c.records}) in {c.path}")
    try:
        if c.pos + c.length > lake.footer_pos:
            raise CorruptSegment(f"{where}: the log names a row group past the file's footer")
        # A local file is mapped whole (what a plan reads of it stays mapped, as a segment's
        # does) and Parquet reads the mapping natively; a remote one, only the ranges needed.
        got = files.get(c.path)
        if got is None:
            whole = None if is_url(c.path) else read_range(c.path, 0, lake.size)
            footer = whole.slice(lake.footer_pos, lake.footer_length) if whole is not None \
                else read_range(c.path, lake.footer_pos, lake.footer_length)
            got = files[c.path] = (whole, footer)
        whole, footer = got
        data = whole.slice(c.pos, c.length) if whole is not None else \
            read_range(c.path, c.pos, c.length)
        group = LakeGroup(c.pos, c.length, c.base, c.records, c.checksum, c.timestamp)
        f = LakeFile("", lake.size, lake.footer_pos, lake.footer_length, lake.footer_checksum,
                     (group,))
        timed = decode_timed(where, f, footer, [(group, data)], plan.schema or lake.schema,
                             plan.columns, whole=whole)
    except FileNotFoundError:
        raise DataLoss(f"{where}, which is missing from the lake table") from None
    except CorruptSegment as e:
        if skip_corrupt is None:
            raise
        return _skip(plan, c, e, skip_corrupt)
    READS.add(not is_url(c.path), c.length)
    row = c.base
    for batch, ts in timed:
        b0, b1 = row, row + batch.num_rows
        row = b1
        lo, hi = max(plan.start, b0), min(plan.end, b1)
        if lo < hi:
            yield PlannedBatch(batch if (lo, hi) == (b0, b1) else batch.slice(lo - b0, hi - lo),
                               lo, ts)
            at_offset = hi
    return at_offset


def _skip(plan: ReadPlan, c: PlannedChunk, error: CorruptSegment, tell: SkipCorrupt) -> int:
    """Skip chunk ``c`` of ``plan`` as corrupt: tell which of the plan's offsets are skipped,
    and return the offset reading goes on from."""
    first, end = max(plan.start, c.base), min(plan.end, c.base + c.records)
    tell(error, first, end)
    return end
