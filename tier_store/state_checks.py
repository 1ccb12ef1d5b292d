"""What replay checks before it trusts the commit log: an entry against the state it
extends, a checkpoint's state against itself, a checkpoint's chunk rows.

Numbers and names read from the log index arrays and build paths, so each is checked for
its type (an int, never a bool or a string) and range before use. A problem is reported as
text (entries) or ``ValueError`` (checkpoints); :mod:`tier_store.state` raises it as
:class:`~tier_store.errors.CorruptLog` naming the file.
"""

from __future__ import annotations

import binascii
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from .config_keys import KEYS
from .entries import (
    INT64,
    MAX_PARTITIONS,
    MAX_TIERS,
    AppendEntry,
    ConfigEntry,
    CreateEntry,
    DeleteEntry,
    Entry,
    MoveEntry,
    PartitionsEntry,
    PositionEntry,
    SchemaEntry,
    lake_record,
)
from .errors import ConfigError, CorruptLog
from .ids import SegmentId, check_host
from .index_pieces import PieceRef
from .schemas import problems, schema_from_text
from .segment import HEADER_SIZE

LAKE_FIRST_POS = 4  # a Parquet file's first row group follows its magic "PAR1"

if TYPE_CHECKING:
    from .state import TopicState


def entry_problem(st: TopicState, version: int, e: Entry) -> str | None:
    """Why ``e`` cannot be version ``version`` after ``st`` (None if it can)."""
    if (version == 0) != isinstance(e, CreateEntry):
        return "creates the topic but is not entry 0" if version else \
            "is entry 0 but does not create the topic"
    if isinstance(e, AppendEntry):
        return _append_problem(st, e)
    if isinstance(e, CreateEntry | ConfigEntry):
        return config_problem(e.config, unsets=isinstance(e, ConfigEntry))
    if isinstance(e, DeleteEntry):
        for sid in e.segments:
            p = SegmentId.parse(sid).partition
            if p >= st.partitions:
                return f"deletes segment {sid} of partition {p}; the topic has {st.partitions}"
    elif isinstance(e, MoveEntry):
        return _move_problem(st, e)
    elif isinstance(e, PartitionsEntry) and e.partitions < st.partitions:
        return f"lowers the partition count from {st.partitions} to {e.partitions}"
    elif isinstance(e, PositionEntry):
        bad = [k for k in e.offsets if int(k) >= st.partitions]
        if bad:
            return f"sets a position on partition {bad[0]}; the topic has {st.partitions}"
    elif isinstance(e, SchemaEntry):
        return _schema_problem(st, e)
    return None


def _schema_problem(st: TopicState, e: SchemaEntry) -> str | None:
    try:
        new = schema_from_text(e.schema)
    except (pa.ArrowException, binascii.Error, ValueError, OSError) as err:
        return f"holds a malformed schema: {err}"
    found = problems(st.schema, new) if st.schema is not None else ["the topic has none"]
    return f"changes the schema as no evolution may: {'; '.join(found)}" if found else None


def config_problem(conf: dict[str, Any], unsets: bool = False) -> str | None:
    """Why a topic's config read from the log is not one (None if it is): each known key's
    value is checked as the store's configuration checks it (null unsets, in a ``config``
    entry only). Unknown keys are kept: a later version may know them."""
    for k, v in conf.items():
        if k not in KEYS or (v is None and unsets):
            continue
        try:
            if v is None:
                raise ConfigError("null")
            KEYS[k].parse(v)
        except ConfigError as err:
            return f"sets topic config {k} to {v!r}: {err}"
    return None


