"""What a topic needs from the store that holds it, declared as a protocol.

The store is the composition root (as Kafka's LogManager is): it builds topics, places
segments, owns the locks and runs maintenance. A :class:`~tier_store.topic.Topic` and the
maintenance operations see it only through :class:`TopicHost`, so that they never import
the store, and the store can change how it keeps its state (a local directory today, an
object store next) without touching them.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .sharing import SharedTier
    from .tiers import SegmentWriter, Tier
    from .topic import Topic


class TopicHost(Protocol):
    """The store's services for its topics."""

    root: str  # a directory, or an s3:// URL
    tiers: list[Tier]

    @property
    def shared(self) -> SharedTier | None:
        """On a store shared by many hosts, its shared tier and this host's number."""

    @property
    def config(self) -> Any:
        """The store's configuration in effect (a :class:`~tier_store.config.StoreConfig`)."""

    def tier(self, number: int) -> Tier:
        """Tier ``number`` (1 = fastest); an error naming the tiers otherwise."""

    def pointer_dir(self, topic: str, incarnation: str | None = None) -> str:
        """The local directory of the topic's partition pointers and locks on this host
        (made if missing), for incarnation ``incarnation`` (a topic's id)."""

    def partition_lock(self, topic: str, partition: int, blocking: bool = True,
                       kind: str = ...) -> AbstractContextManager[bool]:
        """The partition's writer lock (one writer at a time across processes); yields
        whether it is held (False only when ``blocking=False`` and it is busy)."""

    def used_bytes(self) -> dict[int, int]:
        """Committed bytes per tier, accounted from every topic's state."""

    def place_segment(self, topic: str, partition: int, seq: int, need: int,
                      durable: bool = True) -> tuple[Tier, SegmentWriter]:
        """Create a new segment by the placement rule; StoreFull when no tier has room."""

    def mark_out_of_space(self, tier: Tier, error: OSError) -> None:
        """Note that ``tier``'s filesystem answered ENOSPC: placement skips it a while."""

    def publishing(self, tiers: Iterable[tuple[int, int | None]] = ()
                   ) -> AbstractContextManager[None]:
        """Hold the relocation fence while publishing an entry naming data on ``tiers``
        ((tier number, relocation count the data was written under)); TierRelocated if a
        tier moved since."""

    def relocation(self, number: int) -> int:
        """How many times tier ``number`` had been relocated when the store was opened."""

    def claim_remote(self, tier: Tier) -> None:
        """Make sure remote ``tier`` is this store's before writing or deleting there."""

    def after_commit(self, topic: Topic) -> None:
        """Housekeeping after ``topic`` published a commit (checkpoint, garbage,
        retention). Never raises for the commit's sake: failures are logged."""


__all__ = ["TopicHost"]
