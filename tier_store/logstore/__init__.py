"""Where a topic's commit log keeps its bytes: the :class:`LogStore` contract and its
implementations."""

from __future__ import annotations

from .base import Blob, LogFile, LogStore
from .objects import ObjectLogStore
from .posix import PosixLogStore

__all__ = ["Blob", "LogFile", "LogStore", "ObjectLogStore", "PosixLogStore"]