def _append_problem(st: TopicState, e: AppendEntry) -> str | None:
    nxt: dict[int, int] = {}
    for c in e.chunks:
        if c.partition >= st.partitions:
            return f"appends to partition {c.partition}; the topic has {st.partitions}"
        part = st.parts[c.partition]
        expect = nxt.get(c.partition, part.next_offset)
        if c.base != expect:
            return (f"puts a chunk of partition {c.partition} at offset {c.base}, where offset "
                    f"{expect} comes next")
        nxt[c.partition] = c.base + c.records
        if c.pos < HEADER_SIZE:
            return f"puts a chunk at byte {c.pos}, inside the segment header"
        seg = part.segments.get(c.seq)
        if seg is not None and seg.tier != c.tier:
            return (f"puts a chunk of segment {seg.id} on tier {c.tier}; the segment is on "
                    f"tier {seg.tier}")
        if seg is not None and seg.host != c.host:
            return (f"puts a chunk of segment {seg.id} written on host {c.host}; the segment "
                    f"is host {seg.host}'s")
    return None


def _move_problem(st: TopicState, e: MoveEntry) -> str | None:
    if e.partition >= st.partitions:
        return f"moves segments of partition {e.partition}; the topic has {st.partitions}"
    part = st.parts[e.partition]
    if len(set(e.sources)) != len(e.sources):
        return f"names a source twice: {list(e.sources)}"
    missing = [q for q in e.sources if q not in part.segments]
    if missing:
        return f"moves segment {e.partition}-{missing[0]}, which the log does not hold"
    if e.seq in part.segments and e.seq not in e.sources:
        return f"moves segments onto segment {e.partition}-{e.seq}, which holds others"
    # A lake file's row groups start after its 4-byte magic, a segment's chunks after its
    # header.
    first = LAKE_FIRST_POS if e.lake is not None else HEADER_SIZE
    for c in e.chunks:
        if (c.partition, c.seq, c.tier) != (e.partition, e.seq, e.tier) or c.pos < first:
            return (f"names a chunk of segment {c.partition}-{c.seq} on tier {c.tier} at byte "
                    f"{c.pos}, not in segment {e.partition}-{e.seq} on tier {e.tier}")
    # The sources' rows only (their pieces are read, and kept for the move's replay).
    olds = [part.chunks.segment_rows(q) for q in e.sources]
    kept = sorted(pair for rows in olds
                  for pair in zip(rows["base"].tolist(), rows["records"].tolist(), strict=True))
    new = sorted((c.base, c.records) for c in e.chunks)
    if new != kept and (e.lake is None or not _groups_cover(new, kept)):
        return "does not keep the offsets of the segments it moves"
    return None


def _groups_cover(groups: list[tuple[int, int]], chunks: list[tuple[int, int]]) -> bool:
    """Whether row groups ``groups`` hold exactly the offsets of ``chunks`` (both (base,
    records), in order), each group a run of whole chunks."""
    i = 0
    for base, records in groups:
        if i >= len(chunks) or chunks[i][0] != base:
            return False
        at = base
        while i < len(chunks) and chunks[i][0] == at and at < base + records:
            at += chunks[i][1]
            i += 1
        if at != base + records:
            return False
    return i == len(chunks)


# -- checkpoints ----------------------------------------------------------------------------
def _int(name: str, v: Any, low: int = 0, high: int = INT64) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < high:
        raise ValueError(f"{name} is {v!r}, not an integer in [{low}, {high})")
    return v


def _typed(name: str, v: Any, kind: type) -> Any:
    if not isinstance(v, kind):
        raise ValueError(f"{name} is {v!r}, not a JSON {kind.__name__}")
    return v


def _schema_history(history: Any, schema: Any, version: int) -> None:
    """A checkpoint's schema history: [version, ts, text] in version order, ending with the
    checkpoint's schema."""
    last = -1
    for h in _typed("schemas", history, list):
        if not (isinstance(h, list) and len(h) == 3):
            raise ValueError(f"schemas holds {h!r}, not [version, ts, schema]")
        last = _int("a schema's version", h[0], last + 1, version + 1)
        _int("a schema's ts", h[1])
        _typed("a schema", h[2], str)
    if not history or history[-1][2] != schema:
        raise ValueError("schemas does not end with the topic's schema")


