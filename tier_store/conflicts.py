"""Commit requirements: what must still hold when an entry is published, as typed data.

Publishing is optimistic: an entry is prepared against one version of a topic's state and
published as the next version only if no other entry won that version first. When another
did, the entry is prepared again against the newer state, and what it relied on is checked
there. Each requirement says one thing it relies on and, in :meth:`Requirement.validate`,
checks it against the state an entry is about to be published on, raising
:class:`~tier_store.errors.CommitConflict` with "expected X, found Y" naming the topic and
the segment. The writer of an entry lists its requirements; the topic checks them all in
one place, on every attempt (:meth:`~tier_store.topic.Topic.replace_segments`,
:meth:`~tier_store.topic.Topic.delete_segments`, :meth:`~tier_store.topic.Topic.commit`).

* :class:`SegmentsUnchanged`: a move's sources are as it planned them (a move conflicts
  with any entry that touched its segments).
* :class:`SegmentsCommitted`: the segments an entry replaces or deletes are committed.
* :class:`SameIncarnation`: a chunk was written to the topic's current incarnation.
* :class:`SegmentInPlace`: a chunk's segment was not moved or deleted since the chunk was
  written, and a segment not committed yet still has its file.
* :class:`ChunkNotOverwritten`: no other chunk was committed at a written chunk's place.
* :class:`ChunkWithinEnd`: the header of a written chunk's segment still covers it (its
  ``end`` did not fall below the chunk: a damaged header, or a crash that lost its update).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .errors import CommitConflict, CorruptSegment, InvalidArgument
from .layout import segment_id
from .segment import HEADER_FIELDS, SegmentHeader

if TYPE_CHECKING:
    from .records import ChunkRef
    from .state import SegmentState, TopicState
    from .tiers import Tier

log = logging.getLogger(__name__)

Planned = tuple[int, int, int]
"""What a plan saw of a segment: (tier, committed chunks, committed bytes)."""


class Requirement(Protocol):
    """Something an entry relies on, checked against the state it is published on."""

    def validate(self, state: TopicState) -> None:
        """Raise :class:`CommitConflict` unless the requirement holds in ``state``."""


def validate_all(requirements: Iterable[Requirement], state: TopicState) -> None:
    """Check every requirement against ``state``; the first that fails raises."""
    for r in requirements:
        r.validate(state)


def planned(segments: Iterable[SegmentState]) -> dict[str, Planned]:
    """What :class:`SegmentsUnchanged` compares: (tier, chunks, bytes) per segment id."""
    return {s.id: (s.tier, s.chunks, s.bytes) for s in segments}


def _describe(p: Planned) -> str:
    tier, chunks, nbytes = p
    return f"on tier {tier} with {chunks} chunks ({nbytes} bytes)"


@dataclass(frozen=True)
class SegmentsUnchanged:
    """The segments a move planned from are still committed as it saw them: same tier, same
    chunks, same bytes. Any entry that touched them since (an append, a move, a delete)
    fails it."""

    topic: str
    planned: Mapping[str, Planned]  # segment id -> (tier, chunks, bytes) when planned
    what: str = "move"  # the operation that planned, named in the message

    def validate(self, state: TopicState) -> None:
        for sid, was in self.planned.items():
            s = state.segments.get(sid)
            now = None if s is None else (s.tier, s.chunks, s.bytes)
            if now != was:
                found = "it deleted or merged away" if now is None else f"it {_describe(now)}"
                raise CommitConflict(f"topic {self.topic!r}: segment {sid} changed since the "
                                     f"{self.what} was planned: expected it {_describe(was)}, "
                                     f"found {found}")


@dataclass(frozen=True)
class SegmentsCommitted:
    """The segments an entry replaces or deletes are committed segments of the topic."""

    topic: str
    segments: tuple[str, ...]

    def validate(self, state: TopicState) -> None:
        for sid in self.segments:
            if sid not in state.segments:
                raise CommitConflict(f"topic {self.topic!r}: expected segment {sid} to be "
                                     "committed, found none (deleted or merged away since)")


@dataclass(frozen=True)
class SameIncarnation:
    """A chunk was written to the incarnation of the topic that is there now, not to one
    deleted since (a topic of the same name created again has another id)."""

    topic: str
    written_to: str  # the id the chunk's writer saw

    def validate(self, state: TopicState) -> None:
        if not self.written_to:
            raise CommitConflict(
                f"topic {self.topic!r}: expected a chunk naming the topic's id "
                f"{state.topic_id}, found one naming none: write the batch again")
        if self.written_to != state.topic_id:
            raise CommitConflict(
                f"topic {self.topic!r}: a chunk was written to an incarnation of the topic "
                f"(id {self.written_to}) that was deleted; the topic is now id "
                f"{state.topic_id}: write the batch again")


@dataclass(frozen=True)
class SegmentInPlace:
    """The segment a chunk was written to is where the chunk was written: not moved or
    deleted since, and, when no commit names it yet, its file is still on ``tier``."""

    topic: str
    partition: int
    seq: int
    tier: Tier  # the tier the chunk was written to
    # On a shared store: the host that wrote the chunk (its file is there, not here), and
    # whether the chunk is on the shared tier already.
    host: str | None = None
    shared: bool = False

    def validate(self, state: TopicState) -> None:
        sid = segment_id(self.partition, self.seq)
        seg = state.segments.get(sid)
        if seg is not None and seg.host != self.host:
            raise CommitConflict(
                f"topic {self.topic!r}: segment {sid} is host {seg.host}'s, but a chunk in it "
                f"was written on host {self.host}; write the batch again")
        number = self.tier.number
        gone = state.tombstone(sid, number) is not None and (seg is None or seg.tier != number)
        if gone or (seg is not None and seg.tier != number):
            found = "it deleted" if seg is None else f"it on tier {seg.tier}"
            raise CommitConflict(
                f"topic {self.topic!r}: segment {sid} was moved or deleted after its chunk "
                f"was written (expected it on tier {number}, found {found}); write the batch "
                "again")
        if seg is None and not self.shared:
            path = self.tier.segment_path(self.topic, self.partition, self.seq)
            if not self.tier.exists(path):
                raise CommitConflict(
                    f"topic {self.topic!r}: segment {sid} is gone from tier {number} "
                    f"({path}); write the batch again")


def _committed_at(state: TopicState, ref: ChunkRef) -> np.ndarray:
    """The chunk-index rows committed at ``ref``'s place since it was written. A chunk is
    committed after it was written, so only rows of its segment committed since then can
    hold it: a short tail of one segment's rows."""
    tail = state.part(ref.partition).chunks.committed_since(ref.seq, ref.written_ms - 1000)
    return tail[tail["pos"] == ref.pos]


