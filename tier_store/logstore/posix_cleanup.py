"""Cleanup of a commit log in a directory (:class:`PosixLogStore`'s part).

A cleanup finds what to delete without listing the log: entries are published and deleted
in ascending order, so those present run from the lowest one present up. A checkpoint can
sit at any version, but a cleanup looks for one only at multiples of the topic's
checkpoint interval (where commits write them) and where it knows of one: those this
handle wrote or read, and those the last listing found. Looking up every version's
checkpoint name would leave one negative dentry per version in the kernel's cache, and
over millions of versions the lookups of every path slow down with them. A checkpoint
that another handle wrote elsewhere and a cleanup passed is deleted after the next
listing, which runs once per grace period (:meth:`discard_temporaries`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ..layout import CHECKPOINT_SUFFIX, TMP_PREFIX, checkpoint_name, entry_name, parse_log_name
from .base import LogFile


class PosixCleanup:
    """The cleanup methods of :class:`~tier_store.logstore.posix.PosixLogStore`."""

    path: str
    _lowest: int  # the lowest version a cleanup may find present (see expired)
    _known_checkpoints: set[int]

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.path)
        except FileNotFoundError:
            return []

    def contains(self, version: int) -> bool:
        return os.path.exists(os.path.join(self.path, entry_name(version)))

    def listing(self, below: int | None = None) -> list[LogFile]:
        found: list[tuple[int, str]] = []
        for name in self._names():
            parsed = parse_log_name(name)
            if parsed is not None and (below is None or parsed[0] < below):
                found.append((parsed[0], name))
        files = []
        for version, name in sorted(found):  # ".checkpoint" sorts before ".json"
            mtime = self._mtime(name)
            if mtime is not None:
                files.append(LogFile(version, name.endswith(CHECKPOINT_SUFFIX), mtime))
        return files

    def _mtime(self, name: str) -> float | None:
        try:
            return os.stat(os.path.join(self.path, name)).st_mtime
        except FileNotFoundError:
            return None

    def expired(self, below: int, older_than: float, aligned: int = 0) -> list[LogFile]:
        """The files from the lowest entry present up, looked at one by one until one is too
        young, after the known checkpoints below it: O(log versions + files deleted) however
        many entries the grace period keeps. The lowest entry is found by a binary search
        over the names and remembered for the next cleanup."""
        lo = self._lowest_present(below)
        known = self._known_checkpoints
        out: list[LogFile] = []
        for v in sorted(c for c in tuple(known) if c < lo):  # a copy: threads may add
            # Passed by an earlier cleanup (written by another handle): no entry is left below.
            mtime = self._mtime(checkpoint_name(v))
            if mtime is None:
                known.discard(v)
            elif mtime < older_than:
                out.append(LogFile(v, True, mtime))
        for v in range(lo, below):
            if v in known or (aligned > 0 and v % aligned == 0):
                mtime = self._mtime(checkpoint_name(v))
                if mtime is None:
                    known.discard(v)
                elif mtime >= older_than:
                    self._lowest = v
                    return self._forget(out)
                else:
                    out.append(LogFile(v, True, mtime))
            mtime = self._mtime(entry_name(v))
            if mtime is None:
                continue
            if mtime >= older_than:
                self._lowest = v
                return self._forget(out)
            out.append(LogFile(v, False, mtime))
        self._lowest = below
        return self._forget(out)

    def _forget(self, files: list[LogFile]) -> list[LogFile]:
        """``files``, their checkpoints no longer known: the caller deletes them."""
        self._known_checkpoints.difference_update(f.version for f in files if f.checkpoint)
        return files

    def _lowest_present(self, below: int) -> int:
        """The lowest version ``< below`` whose entry is present (``below`` if none)."""
        lo = min(self._lowest, below)
        if lo > 0 and self.contains(lo - 1):
            lo = 0  # an entry below the one remembered: another cleanup did not run there
        if self.contains(lo):
            return lo
        hi = below  # contains(hi) is taken as true: entries below ``below`` form a suffix
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if self.contains(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def delete(self, files: Iterable[LogFile]) -> int:
        deleted = 0
        for f in files:
            name = checkpoint_name(f.version) if f.checkpoint else entry_name(f.version)
            try:
                os.unlink(os.path.join(self.path, name))
                deleted += 1
            except FileNotFoundError:
                continue
        return deleted

    def discard_temporaries(self, older_than: float) -> int:
        """Also learns, from the same listing, every checkpoint present."""
        deleted = 0
        checkpoints: set[int] = set()
        for name in self._names():
            if not name.startswith(TMP_PREFIX):
                parsed = parse_log_name(name)
                if parsed is not None and parsed[1] == CHECKPOINT_SUFFIX:
                    checkpoints.add(parsed[0])
                continue
            full = os.path.join(self.path, name)
            try:
                if os.stat(full).st_mtime < older_than:
                    os.unlink(full)
                    deleted += 1
            except FileNotFoundError:
                pass
        self._known_checkpoints |= checkpoints  # stale ones go when a cleanup looks
        return deleted
