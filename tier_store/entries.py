"""Commit-log entry kinds: frozen dataclasses with one JSON encode/decode pair.

Each entry is one JSON object with a ``kind`` and the commit time ``ts`` (ms, monotonic per
topic). Field names here are the on-disk names.
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


@dataclass(frozen=True)
class ChunkRecord:
    """A committed chunk: where it lives, which offsets it holds, and its checksum."""

    p: int  # partition
    seq: int  # segment sequence within the partition
    tier: int
    pos: int  # byte position in the segment
    len: int  # bytes
    base: int  # offset of its first record
    n: int  # records
    crc: int  # xxh3-64 of its bytes
    tmin: int | None = None  # event-time min/max (ms) when the writer named a column
    tmax: int | None = None


@dataclass(frozen=True)
class Entry:
    kind: ClassVar[str] = ""
    ts: int

    def encode(self) -> bytes:
        body = {"kind": self.kind, **asdict(self)}
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
    p: int
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
        body = json.loads(data)
        cls = KINDS[body.pop("kind")]
        if "chunks" in body:
            body["chunks"] = tuple(ChunkRecord(**c) for c in body["chunks"])
        for name in ("segments", "sources"):
            if name in body:
                body[name] = tuple(body[name])
        return cls(**body)
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptLog(f"commit-log entry {where} is malformed: {e!r}") from None
