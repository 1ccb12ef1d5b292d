"""Read-only views of a topic's state: read plans, segment listings, byte and time lookups.

Each is a function of the state (and, for paths and headers, the tiers), so that the
topic handle stays a thin façade and the views can be tested on a state alone.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DataLoss
from .ids import bundle_text
from .layout import SEGMENT_SUFFIX, topic_dir
from .partition import is_settled
from .reading import LakePart, PlannedChunk, ReadPlan
from .records import SegmentInfo
from .state import PartitionState, SegmentState, TopicState
from .stats import ChunkFilter
from .tiers import Tier, space

if TYPE_CHECKING:
    from .host import TopicHost


def planned_chunks(topic: str, st: TopicState, p: int, start: int, end: int | None,
                   path_of: Callable[[int, int, int], str],
                   bundle_url: Callable[[str], str] | None = None,
                   keep: ChunkFilter | None = None) -> tuple[int, list[PlannedChunk]]:
    """The chunks holding ``[start, end)`` of partition ``p`` (``end=None``: to the latest)
    and where the range really stops; ``path_of(p, seq, tier)`` names a segment's file, and
    ``bundle_url(obj)`` a shared object's (on a store shared by many hosts). With ``keep``,
    only the chunks whose statistics may hold a row it passes.
    :class:`DataLoss` below the earliest retained offset."""
    part = st.part(p)
    earliest, latest = part.start_offset, part.next_offset
    if start < earliest:
        raise DataLoss(f"topic {topic!r} partition {p}: offsets [{start}, {earliest}) were "
                       f"deleted by retention; the earliest offset is {earliest}")
    stop = latest if end is None else max(start, min(end, latest))
    chunks: list[PlannedChunk] = []
    if start >= stop:
        return max(start, stop), chunks
    sel = part.chunks.overlapping(start, stop)  # reads only the pieces spanning them
    segs = part.segments
    paths: dict[int, str] = {}  # a segment holds many chunks
    # One conversion for every field (rows are CHUNK_DTYPE tuples, in its field order).
    for seq, pos, length, base, n, crc, ts, _, _, hi, lo, opos, stats in sel.tolist():
        if keep is not None and not keep.keeps(stats, n, p):
            continue
        path = paths.get(seq)
        if path is None:
            path = paths[seq] = path_of(p, seq, segs[seq].tier)
        lake = segs[seq].lake
        if lake is not None:  # a row group of the segment's Parquet file
            chunks.append(PlannedChunk(path, pos, length, base, n, ts, crc, lake=LakePart(
                lake.size, lake.footer_pos, lake.footer_length, lake.footer_checksum,
                st.schema)))
        elif opos < 0 or bundle_url is None:
            chunks.append(PlannedChunk(path, pos, length, base, n, ts, crc))
        else:
            chunks.append(PlannedChunk(path, pos, length, base, n, ts, crc,
                                       ((bundle_url(bundle_text(hi, lo)), opos),),
                                       segs[seq].host))
    return stop, chunks


def read_plans(store: TopicHost, topic: str, st: TopicState,
               ranges: list[tuple[int, int, int | None]], keep: ChunkFilter | None = None
               ) -> list[ReadPlan]:
    """The read plans of ``ranges`` (``(partition, start, end)``, checked) against ``st``
    (``keep``: of the chunks that may hold a row it passes)."""
    shared = store.shared
    bundle_url = None if shared is None else \
        (lambda obj: shared.bundle_url(topic, st.topic_id, obj))
    dirs: dict[int, str] = {}  # per tier, the topic's directory: joined once

    def path_of(p: int, seq: int, tier: int) -> str:
        t = store.tier(tier)
        if t.is_lake:
            seg = st.part(p).segments[seq]
            last = seg.lake.last_seq if seg.lake is not None else seq
            return t.file_path(topic, st.topic_id, p, seq, last)  # type: ignore[attr-defined]
        where = dirs.get(tier)
        if where is None:
            where = dirs[tier] = topic_dir(store.tier(tier).path, topic)
        return f"{where}/{p}/{seq:020d}{SEGMENT_SUFFIX}"

    root, tid = store.root, st.topic_id
    out = []
    for p, start, end in ranges:
        stop, chunks = planned_chunks(topic, st, p, start, end, path_of, bundle_url, keep)
        out.append(ReadPlan(root, topic, p, start, stop, tuple(chunks), tid, st.schema))
    return out


def bytes_between(st: TopicState, p: int, start: int, end: int) -> int:
    """Approximate bytes of records ``[start, end)``: a segment wholly inside counts its
    bytes; in one at either end, whole chunks count, pro rata at the ends. No chunk rows of
    the segments between are read: a year of backlog costs its segments' figures only."""
    if end <= start:
        return 0
    part = st.part(p)
    total = 0
    for seg in _segments_near(part, start, end):
        if seg.end <= start or seg.base >= end:
            continue
        if start <= seg.base and seg.end <= end:
            total += seg.bytes
            continue
        rows = part.chunks.overlapping(max(start, seg.base), min(end, seg.end))
        total += _chunk_bytes(rows[rows["seq"] == seg.seq], start, end)
    return total