@dataclass(frozen=True)
class ChunkNotOverwritten:
    """No other chunk was committed at the place a chunk was written to. The place is
    reused when the segment's uncommitted tail is recovered and appended to again: the
    chunk's bytes are gone then, and skipping it would drop its records silently."""

    topic: str
    ref: ChunkRef

    def validate(self, state: TopicState) -> None:
        self.check(_committed_at(state, self.ref))

    def check(self, same: np.ndarray) -> None:
        """:meth:`validate` given the rows committed at the chunk's place since it was
        written."""
        if not len(same):
            return
        r = self.ref
        length, crc = int(same["length"][0]), int(same["checksum"][0])
        if (length, crc) != (r.length, r.checksum):
            raise CommitConflict(
                f"topic {self.topic!r}: segment {segment_id(r.partition, r.seq)} holds another "
                f"committed chunk at {r.pos} (expected {r.length} bytes with checksum "
                f"{r.checksum:#x}, found {length} bytes with checksum {crc:#x}); this chunk "
                "was overwritten before it was committed: write the batch again")


@dataclass(frozen=True)
class ChunkWithinEnd:
    """The header of the segment chunks were written to still covers them: its ``end`` lies
    at or after ``end`` (the furthest chunk's end), and it names the segment. Chunks written
    but not committed are known only to that header; one it no longer covers can be
    overwritten by the next append, or was lost with the header's update in a crash. One
    header read per segment and commit attempt."""

    topic: str
    partition: int
    seq: int
    tier: Tier
    end: int

    def validate(self, state: TopicState) -> None:
        sid = segment_id(self.partition, self.seq)
        path = self.tier.segment_path(self.topic, self.partition, self.seq)
        try:
            fd = self.tier.open_inside(path, os.O_RDONLY)
        except FileNotFoundError:
            found = "no file"
        else:
            try:
                hdr = SegmentHeader.unpack(os.pread(fd, HEADER_FIELDS, 0), path, strict=False)
            except CorruptSegment as e:
                found = f"a header that is not the segment's ({e})"
            else:
                found = "" if (hdr.partition, hdr.seq) == (self.partition, self.seq) and \
                    hdr.end >= self.end else \
                    f"segment {hdr.partition}-{hdr.seq} ending at byte {hdr.end}"
            finally:
                os.close(fd)
        if found:
            raise CommitConflict(
                f"topic {self.topic!r}: segment {sid} ({path}) no longer holds the chunks "
                f"written to it: expected its header to end at or after byte {self.end}, "
                f"found {found}; write the batch again")


def unseen_chunks(topic: str, state: TopicState, refs: Sequence[ChunkRef]) -> list[ChunkRef]:
    """``refs`` without those already committed (a retried commit without a writer id);
    :class:`CommitConflict` for one whose place holds another chunk
    (:class:`ChunkNotOverwritten`)."""
    out = []
    for r in refs:
        if not 0 <= r.partition < state.partitions:
            raise InvalidArgument(f"topic {topic!r} has no partition {r.partition}")
        same = _committed_at(state, r)
        ChunkNotOverwritten(topic, r).check(same)
        if len(same):
            log.info("topic %s: chunk %s@%d already committed", topic,
                     segment_id(r.partition, r.seq), r.pos)
            continue
        out.append(r)
    return out


def append_requirements(topic: str, refs: Iterable[ChunkRef], tier: Callable[[int], Tier]
                        ) -> list[Requirement]:
    """What an append entry of ``refs`` relies on, per chunk: the incarnation it was written
    to, then its segment in place. ``tier(n)`` gives tier ``n``."""
    out: list[Requirement] = []
    ends: dict[tuple[int, int, int], int] = {}
    for r in refs:
        out.append(SameIncarnation(topic, r.topic_id or ""))
        out.append(SegmentInPlace(topic, r.partition, r.seq, tier(r.tier), r.host,
                                  r.obj is not None))
        if r.obj is not None:
            # Committed from the shared copy: the writer's own is a cache, checked on reads.
            continue
        key = (r.partition, r.seq, r.tier)
        ends[key] = max(ends.get(key, 0), r.pos + r.length)
    # After every chunk's segment is known in place: one header read per segment.
    out.extend(ChunkWithinEnd(topic, p, seq, tier(t), end) for (p, seq, t), end in ends.items())
    return out


__all__ = [
    "ChunkNotOverwritten",
    "ChunkWithinEnd",
    "Planned",
    "Requirement",
    "SameIncarnation",
    "SegmentInPlace",
    "SegmentsCommitted",
    "SegmentsUnchanged",
    "append_requirements",
    "planned",
    "unseen_chunks",
    "validate_all",
]
