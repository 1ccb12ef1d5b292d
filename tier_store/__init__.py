"""Pafka's tier store: typed topics as logs of Arrow IPC chunks in segments on tiered storage.

>>> from tier_store import Store
>>> store = Store.open("pafka-data")                                  # doctest: +SKIP
>>> topic = store.create_topic("clicks", schema, partitions=4)        # doctest: +SKIP
>>> topic.append(batch)                                               # doctest: +SKIP
>>> for b in topic.read(0, 0): ...                                    # doctest: +SKIP
"""

from __future__ import annotations

from .config import KEYS as CONFIG_KEYS
from .config import ConfigKey, StoreConfig, key_for, load_config, parse_config, parse_size, tier_key
from .consumer import Consumer
from .errors import (
    CommitConflict,
    ConfigError,
    CorruptLog,
    CorruptSegment,
    CorruptState,
    DataLoss,
    InvalidArgument,
    PafkaError,
    PmemUnavailable,
    SchemaMismatch,
    SegmentNotMovable,
    StoreFull,
    StoreNotFound,
    StoreUnavailable,
    TierRelocated,
    TopicDeleted,
    TopicExists,
    TopicNotFound,
)
from .follow import FetchedBatch
from .hashing import hash_keys, partition_of
from .ids import SegmentId, host_id
from .layout import STORE_FILE, check_topic_name
from .maintenance.check import CheckReport, check_topic
from .maintenance.demote import lake_summary
from .maintenance.idle import seal_idle
from .maintenance.lake_retention import apply_lake_retention, purge_lake
from .maintenance.moves import MoveResult, OldCopyInGrace
from .ownership import Relocation, relocate_tier
from .ownership.roots import root_location
from .pins import MAPS
from .reading import PlannedChunk, ReadPlan, SkipCorrupt, execute, read_counts, skip_warning
from .records import AppendResult, ChunkRef, SegmentInfo
from .schemas import Adapter as SchemaAdapter
from .schemas import changes as schema_changes
from .schemas import history as schema_history
from .schemas import merge as merge_schemas
from .schemas import selected as select_columns
from .segment import CHUNK_ALIGN
from .segment import HEADER_SIZE as SEGMENT_HEADER_SIZE
from .sharing import SharedTier
from .stats import ChunkFilter, chunk_filter
from .stats import compute as chunk_statistics
from .store import Store
from .tables import as_table, check_valid, conform, loose_type
from .tiers import throttle_tier_writes
from .topic import Topic
from .topic_config import TOPIC_KEYS as TOPIC_CONFIG_KEYS
from .topic_config import check_topic_config, topic_key, unset_key

__version__ = "0.1.0"

__all__ = [
    "CONFIG_KEYS",
    "TOPIC_CONFIG_KEYS",
    "MAPS",
    "CHUNK_ALIGN",
    "SEGMENT_HEADER_SIZE",
    "STORE_FILE",
    "AppendResult",
    "CheckReport",
    "ChunkRef",
    "CommitConflict",
    "Consumer",
    "ConfigError",
    "ConfigKey",
    "CorruptLog",
    "CorruptSegment",
    "CorruptState",
    "DataLoss",
    "FetchedBatch",
    "InvalidArgument",
    "MoveResult",
    "OldCopyInGrace",
    "PafkaError",
    "PlannedChunk",
    "PmemUnavailable",
    "ReadPlan",
    "SkipCorrupt",
    "Relocation",
    "SchemaMismatch",
    "ChunkFilter",
    "SegmentId",
    "SharedTier",
    "SegmentInfo",
    "SegmentNotMovable",
    "Store",
    "StoreConfig",
    "StoreFull",
    "StoreNotFound",
    "StoreUnavailable",
    "TierRelocated",
    "Topic",
    "TopicDeleted",
    "TopicExists",
    "TopicNotFound",
    "__version__",
    "as_table",
    "chunk_filter",
    "chunk_statistics",
    "check_valid",
    "check_topic",
    "check_topic_config",
    "check_topic_name",
    "conform",
    "execute",
    "hash_keys",
    "key_for",
    "load_config",
    "loose_type",
    "parse_config",
    "parse_size",
    "partition_of",
    "relocate_tier",
    "root_location",
    "seal_idle",
    "skip_warning",
    "throttle_tier_writes",
    "tier_key",
    "topic_key",
    "unset_key",
    "host_id",
    "lake_summary",
    "apply_lake_retention",
    "purge_lake",
    "read_counts",
    "merge_schemas",
    "schema_changes",
    "schema_history",
    "select_columns",
    "SchemaAdapter",
]
