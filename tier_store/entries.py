"""Commit-log entry kinds: frozen dataclasses with one JSON encode/decode pair.

Each entry is one JSON object with a ``kind`` and the commit time ``ts`` (ms, monotonic per
topic). Python names here; the on-disk JSON uses shorter names for a few fields (``p``, ``len``,
``n``, ``crc``), mapped only in :meth:`Entry.encode` and :func:`decode`.

The object ends with ``"sum"``: the xxh3-64 (16 hex digits) of the entry's version, the topic's
id (``""`` for entry 0, which holds the id) and the bytes before it. It is checked before the
JSON is parsed, so a damaged entry, or one copied from another version or topic, is
:class:`CorruptLog` naming the file. Then every field's type and range is checked: names and
numbers from the log build paths and index arrays, so a string where a number belongs (or
``../``) never gets that far.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple

import xxhash

from .errors import CorruptLog, InvalidArgument
from .ids import SegmentId, check_bundle, check_host

# Limits of what a log may name: offsets, positions and sequence numbers fit an int64.
INT64 = 2**63
MAX_PARTITIONS = 100_000  # num.partitions' maximum
MAX_TIERS = 64


# Python names of fields whose on-disk names are shorter: only encode and decode use these.
_DISK_NAMES = {"partition": "p", "length": "len", "records": "n", "checksum": "crc"}
_PY_NAMES = {v: k for k, v in _DISK_NAMES.items()}


def _to_disk(fields: dict[str, Any]) -> dict[str, Any]:
    return {_DISK_NAMES.get(k, k): v for k, v in fields.items()}


def _from_disk(fields: dict[str, Any]) -> dict[str, Any]:
    return {_PY_NAMES.get(k, k): v for k, v in fields.items()}


class ChunkRecord(NamedTuple):
    """A committed chunk: where it lives, which offsets it holds, and its checksum.

    A named tuple, not a dataclass: a refresh builds one per chunk committed, and a frozen
    dataclass's constructor cost ten times as much."""

    partition: int
    seq: int  # segment sequence within the partition
    tier: int
    pos: int  # byte position in the segment
    length: int  # bytes
    base: int  # offset of its first record
    records: int
    checksum: int  # xxh3-64 of its bytes
    tmin: int | None = None  # event-time min/max (ms) when the writer named a column
    tmax: int | None = None
    # On a store shared by many hosts: the host that wrote the segment (its copy there is a
    # cache), and the shared object holding the chunk (``obj``, 32 hex digits) at byte
    # ``opos``. Absent on a single-host store, and once the segment is on the shared tier.
    host: str | None = None
    obj: str | None = None
    opos: int | None = None
    # Column statistics (:mod:`tier_store.stats`), when the writer recorded them.
    st: dict[str, Any] | None = None


# Fields of a chunk left out of its JSON when None: a single-host store's entries stay as
# they were before stores were shared (and before chunks had statistics).
_OPTIONAL = ("host", "obj", "opos", "st")
_CHUNK_FIELDS = tuple((name, _DISK_NAMES.get(name, name)) for name in ChunkRecord._fields)
_DISK_ORDER = tuple(disk for _, disk in _CHUNK_FIELDS)
_LAST_REQUIRED = len(_DISK_ORDER) - len(_OPTIONAL)


def chunk_json(c: ChunkRecord) -> dict[str, Any]:
    """A chunk as its entry's JSON holds it (the shared-store fields only when set)."""
    if c.host is None and c.obj is None and c.opos is None:
        body = dict(zip(_DISK_ORDER[:_LAST_REQUIRED], c, strict=False))
        if c.st is not None:
            body["st"] = c.st
        return body
    return {k: v for k, v in zip(_DISK_ORDER, c, strict=True)
            if v is not None or k not in _OPTIONAL}


@dataclass(frozen=True)
class Entry:
    kind: ClassVar[str] = ""
    ts: int

    def encode(self, version: int, topic_id: str) -> bytes:
        """The entry as published as ``version`` of the topic with id ``topic_id`` (ignored
        for entry 0), its checksum last."""
        # Shallow: only ``chunks`` holds dataclasses, and it is encoded on its own.
        body = {"kind": self.kind,
                **_to_disk({f.name: getattr(self, f.name) for f in fields(self)})}
        if "chunks" in body:
            body["chunks"] = [chunk_json(c) for c in self.chunks]  # type: ignore[attr-defined]
        if "lake" in body:  # left out unless set: other moves stay as they were
            lake = body.pop("lake")
            if lake is not None:
                body["lake"] = lake._asdict()
        return signed(json.dumps(body, separators=(",", ":")).encode(), version, topic_id)


