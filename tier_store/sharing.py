"""Write-through to the shared tier, for a store shared by many hosts.

A store is shared when its root is on S3 and its last tier is REMOTE: every host then has
its own tier 1 at the same path, and the REMOTE tier is the one every host reaches. Before
a write task hands its chunks to the committer, :func:`share` uploads them all, for every
partition the task touched, as **one object** (a *bundle*) on the shared tier. The commit
names each chunk's bundle and position, so committed data survives the loss of any host,
and any host can read it. The writer's own copy stays on its tier 1 as a cache, read when
the reader runs on that host.

Bundles are named by 32 random hex digits, validated wherever a log names one, under
``<shared tier>/<topic>/_bundles/<incarnation>/``. The migration service later copies a
segment's chunks out of the bundles into one segment on the shared tier (a ``move``), and
a bundle no chunk names any more is deleted after two grace periods
(``log.cleanup.grace.ms``; :mod:`tier_store.maintenance.bundles`), as is one a task uploaded
and never committed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from .chunk import checksum
from .crash import crash_point
from .errors import CommitConflict, CorruptLog, CorruptSegment, DataLoss, InvalidArgument
from .ids import check_bundle, host_id, host_seqs
from .ownership.hosts import host_number
from .records import ChunkRef

if TYPE_CHECKING:
    from .ownership import RootFiles
    from .tiers import Tier

log = logging.getLogger(__name__)

BUNDLES_DIR = "_bundles"
_INCARNATION = re.compile(r"[0-9a-f]{32}")
BUNDLE_SUFFIX = ".chunks"


@dataclasses.dataclass(frozen=True)
class SharedTier:
    """What a shared store's hosts have in common: the shared tier, and this host's id and
    number (its segments' numbers lie in :attr:`seqs`)."""

    tier: Tier
    host: str
    number: int

    @classmethod
    def of(cls, files: RootFiles, tiers: list[Tier]) -> SharedTier:
        """The shared tier of the store whose root ``files`` holds (its last tier), this
        host numbered in that root."""
        here = host_id()
        return cls(tiers[-1], here, host_number(files.objects, here))  # type: ignore[attr-defined]

    @property
    def seqs(self) -> range:
        """The segment numbers this host gives its segments."""
        return host_seqs(self.number)

    def bundle_dir(self, topic: str, incarnation: str) -> str:
        """Where topic ``topic``'s incarnation ``incarnation`` keeps its bundles (the id read
        from its log: 32 hex digits, checked before it names a place)."""
        if not _INCARNATION.fullmatch(incarnation):
            raise CorruptLog(f"topic {topic!r}: its id {incarnation!r} is not 32 lowercase hex "
                             "digits; its shared objects cannot be named")
        return posixpath.join(self.tier.path.rstrip("/"), topic, BUNDLES_DIR, incarnation)

    def bundle_url(self, topic: str, incarnation: str, obj: str) -> str:
        """The URL of bundle ``obj`` (validated) of the topic's incarnation."""
        return f"{self.bundle_dir(topic, incarnation)}/{check_bundle(obj)}{BUNDLE_SUFFIX}"


def _chunk_bytes(tier: Tier, path: str, r: ChunkRef) -> bytes:
    """A written chunk's bytes from its segment file, checked against its checksum."""
    try:
        fd = tier.open_inside(path, os.O_RDONLY)  # type: ignore[attr-defined]
    except FileNotFoundError:
        raise DataLoss(f"topic {r.topic!r} partition {r.partition}: {path}, where the chunk "
                       "was written, is gone (its tier 1 lost?); it cannot be shared. Write "
                       "the batch again") from None
    try:
        data = os.pread(fd, r.length, r.pos)
    finally:
        os.close(fd)
    if len(data) != r.length or checksum(memoryview(data)) != r.checksum:
        raise CorruptSegment(f"topic {r.topic!r} partition {r.partition}: the chunk written at "
                             f"byte {r.pos} of {path} no longer matches its checksum; it "
                             "cannot be shared. Write the batch again")
    return data


def share(shared: SharedTier, incarnation: str, refs: Sequence[ChunkRef],
          tier: Callable[[int], Tier]) -> list[ChunkRef]:
    """Upload the chunks of ``refs`` not shared yet as one bundle; returns ``refs`` with
    each chunk's bundle and position (in the same order). ``tier(n)`` gives tier ``n``. Only
    chunks written on this host can be shared here (:class:`InvalidArgument` otherwise)."""
    todo = [r for r in refs if r.obj is None]
    if not todo:
        return list(refs)
    for r in todo:
        if r.host not in (None, shared.host):
            raise InvalidArgument(f"topic {r.topic!r}: a chunk written on host {r.host} can "
                                  f"only be shared there, not on {shared.host}")
    obj = uuid.uuid4().hex
    url = shared.bundle_url(todo[0].topic, incarnation, obj)
    at: dict[int, int] = {}
    pos = 0
    for i, r in enumerate(todo):
        at[i] = pos
        pos += r.length

    def parts() -> Iterator[bytes]:
        for r in todo:
            t = tier(r.tier)
            yield _chunk_bytes(t, t.segment_path(r.topic, r.partition, r.seq), r)

    shared.tier.write_parts(url, parts(), pos)  # type: ignore[attr-defined]
    crash_point("share.uploaded")
    log.debug("shared %d chunks (%d bytes) of topic %s as %s", len(todo), pos, todo[0].topic,
              url)
    now = int(time.time() * 1000)
    done = {id(r): dataclasses.replace(r, host=shared.host, obj=obj, opos=at[i], shared_ms=now)
            for i, r in enumerate(todo)}
    return [done.get(id(r), r) for r in refs]




def check_fresh(refs: Sequence[ChunkRef], grace_ms: int, now_ms: int) -> None:
    """:class:`CommitConflict` for a chunk shared longer than ``grace_ms`` ago: its object
    may be reclaimed as never committed (``log.cleanup.grace.ms`` must exceed any batch)."""
    for r in refs:
        if r.shared_ms is not None and now_ms - r.shared_ms > grace_ms:
            raise CommitConflict(
                f"topic {r.topic!r} partition {r.partition}: the chunk was shared "
                f"{(now_ms - r.shared_ms) / 1000:.0f} s ago, longer than log.cleanup.grace.ms "
                f"({grace_ms / 1000:.0f} s): its object may be reclaimed as never committed. "
                "Write the batch again, or raise log.cleanup.grace.ms above the longest batch")


__all__ = ["BUNDLES_DIR", "BUNDLE_SUFFIX", "SharedTier", "check_fresh", "share"]