_SEGMENT_FIELDS = ("partition", "seq", "tier", "base", "end", "records", "bytes", "extent",
                   "chunks", "first_ts", "last_ts")


def check_checkpoint_meta(meta: Any, table: pa.Table, columns: dict[str, pa.DataType],
                          version: int | None, topic: str | None) -> None:
    """``ValueError`` naming the first field of a checkpoint's state that is malformed, or
    that says it is not ``version`` of ``topic``; ``columns``: the chunk columns it needs."""
    _typed("the state", meta, dict)
    fmt = meta.get("format", 1)
    if fmt not in (1, 2, 3, 4, 5) or isinstance(fmt, bool):
        raise ValueError(f"format is {fmt!r}: this release reads checkpoint formats 1 to 5")
    if _typed("name", meta["name"], str) != topic and topic is not None:
        raise ValueError(f"it is the checkpoint of topic {meta['name']!r}, not {topic!r}")
    if _int("version", meta["version"], 0) != version and version is not None:
        raise ValueError(f"it holds version {meta['version']}, not {version}")
    if meta["schema"] is not None:
        _typed("schema", meta["schema"], str)
    if "schemas" in meta:
        _schema_history(meta["schemas"], meta["schema"], meta["version"])
    n = _int("partitions", meta["partitions"], 0, MAX_PARTITIONS + 1)
    if problem := config_problem(_typed("config", meta["config"], dict)):
        raise ValueError(problem)
    _int("created_ts", meta["created_ts"])
    _int("last_ts", meta["last_ts"])
    _typed("topic_id", meta["topic_id"], str)
    lists = [_typed(k, meta[k], list) for k in ("next_offset", "start_offset", "chunk_counts")]
    if not all(len(x) == n for x in lists):
        raise ValueError(f"{n} partitions, but {[len(x) for x in lists]} next offsets, start "
                         "offsets and chunk counts")
    for p, (nxt, start, count) in enumerate(zip(*lists, strict=True)):
        if _int(f"partition {p}'s start offset", start) > _int("its next offset", nxt):
            raise ValueError(f"partition {p} starts at offset {start}, past its next {nxt}")
        _int(f"partition {p}'s chunk count", count)
    if sum(lists[2]) != table.num_rows:
        raise ValueError(f"chunk counts add up to {sum(lists[2])}, the table holds "
                         f"{table.num_rows} chunks")
    for name, kind in columns.items():
        i = table.schema.get_field_index(name)
        if i < 0 or table.schema.field(i).type != kind or table.column(i).null_count:
            raise ValueError(f"column {name!r} is missing, not {kind}, or holds nulls")
    seen = set()
    fields = sorted(_SEGMENT_FIELDS + (("pieces",) if fmt >= 2 else ()))
    in_pieces = [0] * n
    for s in _typed("segments", meta["segments"], list):
        if not isinstance(s, dict) or sorted(set(s) - {"host", "lake"}) != fields:
            raise ValueError(f"a segment is {s!r}, not an object of {', '.join(fields)}"
                             " (and host, lake)")
        if "host" in s:
            check_host(s["host"], "a segment's host")
        if "lake" in s:
            if fmt < 4:
                raise ValueError(f"segment {s['partition']}-{s['seq']} names a lake file in a "
                                 f"checkpoint of format {fmt}")
            lake_record(s["lake"])
        for k in _SEGMENT_FIELDS:
            _int(f"a segment's {k}", s[k])
        _int("a segment's partition", s["partition"], 0, n)
        _int("a segment's tier", s["tier"], 1, MAX_TIERS + 1)
        if (s["partition"], s["seq"]) in seen:
            raise ValueError(f"segment {s['partition']}-{s['seq']} is listed twice")
        seen.add((s["partition"], s["seq"]))
        pieces = _typed("a segment's pieces", s.get("pieces", []), list)
        for r in pieces:
            ref = PieceRef.from_json(r, "")
            if ref.listed and (fmt < 3 or len(pieces) > 1):
                raise ValueError(f"segment {s['partition']}-{s['seq']} names index list "
                                 f"{ref.name} beside other pieces or in format {fmt}")
            if not s["base"] <= ref.base < ref.end <= s["end"]:
                raise ValueError(f"index piece {r!r} lies outside segment {s['partition']}-"
                                 f"{s['seq']}'s offsets [{s['base']}, {s['end']})")
            in_pieces[s["partition"]] += ref.rows
    _check_segments_cover(meta["segments"], lists, in_pieces)
    for k, v in _typed("writers", meta["writers"], dict).items():
        _int(f"writer {k!r}'s batch", v)
    for group, offs in _typed("positions", meta["positions"], dict).items():
        for k, v in _typed(f"group {group!r}'s position", offs, dict).items():
            if not (k.isascii() and k.isdigit() and int(k) < n):
                raise ValueError(f"group {group!r} has a position on partition {k!r}")
            _int(f"group {group!r}'s offset", v)
    for key, v in _typed("tombstones", meta["tombstones"], dict).items():
        sid, _, tier = key.rpartition("@")
        SegmentId.parse(sid)
        if not (isinstance(v, list) and len(v) in (2, 3)
                and tier == str(_int("a tombstone's tier", v[0], 1))):
            raise ValueError(f"tombstone {key!r} is {v!r}")
        _int("a tombstone's time", v[1])
        if len(v) == 3:
            _int("a tombstone's version", v[2])