@dataclass(frozen=True)
class CreateEntry(Entry):
    kind: ClassVar[str] = "create"
    schema: str  # base64 of the Arrow IPC schema message
    partitions: int
    config: dict[str, Any] = field(default_factory=dict)
    # This incarnation of the topic (Kafka's topic id, KIP-516): a topic deleted and created
    # again under its name has another. "" in logs written before topics had ids.
    id: str = ""


@dataclass(frozen=True)
class AppendEntry(Entry):
    kind: ClassVar[str] = "append"
    chunks: tuple[ChunkRecord, ...]
    writer: str | None = None
    batch: int | None = None


@dataclass(frozen=True)
class DeleteEntry(Entry):
    kind: ClassVar[str] = "delete"
    segments: tuple[str, ...]  # segment ids "<partition>-<seq>"
    reason: str = "retention"


@dataclass(frozen=True)
class PartitionsEntry(Entry):
    kind: ClassVar[str] = "partitions"
    partitions: int  # the new total


@dataclass(frozen=True)
class PositionEntry(Entry):
    kind: ClassVar[str] = "position"
    group: str
    offsets: dict[str, int]


@dataclass(frozen=True)
class SchemaEntry(Entry):
    """The topic's schema becomes ``schema`` (an allowed evolution: :mod:`.schemas`)."""

    kind: ClassVar[str] = "schema"
    schema: str  # base64 of the Arrow IPC schema message


@dataclass(frozen=True)
class ConfigEntry(Entry):
    kind: ClassVar[str] = "config"
    config: dict[str, Any]


class LakeRecord(NamedTuple):
    """A segment in a lake: its Parquet file's size, footer range and xxh3-64, a version of
    the table holding it, and its last source's sequence (the path: partition, first and last
    source, :func:`tier_store.lake.file_rel`). Its row groups are the segment's chunks."""

    size: int
    footer_pos: int
    footer_length: int
    footer_checksum: int
    version: int
    last_seq: int


@dataclass(frozen=True)
class MoveEntry(Entry):
    """Sealed segments ``sources`` now live as segment ``seq`` of ``p`` on ``tier``."""

    kind: ClassVar[str] = "move"
    partition: int
    sources: tuple[int, ...]  # sequence numbers of the segments replaced
    seq: int
    tier: int
    chunks: tuple[ChunkRecord, ...]  # the chunks' new positions
    lake: LakeRecord | None = None  # set when ``tier`` is a lake


def lake_record(v: Any) -> LakeRecord:
    """A lake record from its JSON (an object of its five integer fields), checked."""
    if not isinstance(v, dict) or set(v) != set(LakeRecord._fields):
        raise ValueError(f"lake is {v!r}, not an object of {', '.join(LakeRecord._fields)}")
    r = LakeRecord(**v)
    for name, x in zip(LakeRecord._fields, r, strict=True):
        _int(f"lake {name}", x, 0, 2**64 if name == "footer_checksum" else INT64)
    if r.footer_length < 12 or r.footer_pos + r.footer_length != r.size:
        raise ValueError(f"lake footer [{r.footer_pos}, +{r.footer_length}) does not end "
                         f"the file of {r.size} bytes")
    return r


KINDS: dict[str, type[Entry]] = {
    c.kind: c for c in (CreateEntry, AppendEntry, DeleteEntry, PartitionsEntry, PositionEntry,
                        ConfigEntry, MoveEntry, SchemaEntry)
}


def _digest(head: bytes, version: int, topic_id: str) -> int:
    h = xxhash.xxh3_64(b"%d\n%s\n" % (version, (topic_id if version else "").encode()))
    h.update(head)
    return h.intdigest()


_SUM = re.compile(rb',"sum":"([0-9a-f]{16})"\}\s*\Z')


def signed(body: bytes, version: int, topic_id: str) -> bytes:
    """The JSON object ``body`` with the checksum of entry ``version`` of the topic with id
    ``topic_id`` added last: the bytes published."""
    head = body.rstrip()[:-1]
    return head + b',"sum":"%016x"}' % _digest(head, version, topic_id)