def _segments_near(part: PartitionState, start: int, end: int) -> Iterable[SegmentState]:
    """Partition ``part``'s segments that may hold offsets of ``[start, end)`` (callers
    check each): a few are looked at directly, more found by the index's ordered search,
    whatever the partition's history."""
    segs = part.segments
    if len(segs) <= 4:
        return segs.values()
    return [segs[q] for q in part.chunks.segments_holding(start, end)]


def _chunk_bytes(rows: np.ndarray, start: int, end: int) -> int:
    """Bytes of ``rows``' records in ``[start, end)``: whole chunks, pro rata at the ends."""
    if len(rows) <= 8:  # a few chunks (a driver asks per partition per batch): no array math
        total = 0.0
        for b, n, length in zip(rows["base"].tolist(), rows["records"].tolist(),
                                rows["length"].tolist(), strict=True):
            lo, hi = max(b, start), min(b + n, end)
            if hi > lo:
                total += (hi - lo) / max(n, 1) * length
        return int(total)
    lo = np.maximum(rows["base"], start)
    hi = np.minimum(rows["base"] + rows["records"], end)
    frac = np.clip(hi - lo, 0, None) / np.maximum(rows["records"], 1)
    return int((frac * rows["length"]).sum())


def bytes_by_tier(st: TopicState, p: int, start: int, end: int) -> dict[int, int]:
    """Approximate bytes of records ``[start, end)`` by the tier holding them: a segment
    wholly inside counts its bytes, one in part its share by offsets. Looks only at the
    segments holding the range, whatever the partition's history; reads no chunk row."""
    part = st.part(p)
    out: dict[int, int] = {}
    for seg in _segments_near(part, start, end):
        if seg.end <= start or seg.base >= end:
            continue
        lo, hi = max(start, seg.base), min(end, seg.end)
        n = seg.bytes if (lo, hi) == (seg.base, seg.end) else \
            seg.bytes * (hi - lo) // max(1, seg.end - seg.base)
        out[seg.tier] = out.get(seg.tier, 0) + n
    return out


def topic_bytes_by_tier(topic: Any, ranges: Iterable[tuple[int, int, int]]
                        ) -> dict[int, int]:
    """``Topic.bytes_by_tier``: the bytes of records ``(partition, start, end)`` of every
    range, summed by the tier holding them (:func:`bytes_by_tier`), in the topic's current
    state: one call for a batch of a thousand partitions."""
    st = topic.log.current
    out: dict[int, int] = {}
    for p, start, end in ranges:
        if end > start:
            for tier, n in bytes_by_tier(st, p, start, end).items():
                out[tier] = out.get(tier, 0) + n
    return out


def offset_for_time(st: TopicState, p: int, timestamp_ms: int) -> int:
    """The first offset committed at or after ``timestamp_ms`` (latest if none). Commit
    times rise with offsets (they are monotonic per topic), so the segment holding it is
    the first whose last commit time reaches it: only that segment's rows are read, however
    long the history."""
    part = st.part(p)
    segs = sorted(part.segments.values(), key=lambda s: s.base)
    lasts = [s.last_ts for s in segs]
    if any(a > b for a, b in zip(lasts, lasts[1:], strict=False)):
        rows = part.chunks.rows()  # a log whose clock went back (older releases): every row
        i = int(np.searchsorted(rows["ts"], timestamp_ms, side="left"))
        return int(rows["base"][i]) if i < len(rows) else part.next_offset
    for seg in segs[bisect_left(lasts, timestamp_ms):]:
        rows = part.chunks.segment_rows(seg.seq)
        i = int(np.searchsorted(rows["ts"], timestamp_ms, side="left"))
        if i < len(rows):
            return int(rows["base"][i])
    return part.next_offset


