"""Where a new segment goes: the first local tier with room whose filesystem is not full.

A remote tier never takes appends. A tier whose filesystem answered ENOSPC (or EDQUOT) is
skipped until it has room for two segments again, so a full disk costs one failed write,
not one per append.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from .errors import StoreFull
from .tiers import NO_SPACE, SegmentWriter, Tier

log = logging.getLogger(__name__)


class Placement:
    """The placement rule over a store's tiers (one per store handle; thread-safe enough:
    the out-of-space set only ever loses or gains whole tier numbers)."""

    def __init__(self, root: str, tiers: list[Tier]):
        self.root = root
        self.tiers = tiers
        self._no_space: set[int] = set()

    def place(self, topic: str, partition: int, seq: int, need: int, used: Mapping[int, int],
              durable: bool = True) -> tuple[Tier, SegmentWriter]:
        """Create segment ``seq`` on the first local tier with room, given ``used`` bytes
        per tier; :class:`StoreFull` naming every tier when none has room."""
        for t in self.tiers:
            if t.is_remote or self._out_of_space(t, need):
                continue
            if not t.has_room(used.get(t.number, 0), need):
                continue
            try:
                w = t.create_segment(topic, partition, seq, need, durable)
            except OSError as e:
                if e.errno not in NO_SPACE:
                    raise
                self.mark_out_of_space(t, e)
                self._release_partial(t, topic, partition, seq)
                continue
            if w is not None:
                return t, w
        usage = "; ".join(self._tier_line(t, used.get(t.number, 0)) for t in self.tiers)
        raise StoreFull(
            f"no local tier has room for a new segment of topic {topic!r} partition "
            f"{partition} ({need} bytes): {usage}. Run the migration service (pafka migrate "
            f"{self.root} --follow, or pafka_source.start_migration) or speed it up "
            "(storage.migrate.threads, storage.migrate.bytes.per.second), lower "
            "log.retention.bytes/ms, or resize a tier (pafka resize)")

    @staticmethod
    def _release_partial(t: Tier, topic: str, partition: int, seq: int) -> None:
        """Remove what a segment creation that hit a full filesystem left on ``t`` (an
        empty file, a pool file taken): nothing references segment ``seq`` there yet (new
        numbers only grow, under the partition's lock), and the segment is made elsewhere."""
        try:
            t.release_segment(t.segment_path(topic, partition, seq))
        except OSError as e:
            log.warning("tier %d (%s): could not remove the unfinished segment %d of topic "
                        "%r partition %d: %s", t.number, t.path, seq, topic, partition, e)

    def _tier_line(self, t: Tier, used: int) -> str:
        line = (f"tier {t.number} ({t.type}, {t.path}): {used} of "
                f"{t.capacity or 'unbounded'} bytes used")
        pool = t.free_pool_files()
        if pool is not None:
            line += f", {pool} free pool files"
        if t.is_remote:
            line += ", remote (takes sealed segments from the migration service only)"
        elif t.number in self._no_space:
            line += f", its filesystem is full ({t.free_bytes()} bytes free)"
        return line

    def mark_out_of_space(self, tier: Tier, error: OSError) -> None:
        """Record that ``tier``'s filesystem answered ENOSPC: new segments skip it until
        its filesystem has room for a segment again."""
        if tier.number not in self._no_space:
            log.warning("tier %d (%s) is out of space (%s): new segments go to the next "
                        "local tier with room until space returns", tier.number, tier.path,
                        os.strerror(error.errno or 0))
        self._no_space.add(tier.number)

    def _out_of_space(self, tier: Tier, need: int) -> bool:
        if tier.number not in self._no_space:
            return False
        free = tier.free_bytes()
        if free is not None and free >= 2 * max(need, tier.segment_bytes):
            self._no_space.discard(tier.number)
            log.info("tier %d (%s) has room again (%d bytes free)", tier.number, tier.path,
                     free)
            return False
        return True


__all__ = ["Placement"]