def entry_body(data: bytes) -> bytes:
    """The JSON of an entry without its checksum (as written; for tools and tests)."""
    m = _SUM.search(data)
    return data if m is None else data[:m.start()] + b"}"


def decode(data: bytes, where: str, version: int, topic_id: str) -> Entry:
    """Decode entry ``version`` of the topic with id ``topic_id``; a damaged or malformed one
    raises :class:`CorruptLog` naming the file ``where``."""
    m = _SUM.search(data)
    if m is None:
        raise CorruptLog(f"commit-log entry {where} is damaged: it does not end with its "
                         "checksum (truncated, or written by a release without checksums)")
    head = data[:m.start()]
    if _digest(head, version, topic_id) != int(m.group(1), 16):
        raise CorruptLog(f"commit-log entry {where} is damaged: its checksum does not match "
                         f"(changed, or copied from another version or topic)")
    try:
        body = _from_disk(json.loads(head + b"}"))
        if not isinstance(body, dict):
            raise TypeError(f"a JSON {type(body).__name__}, not an object")
        cls = KINDS[body.pop("kind")]
        if "chunks" in body:
            if not isinstance(body["chunks"], list):
                raise TypeError(f"chunks is {body['chunks']!r}, not a list")
            body["chunks"] = tuple(_chunk(c) for c in body["chunks"])
        if "lake" in body:
            body["lake"] = lake_record(body["lake"])
        for name in ("segments", "sources"):
            if name in body:
                if not isinstance(body[name], list):
                    raise TypeError(f"{name} is {body[name]!r}, not a list")
                body[name] = tuple(body[name])
        entry = cls(**body)
        _check_fields(entry)
        return entry
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise CorruptLog(f"commit-log entry {where} is malformed: {e}") from None


_DISK_KEYS = frozenset(disk for _, disk in _CHUNK_FIELDS)


_PLAIN_KEYS = frozenset(_DISK_ORDER[:_LAST_REQUIRED])  # a single-host store's chunk
_STATS_KEYS = _PLAIN_KEYS | {"st"}
_new_chunk = tuple.__new__


def _chunk(c: Any) -> ChunkRecord:
    if type(c) is dict:  # the usual chunks: positional, at once
        keys = c.keys()
        if keys in (_STATS_KEYS, _PLAIN_KEYS):
            return _new_chunk(ChunkRecord, (c["p"], c["seq"], c["tier"], c["pos"], c["len"],
                                            c["base"], c["n"], c["crc"], c["tmin"], c["tmax"],
                                            None, None, None, c.get("st")))
    if not isinstance(c, dict):
        raise TypeError(f"a chunk is {c!r}, not an object")
    if not _DISK_KEYS.issuperset(c):
        unknown = sorted(set(c) - _DISK_KEYS)
        raise TypeError(f"a chunk names unknown field(s) {', '.join(unknown)}")
    g = c.get
    return ChunkRecord(c["p"], c["seq"], c["tier"], c["pos"], c["len"], c["base"], c["n"],
                       c["crc"], g("tmin"), g("tmax"), g("host"), g("obj"), g("opos"),
                       g("st"))


def _int(name: str, v: Any, low: int = 0, high: int = INT64) -> None:
    """``v`` must be an int (not a bool) in ``[low, high)``."""
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v < high:
        raise ValueError(f"{name} is {v!r}, not an integer in [{low}, {high})")


def _str(name: str, v: Any, optional: bool = False) -> None:
    if not (isinstance(v, str) or (optional and v is None)):
        raise ValueError(f"{name} is {v!r}, not a string")