def segment_infos(topic: str, st: TopicState, tier_of: Callable[[int], Tier],
                  active_of: Callable[[int], tuple[int, int] | None],
                  grace_s: float) -> list[SegmentInfo]:
    """The committed segments, by partition and base offset: where each is, whether it is
    sealed, and whether its file holds only committed chunks (or abandoned ones)."""
    now = time.time()
    out = []
    for p in range(st.partitions):
        active = active_of(p)
        spans, packed = st.part(p).chunks.spans()  # from the pieces' figures: none is read
        for s in st.partition_segments(p):
            tier = tier_of(s.tier)
            if tier.is_lake:  # its Parquet file, sealed and settled for good
                out.append(SegmentInfo(
                    s.id, topic, p, s.base, s.end, s.records, s.bytes, s.chunks, s.tier, "LAKE",
                    tier.file_path(topic, st.topic_id, p, s.seq,  # type: ignore
                                   s.lake.last_seq if s.lake else s.seq),
                    True, s.first_ts, s.last_ts, True, s.bytes))
                continue
            path = tier.segment_path(topic, p, s.seq)
            is_active = (s.seq, s.tier) == active
            hdr = tier.read_header(path) if is_active or not tier.is_remote else None
            # The active one is sealed once a roll or the idle check sealed its header.
            sealed = not is_active or (hdr is not None and hdr.sealed)
            settled = is_settled(path, hdr, spans.get(s.seq, 0), grace_s, now)
            out.append(SegmentInfo(
                s.id, topic, p, s.base, s.end, s.records, s.bytes, s.chunks, s.tier,
                tier.type, path, sealed, s.first_ts, s.last_ts, settled,
                packed.get(s.seq, 0)))
    return out


def used_bytes(tiers: list[Tier], states: list[TopicState], host: str | None = None
               ) -> dict[int, int]:
    """Bytes per tier, accounted from the topics' states: committed bytes, and each
    partition's newest segment whole; on a shared store (``host`` given) a local tier
    counts that host's segments only, as each host has its own."""
    used = {t.number: 0 for t in tiers}
    local = {t.number for t in tiers if t.local}
    whole = {t.number: t.segment_bytes for t in tiers}
    for st in states:
        for part in st.parts:
            newest = max(part.segments, default=None)
            for seq, s in part.segments.items():
                if host is None or s.tier not in local or s.host == host:
                    # A partition's newest segment may be its active one, still filling: it
                    # is counted whole, as placement reserved it.
                    n = max(s.extent, whole.get(s.tier, 0)) if seq == newest else s.extent
                    used[s.tier] = used.get(s.tier, 0) + n
    return used


def tier_usage(tiers: list[Tier], states: list[TopicState], host: str | None = None
               ) -> list[dict[str, Any]]:
    """Per tier: number, type, path, capacity, used bytes, segments (and free pool files);
    ``host`` as in :func:`used_bytes`."""
    used = {t.number: 0 for t in tiers}
    segs = {t.number: 0 for t in tiers}
    local = {t.number for t in tiers if t.local}
    for st in states:
        for s in st.segments.values():
            if host is None or s.tier not in local or s.host == host:
                used[s.tier] += s.extent
                segs[s.tier] += 1
    out = []
    for t in tiers:
        # Size -1: what the store holds there plus what its filesystem has room for.
        row: dict[str, Any] = {"tier": t.number, "type": t.type, "path": t.path,
                               "capacity": space.capacity(t.capacity, t.path, used[t.number])
                               if t.local else t.capacity,
                               "used": used[t.number], "segments": segs[t.number]}
        if t.has_pool:
            row["pool_files"] = t.pool_size
            row["pool_free"] = t.free_pool_files()
        out.append(row)
    return out


__all__ = ["bytes_between", "bytes_by_tier", "offset_for_time", "planned_chunks",
           "segment_infos", "tier_usage", "used_bytes"]
