"""Commit-log entry kinds: frozen dataclasses with one JSON encode/decode pair.

Each entry is one JSON object with a ``kind`` and the commit time ``ts`` (ms, monotonic per
topic). Python names here; the on-disk JSON uses shorter names for a few fields (``p``, ``len``,
``n``, ``crc``), mapped only in :meth:`Entry.encode` and :func:`decode`.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from .errors import CorruptLog


def schema_to_text(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# Python names of fields whose on-disk names are shorter: only encode and decode use these.
_DISK_NAMES = {"partition": "p", "length": "len", "records": "n", "checksum": "crc"}
_PY_NAMES = {v: k for k, v in _DISK_NAMES.items()}


def _to_disk(fields: dict[str, Any]) -> dict[str, Any]:
    return {_DISK_NAMES.get(k, k): v for k, v in fields.items()}


def _from_disk(fields: dict[str, Any]) -> dict[str, Any]:
    return {_PY_NAMES.get(k, k): v for k, v in fields.items()}


@dataclass(frozen=True)
class ChunkRecord:
    """A committed chunk: where it lives, which offsets it holds, and its checksum."""

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


@dataclass(frozen=True)
class Entry:
    kind: ClassVar[str] = ""
    ts: int

    def encode(self) -> bytes:
        body = {"kind": self.kind, **_to_disk(asdict(self))}
        if "chunks" in body:
            body["chunks"] = [_to_disk(c) for c in body["chunks"]]
        return json.dumps(body, separators=(",", ":")).encode()


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
class ConfigEntry(Entry):
    kind: ClassVar[str] = "config"
    config: dict[str, Any]


@dataclass(frozen=True)
class MoveEntry(Entry):
    """Sealed segments ``sources`` now live as segment ``seq`` of ``p`` on ``tier``."""

    kind: ClassVar[str] = "move"
    partition: int
    sources: tuple[int, ...]  # sequence numbers of the segments replaced
    seq: int
    tier: int
    chunks: tuple[ChunkRecord, ...]  # the chunks' new positions


KINDS: dict[str, type[Entry]] = {
    c.kind: c for c in (CreateEntry, AppendEntry, DeleteEntry, PartitionsEntry, PositionEntry,
                        ConfigEntry, MoveEntry)
}


def decode(data: bytes, where: str) -> Entry:
    """Decode one entry; a malformed one raises naming the file."""
    try:
        body = _from_disk(json.loads(data))
        cls = KINDS[body.pop("kind")]
        if "chunks" in body:
            body["chunks"] = tuple(ChunkRecord(**_from_disk(c)) for c in body["chunks"])
        for name in ("segments", "sources"):
            if name in body:
                body[name] = tuple(body[name])
        return cls(**body)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptLog(f"commit-log entry {where} is malformed: {e!r}") from None
