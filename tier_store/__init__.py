"""Pafka's tier store: typed topics as logs of Arrow IPC chunks in segments on tiered storage.

>>> from tier_store import Store
>>> store = Store.open("pafka-data")                                  # doctest: +SKIP
>>> topic = store.create_topic("clicks", schema, partitions=4)        # doctest: +SKIP
>>> topic.append(batch)                                               # doctest: +SKIP
>>> for b in topic.read(0, 0): ...                                    # doctest: +SKIP
"""

from __future__ import annotations

from .errors import (
    CommitConflict,
    ConfigError,
    CorruptSegment,
    DataLoss,
    PafkaError,
    PmemUnavailable,
    SchemaMismatch,
    StoreFull,
    TopicDeleted,
    TopicExists,
    TopicNotFound,
)
from .records import AppendResult, ChunkRef, SegmentInfo
from .relocate import Relocation, relocate_tier
from .store import Store
from .topic import Topic

__version__ = "0.1.0"

__all__ = [
    "AppendResult",
    "ChunkRef",
    "CommitConflict",
    "ConfigError",
    "CorruptSegment",
    "DataLoss",
    "PafkaError",
    "PmemUnavailable",
    "Relocation",
    "SchemaMismatch",
    "SegmentInfo",
    "Store",
    "StoreFull",
    "Topic",
    "TopicDeleted",
    "TopicExists",
    "TopicNotFound",
    "__version__",
    "relocate_tier",
]
