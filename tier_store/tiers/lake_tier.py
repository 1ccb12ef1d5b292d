"""The lake tier: the last tier, where a topic's oldest segments become a Delta Lake table.

It holds no segment files. A segment demoted here is rewritten as one Parquet file of the
topic incarnation's table (:mod:`tier_store.lake`) and committed to the table
(:mod:`tier_store.lake_table`); its row groups are the segment's chunks in the log. Nothing
appends here, nothing is promoted out, and nothing the log drops is deleted from here:
retention removes lake segments from the log only, and the table keeps their rows.

The root is a directory or an fsspec URL (``s3://bucket/lake``). A local file is read by
a memory map, as segments are (a link as the file's own name is refused; links among the
directories above it are followed, as the operator made them); a remote one by ranged
reads.
"""

from __future__ import annotations

import os
import posixpath
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..config import TierSpec
from ..errors import PafkaError
from ..lake import file_rel, table_name, write_local
from ..layout import is_url
from ..segment import SegmentHeader
from .base import SegmentWriter, Tier


class LakeTier(Tier):
    """Tier ``spec.number``: Delta tables under ``spec.path``, one per topic incarnation."""

    is_lake = True

    def __init__(self, spec: TierSpec, segment_bytes: int):
        super().__init__(spec, segment_bytes)
        self.url = is_url(spec.path)
        self.local = not self.url
        # Open tables by topic id, most recently used last: kept by
        # :func:`tier_store.maintenance.demote.lake_table`, so that a demotion reads the
        # commits since the last one, not the whole table.
        self.tables: OrderedDict[str, Any] = OrderedDict()
        self.tables_lock = threading.Lock()

    def prepare(self) -> None:
        import importlib.util
        if importlib.util.find_spec("deltalake") is None:  # said at open, not at a demotion
            raise PafkaError(f"tier {self.number} is a LAKE tier, which needs the deltalake "
                             "package: pip install 'pafka-spark[lake]'")
        if not self.url:
            os.makedirs(self.path, exist_ok=True)

    def table_uri(self, topic: str, topic_id: str) -> str:
        """Where the table of a topic incarnation lives."""
        join = posixpath.join if self.url else os.path.join
        return join(self.path, table_name(topic, topic_id))

    def file_path(self, topic: str, topic_id: str, partition: int, first: int, last: int
                  ) -> str:
        """The Parquet file of ``partition``'s segments ``first`` to ``last`` (sequences; a
        path from checked integers only)."""
        join = posixpath.join if self.url else os.path.join
        return join(self.table_uri(topic, topic_id), *file_rel(partition, first, last).split("/"))

    def write_file(self, path: str, data: pa.Buffer) -> None:
        """Write a lake file whole; durable on return (its Delta commit comes next)."""
        self.charge_write(len(data))
        if not self.url:
            write_local(path, data)
            return
        from .remote import filesystem
        fs, p = filesystem(path)
        fs.makedirs(posixpath.dirname(p), exist_ok=True)
        with fs.open(p, "wb") as f:
            f.write(memoryview(data))

    def read_range(self, path: str, pos: int, length: int) -> pa.Buffer:
        """Bytes ``[pos, pos + length)`` of a lake file; ``FileNotFoundError`` if it is gone,
        :class:`~tier_store.errors.CorruptSegment` if it is not a regular file of the tier."""
        if self.url:
            from .remote import read_range
            return read_range(path, pos, length)
        fd = self.open_inside(path, os.O_RDONLY)
        try:
            return pa.py_buffer(os.pread(fd, length, pos))
        finally:
            os.close(fd)

    def file_size(self, path: str) -> int:
        if self.url:
            from .remote import filesystem
            fs, p = filesystem(path)
            return int(fs.size(p))
        fd = self.open_inside(path, os.O_RDONLY)
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        if self.url:
            from .remote import filesystem
            fs, p = filesystem(path)
            return bool(fs.exists(p))
        return os.path.exists(path)

    # -- what a segment tier does, and a lake never ---------------------------------------
    def has_room(self, used: int, need: int) -> bool:
        return False  # no appends: placement never puts a new segment here

    def create_segment(self, topic: str, partition: int, seq: int, min_bytes: int,
                       durable: bool = True) -> SegmentWriter | None:
        return None

    def open_segment(self, path: str) -> SegmentWriter:
        raise PafkaError(f"{path}: a lake tier holds Parquet files; nothing appends there")

    def release_segment(self, path: str) -> None:
        """Nothing: the table keeps a lake segment's rows when the log drops it."""

    def delete_topic(self, topic: str) -> None:
        """Nothing: a deleted topic's table stays unless purged on purpose."""

    def read_header(self, path: str) -> SegmentHeader | None:
        return None

    def free_bytes(self) -> int | None:
        return None

    def partition_files(self, topic: str) -> Iterator[tuple[int, str, str, float]]:
        """None: garbage collection and checks of segment files never look in a table."""
        return iter(())

    def storage_options(self) -> dict[str, Any] | None:
        """delta-rs's options for the root's object store (None for a directory)."""
        if not self.url or not self.path.startswith("s3://"):
            return None
        from ..awsenv import delta_storage_options
        return delta_storage_options()


__all__ = ["LakeTier"]
