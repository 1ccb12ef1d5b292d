"""The store's exceptions: one hierarchy, each message naming the thing at fault and the fix."""

from __future__ import annotations


class PafkaError(Exception):
    """Base of every error the store raises on purpose."""


class InvalidArgument(PafkaError, ValueError):
    """An argument of a call is of the wrong type or out of range; the message names it and
    what is allowed."""


class ConfigError(PafkaError, ValueError):
    """A configuration key or value is unknown, out of range, or conflicts with the saved one."""


class StoreNotFound(PafkaError, LookupError):
    """No store at the given root (no ``_store.json``), and the caller asked not to create
    one."""


class TopicNotFound(PafkaError, LookupError):
    """The named topic does not exist in the store."""


class TopicDeleted(TopicNotFound):
    """The topic (the incarnation a handle, a plan or an offset names) was deleted; a topic
    of the same name may exist now, with another id."""


class TopicExists(PafkaError):
    """A topic of that name already exists."""


class SchemaMismatch(PafkaError, ValueError):
    """Data written to a topic does not match the topic's schema."""


class CommitConflict(PafkaError):
    """A commit lost a race that it cannot retry (its chunks were moved, merged or deleted)."""


class SegmentNotMovable(PafkaError):
    """A move or merge was asked for segments that cannot take part: unknown, active, of
    several partitions, not adjacent, or a target that cannot hold them."""


class TierRelocated(PafkaError):
    """Data was written to a tier's old place, and the store has relocated the tier since:
    that data stays invisible; open the store again and write again."""


class StoreFull(PafkaError):
    """No tier has room for a new segment, or a filesystem the store writes (a tier's, the
    commit log's) is full: the write did not happen and left nothing behind."""


class StoreUnavailable(PafkaError, OSError):
    """The object store holding the root did not answer within the retry budget, or refused
    a request outright (access denied, no such bucket): the message names the bucket, the
    key and what failed. A write's outcome is then unknown: read to find out."""


class DataLoss(PafkaError):
    """Requested records are gone: deleted by retention, or their segment file is missing."""


class CorruptSegment(PafkaError):
    """A chunk's bytes do not match the checksum recorded when it was written, or a segment
    file's header does not name the segment."""


class CorruptLog(PafkaError):
    """A commit-log entry or checkpoint is malformed, or the log's versions do not follow
    one another: the file is named."""


class CorruptState(PafkaError):
    """A file of the store's own state (``_store.json``, a tier claim, ``_migration.json``)
    is malformed: the file is named."""


class PmemUnavailable(PafkaError, OSError):
    """libpmem could not be loaded."""