def _check_segments_cover(segments: list[dict[str, Any]], lists: list[list[int]],
                          in_pieces: list[int]) -> None:
    """Per partition, the segments hold the chunks counted (inline and in pieces) and lie
    within its offsets."""
    nexts, starts, counts = lists
    chunks = [0] * len(counts)
    for s in segments:
        p = s["partition"]
        chunks[p] += s["chunks"]
        if not starts[p] <= s["base"] <= s["end"] <= nexts[p] or \
                s["records"] > s["end"] - s["base"]:
            raise ValueError(f"segment {p}-{s['seq']} holds offsets [{s['base']}, {s['end']}) "
                             f"({s['records']} records), outside its partition's "
                             f"[{starts[p]}, {nexts[p]})")
    counted = [a + b for a, b in zip(counts, in_pieces, strict=True)]
    if chunks != counted:
        raise ValueError(f"the segments hold {chunks} chunks per partition, the checkpoint "
                         f"{counted} (inline and in index pieces)")


def row_problems(rows: np.ndarray) -> np.ndarray:
    """Per chunk row: whether it names a place before any chunk can lie (a lake file's first
    row group, after its magic; the move entry that put it there checked the segment's
    header) or holds no bytes (the overlap of neighbours is :func:`check_chunk_rows`'s)."""
    return (rows["seq"] < 0) | (rows["pos"] < LAKE_FIRST_POS) | (rows["length"] <= 0) | \
        (rows["base"] < 0) | (rows["records"] < 1) | (rows["pos"] > INT64 - 1 - rows["length"])


def check_chunk_rows(rows: np.ndarray, where: str) -> None:
    """:class:`CorruptLog` naming checkpoint ``where`` if one partition's chunk ``rows``
    (in offset order) name a place before the segment header, hold no bytes, or overlap."""
    if not len(rows):
        return
    bad = row_problems(rows)
    ends = rows["base"][:-1] + rows["records"][:-1]
    if bad.any() or (rows["base"][1:] < ends).any():
        i = int(np.argmax(bad)) if bad.any() else int(np.argmax(rows["base"][1:] < ends)) + 1
        raise CorruptLog(f"checkpoint {where} is malformed: chunk row {i} ({rows[i]}) is out of "
                         "place")