def check_chunk(c: ChunkRecord) -> None:
    """Types and ranges of a chunk's fields (``ValueError`` naming the field)."""
    p, seq, tier, pos, n, base, k, crc = (c.partition, c.seq, c.tier, c.pos, c.length,
                                          c.base, c.records, c.checksum)
    # One test for the usual chunk (an entry may hold thousands; ``type`` is int excludes
    # bools); any doubt takes the field-by-field path, which names what is wrong.
    if not (type(p) is int and type(seq) is int and type(tier) is int and type(pos) is int
            and type(n) is int and type(base) is int and type(k) is int and type(crc) is int
            and 0 <= p < MAX_PARTITIONS and 0 <= seq < INT64 and 1 <= tier <= MAX_TIERS
            and pos >= 0 and n >= 1 and base >= 0 and k >= 1 and 0 <= crc < 2**64
            and base + k < INT64 and pos + n < INT64):
        _check_chunk_fields(c)
    tmin, tmax, host, obj, opos, st = c.tmin, c.tmax, c.host, c.obj, c.opos, c.st
    if st is not None and type(st) is not dict:  # its content is checked where it is used
        raise ValueError(f"st is {st!r}, not an object")
    if tmin is not None:
        _int("tmin", tmin, -INT64 + 1)
    if tmax is not None:
        _int("tmax", tmax, -INT64 + 1)
    if host is not None:
        check_host(host, "host")
    if obj is not None or opos is not None:
        if obj is None or opos is None:
            raise ValueError(f"obj {obj!r} and opos {opos!r}: a chunk names both or neither")
        check_bundle(obj)
        _int("opos", opos)


def _check_chunk_fields(c: ChunkRecord) -> None:
    _int("p", c.partition, 0, MAX_PARTITIONS)
    _int("seq", c.seq)
    _int("tier", c.tier, 1, MAX_TIERS + 1)
    _int("pos", c.pos)
    _int("len", c.length, 1)
    _int("base", c.base)
    _int("n", c.records, 1)  # a chunk holds a record at least (empty writes make none)
    _int("crc", c.checksum, 0, 2**64)
    if c.base + c.records >= INT64 or c.pos + c.length >= INT64:
        raise ValueError(f"chunk at byte {c.pos} with offsets from {c.base} is out of range")


def _check_fields(e: Entry) -> None:
    """Every field of a decoded entry has its type and lies in its range."""
    _int("ts", e.ts)
    if isinstance(e, (CreateEntry, SchemaEntry)):
        _str("schema", e.schema)
    if isinstance(e, CreateEntry):
        _int("partitions", e.partitions, 1, MAX_PARTITIONS + 1)
        _str("id", e.id)
    if isinstance(e, (CreateEntry, ConfigEntry)):
        if not isinstance(e.config, dict) or not all(isinstance(k, str) for k in e.config):
            raise ValueError(f"config is {e.config!r}, not an object")
    elif isinstance(e, AppendEntry):
        if not e.chunks:
            raise ValueError("an append names no chunk")
        for c in e.chunks:
            check_chunk(c)
        _str("writer", e.writer, optional=True)
        if e.batch is not None:
            _int("batch", e.batch)
    elif isinstance(e, DeleteEntry):
        for sid in e.segments:
            try:
                SegmentId.parse(sid)
            except InvalidArgument as err:
                raise ValueError(str(err)) from None
        _str("reason", e.reason)
    elif isinstance(e, PartitionsEntry):
        _int("partitions", e.partitions, 1, MAX_PARTITIONS + 1)
    elif isinstance(e, PositionEntry):
        _str("group", e.group)
        if not isinstance(e.offsets, dict):
            raise ValueError(f"offsets is {e.offsets!r}, not an object")
        for k, v in e.offsets.items():
            if not (k.isdigit() and k.isascii()):
                raise ValueError(f"offsets names partition {k!r}")
            _int(f"the offset of partition {k}", v)
    elif isinstance(e, MoveEntry):
        _int("p", e.partition, 0, MAX_PARTITIONS)
        _int("seq", e.seq)
        _int("tier", e.tier, 1, MAX_TIERS + 1)
        if not e.sources:
            raise ValueError("sources is empty")
        for q in e.sources:
            _int("a source", q)
        for c in e.chunks:
            check_chunk(c)
        if e.lake is not None:
            if not e.chunks:
                raise ValueError("a move to a lake names no row group")
            if (e.seq, e.lake.last_seq) != (min(e.sources), max(e.sources)):
                raise ValueError(f"a lake file of segments {e.seq}..{e.lake.last_seq} is "
                                 f"named for sources {list(e.sources)}")
            if any(c.tier != e.tier or c.seq != e.seq or c.pos + c.length > e.lake.footer_pos
                   for c in e.chunks):
                raise ValueError("a row group of the lake file lies outside it or is named "
                                 "for another segment")
