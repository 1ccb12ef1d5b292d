"""The remote tier: sealed segments on any fsspec filesystem (S3, GCS, HDFS, file://, ...).

Appends never go there: a segment arrives whole, written by a move, and is read by ranged
reads. Object stores have no exclusive rename, so a move checks that the name is free and
then writes the object in one piece (a write is visible only once complete, and durable: a
completed PUT is). On a local filesystem (``file://``), whose writes are neither, a segment is
written to a temporary file, fsynced and renamed, and its directory (with every new
directory's parent) fsynced, before the move entry that names it can be published.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from ..errors import PafkaError
from ..layout import fsync_dir, makedirs_durable, segment_relpath, write_temp
from ..segment import HEADER_SIZE, SegmentHeader
from .base import SegmentWriter, Tier

_filesystems: dict[str, Any] = {}


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path without protocol) for ``url``; unknown protocols name the
    package to install. One per AWS environment: s3fs reads its endpoint and keys from it."""
    import fsspec
    try:
        fs, path = fsspec.core.url_to_fs(url, **_env_kwargs(url))
    except (ImportError, ValueError) as e:
        raise PafkaError(f"cannot open remote tier {url!r}: {e} (install the fsspec "
                         "implementation for its protocol, e.g. s3fs or gcsfs)") from None
    return fs, path


def _env_kwargs(url: str) -> dict[str, Any]:
    """For s3:// URLs, a keyword fsspec keys its instance cache on: the AWS environment."""
    if not url.startswith("s3://"):
        return {}
    from ..awsenv import aws_environment
    return {"config_kwargs": {"user_agent_extra": f"pafka-{aws_environment()[:16]}"}}


def read_range(url: str, pos: int, length: int) -> pa.Buffer:
    """Bytes ``[pos, pos + length)`` of a remote file, by a ranged read."""
    from ..awsenv import aws_environment
    proto = url.split("://", 1)[0]
    key = f"{proto}:{aws_environment()}"
    fs = _filesystems.get(key)
    if fs is None:
        fs = _filesystems[key] = filesystem(url)[0]
    try:
        data = fs.cat_file(url, start=pos, end=pos + length)
    except FileNotFoundError:
        raise
    except OSError as e:
        if "not found" in str(e).lower() or "no such" in str(e).lower():
            raise FileNotFoundError(url) from None
        raise
    return pa.py_buffer(data)


class RemoteTier(Tier):
    """A tier on an fsspec URL holding sealed segments only."""

    local = False

    def __init__(self, spec: Any, segment_bytes: int):
        super().__init__(spec, segment_bytes)
        self.fs, self.base = filesystem(spec.path)
        from fsspec.implementations.local import LocalFileSystem
        self._on_local_fs = isinstance(self.fs, LocalFileSystem)

    def segment_path(self, topic: str, partition: int, seq: int) -> str:
        rel = segment_relpath(topic, partition, seq).replace("\\", "/")
        return self.fs.unstrip_protocol(posixpath.join(self.base, rel))

    def prepare(self) -> None:
        if self._on_local_fs:
            makedirs_durable(self.base)
        else:
            self.fs.makedirs(self.base, exist_ok=True)

    def has_room(self, used: int, need: int) -> bool:
        return False  # appends need a local tier

    def create_segment(self, topic: str, partition: int, seq: int, min_bytes: int,
                       durable: bool = True) -> SegmentWriter | None:
        return None

    def open_segment(self, path: str) -> SegmentWriter:
        raise PafkaError(f"{path}: segments on a remote tier are sealed; nothing appends there")

    def delete_topic(self, topic: str) -> None:
        """Delete every object of ``topic`` on this tier (a deleted topic's)."""
        prefix = f"{self.path.rstrip('/')}/{topic}"
        try:
            if self.fs.exists(prefix):
                self.fs.rm(prefix, recursive=True)
        except FileNotFoundError:
            return

    def release_segment(self, path: str) -> None:
        try:
            self.fs.rm(path)
        except FileNotFoundError:
            pass

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def write_whole(self, path: str, data: pa.Buffer) -> None:
        """Write a whole segment; durable on return (the move entry naming it comes next).
        Charged to the tier's throttle (:meth:`charge_write`) first."""
        self.charge_write(len(data))
        if self._on_local_fs:
            local = self.fs._strip_protocol(path)
            d = os.path.dirname(local)
            makedirs_durable(d)
            # A crash leaves at worst a temp file, which garbage collection reclaims.
            os.replace(write_temp(d, memoryview(data)), local)
            fsync_dir(d)
            return
        self.fs.makedirs(posixpath.dirname(self.fs._strip_protocol(path)), exist_ok=True)
        with self.fs.open(path, "wb") as f:
            f.write(memoryview(data))

    def read_header(self, path: str) -> SegmentHeader | None:
        try:
            return SegmentHeader.unpack(read_range(path, 0, HEADER_SIZE).to_pybytes(), path)
        except FileNotFoundError:
            return None

    def file_size(self, path: str) -> int:
        return int(self.fs.size(path))

    def partition_files(self, topic: str) -> Iterator[tuple[int, str, str, float]]:
        tdir = posixpath.join(self.base, topic)
        if not self.fs.exists(tdir):
            return
        for pdir in self.fs.ls(tdir, detail=False):
            pname = posixpath.basename(pdir.rstrip("/"))
            if not pname.isdigit():
                continue
            for info in self.fs.ls(pdir, detail=True):
                name = posixpath.basename(info["name"].rstrip("/"))
                mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
                ts = mtime.timestamp() if hasattr(mtime, "timestamp") else float(mtime or 0)
                yield int(pname), name, self.fs.unstrip_protocol(info["name"]), ts

    def write_parts(self, path: str, parts: Iterable[bytes], total: int) -> None:
        """Write an object of ``total`` bytes from ``parts``, streamed (large ones go up in
        several requests and appear whole, on completion); durable on return."""
        self.charge_write(total)
        if self._on_local_fs:
            local = self.fs._strip_protocol(path)
            d = os.path.dirname(local)
            makedirs_durable(d)
            tmp = write_temp(d, b"".join(parts))
            os.replace(tmp, local)
            fsync_dir(d)
            return
        written = 0
        with self.fs.open(path, "wb") as f:
            for part in parts:
                f.write(part)
                written += len(part)
        if written != total:
            raise PafkaError(f"{path}: wrote {written} bytes, expected {total}")
