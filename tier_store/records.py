"""Small value types the store hands out: chunk references, append results, segment info."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from .segment import CHUNK_ALIGN, HEADER_SIZE


@dataclass(frozen=True)
class ChunkRef:
    """A chunk written durably by :meth:`Topic.write_chunks` and not yet committed.

    Picklable and JSON-friendly (:meth:`to_dict`), so that executors can hand it to the
    process that commits.
    """

    topic: str
    partition: int
    seq: int  # segment sequence number within the partition
    tier: int
    pos: int
    length: int
    records: int
    checksum: int
    written_ms: int
    tmin: int | None = None
    tmax: int | None = None
    # How many times the store had relocated the chunk's tier when the chunk was written: a
    # commit is refused once the tier was relocated since (and when it is not recorded).
    relocation: int | None = None
    # The incarnation of the topic the chunk was written to: a commit into a topic deleted
    # and created again since is refused (and one not naming it).
    topic_id: str | None = None
    # On a store shared by many hosts (see :meth:`Topic.share`): the writing host, and the
    # shared object holding the chunk at byte ``opos`` once uploaded.
    host: str | None = None
    obj: str | None = None
    opos: int | None = None
    shared_ms: int | None = None  # when the object was uploaded (the writer's clock)
    st: dict[str, Any] | None = None  # column statistics (tier_store.stats)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ChunkRef:
        return cls(**d)


class AppendResult(NamedTuple):
    """Where committed records landed: their partition, first offset and count. A named
    tuple: a commit makes one per chunk, and a frozen dataclass's init costs more."""

    partition: int
    base_offset: int
    records: int
    version: int
    timestamp: int


@dataclass(frozen=True)
class SegmentInfo:
    """A committed segment as the log knows it."""

    id: str
    topic: str
    partition: int
    base_offset: int
    end_offset: int
    records: int
    bytes: int
    chunks: int
    tier: int
    tier_type: str
    path: str
    sealed: bool
    first_timestamp: int
    last_timestamp: int
    # False while the file holds chunks written but not committed yet (a writer may still
    # commit them) that are younger than log.cleanup.grace.ms: such a segment waits to move.
    settled: bool = True
    # The chunks' lengths packed as a move lays them out: each aligned but the last (0: not
    # known).
    aligned_bytes: int = 0

    @property
    def file_bytes(self) -> int:
        """The bytes a file holding just this segment's chunks takes, as a move lays them
        out: the header and the chunks, each aligned but the last (a bound from the chunk
        count when their lengths are not known). Any more would keep a segment its writer
        filled from ever fitting a pool file again."""
        if self.aligned_bytes:
            return HEADER_SIZE + self.aligned_bytes
        return HEADER_SIZE + self.bytes + self.chunks * (CHUNK_ALIGN - 1)
