"""A topic's commit log: numbered JSON entries plus periodic checkpoints, on a local or NFS
filesystem.

Guarantees (the storage contract):

* **Atomic visibility.** An entry is written to a temporary file and fsynced, then ``link``ed
  to its number; a reader sees the whole entry or no file at all.
* **One writer per number.** ``link`` fails when the number exists, so two committers never
  both publish version N; the loser re-reads what it missed and retries or gives up
  (:class:`~tier_store.errors.CommitConflict`).
* **Durable before visible to the next step.** The directory is fsynced after the link, so an
  acknowledged commit survives a crash of the machine.
* **Incremental reads.** Opening reads the last checkpoint and probes the numbers after it;
  refreshing probes from the handle's version. The directory is never listed to read.
* **Bounded size.** Every ``log.checkpoint.interval`` versions a checkpoint (the whole state,
  one Arrow IPC file) is written; entries and checkpoints older than the previous checkpoint
  are deleted once they are older than ``log.cleanup.grace.ms``.
* **The checkpoint pointer only moves forward.** ``_last_checkpoint`` is re-read and replaced
  under an ``flock`` of ``_last_checkpoint.lock`` (held for that alone and released by the
  kernel when its process dies, so a crash leaves no lock behind): a committer that stalled
  while others wrote newer checkpoints and cleaned up never points it back at a deleted one.
  A pointer naming a missing checkpoint anyway (left by an older release) is survived: the
  newest checkpoint present is read instead, then the entries after it.

Thread-safety: a :class:`CommitLog` holds no mutable state; it is safe to share.
"""

from __future__ import annotations

import logging
import os
import time

import pyarrow as pa

from .crash import crash_point
from .entries import Entry, decode
from .errors import CorruptLog, TopicDeleted, TopicNotFound
from .layout import (
    CHECKPOINT_LOCK,
    CHECKPOINT_SUFFIX,
    LAST_CHECKPOINT,
    TMP_PREFIX,
    checkpoint_name,
    entry_name,
    file_lock,
    fsync_dir,
    parse_log_name,
    write_atomic,
    write_temp,
)
from .state import TopicState

log = logging.getLogger(__name__)


class CommitLog:
    """The ``_log/`` directory of one topic."""

    def __init__(self, path: str, topic: str):
        self.path = path
        self.topic = topic
        # (st_dev, st_ino) of the directory when first read: a topic deleted and created
        # again has a new one, and this handle must never publish into or read from it. The
        # directory is held open, so its inode number cannot be reused while we compare.
        self._ident: tuple[int, int] | None = None
        self._dir_fd = -1

    def check_incarnation(self) -> None:
        """Raise :class:`TopicDeleted` if the log's path now leads to another directory (the
        topic was deleted, and perhaps created again) than the one this handle read."""
        try:
            st = os.stat(self.path)
            now: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            now = None
        if self._ident is None:
            if now is None:
                return
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            held = os.fstat(fd)
            if (held.st_dev, held.st_ino) != now:
                os.close(fd)  # replaced in between: compare against the next look
                return
            self._dir_fd, self._ident = fd, now
        elif now != self._ident:
            again = " and created again" if now is not None else ""
            raise TopicDeleted(f"topic {self.topic!r} was deleted{again} since this handle "
                               "opened it: open the topic again")

    def close(self) -> None:
        """Let go of the directory this handle holds open."""
        fd, self._dir_fd = self._dir_fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    # -- publication ----------------------------------------------------------------------
    def publish(self, version: int, entry: Entry) -> bool:
        """Publish ``entry`` as ``version``; False if that number is already taken."""
        self.check_incarnation()
        try:
            tmp = write_temp(self.path, entry.encode())
        except FileNotFoundError:
            self.check_incarnation()  # deleted meanwhile: TopicDeleted
            raise
        crash_point("log.publish.tmp")
        try:
            # Linked into the directory this handle read (held open), never into a topic
            # created under the name since.
            if self._dir_fd >= 0:
                os.link(tmp, entry_name(version), dst_dir_fd=self._dir_fd)
            else:
                os.link(tmp, os.path.join(self.path, entry_name(version)))
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        crash_point("log.publish.linked")
        if self._dir_fd >= 0:
            os.fsync(self._dir_fd)
        else:
            fsync_dir(self.path)
        # Published into a deleted topic's directory: it is visible nowhere.
        self.check_incarnation()
        return True

    # -- reading --------------------------------------------------------------------------
    def read_entry(self, version: int) -> Entry | None:
        path = os.path.join(self.path, entry_name(version))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        return decode(data, path)

    def last_checkpoint(self) -> int | None:
        try:
            with open(os.path.join(self.path, LAST_CHECKPOINT), "rb") as f:
                return int(f.read().strip())
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn pointer cannot happen (atomic rename); be lenient anyway

    def load(self) -> TopicState:
        """The topic's newest state: last checkpoint, then every entry after it."""
        self.check_incarnation()
        if not os.path.isdir(self.path):
            raise TopicNotFound(f"topic {self.topic!r} has no commit log at {self.path}")
        cp = self.last_checkpoint()
        state = self._read_checkpoint(cp) if cp is not None else None
        if state is None and (cp is not None or self.read_entry(0) is None):
            # The pointer names a checkpoint that cleanup deleted (or there is no pointer and
            # no entry 0): the newest checkpoint present is as good a start, and the entries
            # after it are all there (cleanup never deletes past the newest checkpoint).
            state = self._newest_checkpoint()
            if state is not None:
                log.warning("topic %s: _last_checkpoint in %s names checkpoint %s, which is "
                            "missing; loading the newest checkpoint present (version %d)",
                            self.topic, self.path, cp, state.version)
        if state is None:
            state = TopicState(self.topic)
            if self.read_entry(0) is None:
                raise TopicNotFound(f"topic {self.topic!r}: commit log {self.path} is empty")
        return self.refresh(state)

    def refresh(self, state: TopicState) -> TopicState:
        """Apply the entries published since ``state.version``; returns the state to use."""
        self.check_incarnation()
        while True:
            v = state.version + 1
            entry = self.read_entry(v)
            if entry is not None:
                state.apply(v, entry)
                continue
            # No entry v: either nothing new, or old entries were cleaned up behind a
            # checkpoint newer than this handle. Entries are deleted in ascending order, so
            # if our own last entry is still there, nothing was cleaned past us.
            if state.version >= 0 and os.path.exists(
                    os.path.join(self.path, entry_name(state.version))):
                return state
            cp = self.last_checkpoint()
            loaded = self._read_checkpoint(cp) if cp is not None and cp > state.version \
                else None
            if loaded is None:  # the pointer lags or names a deleted checkpoint: look
                loaded = self._newest_checkpoint()
            if loaded is not None and loaded.version > state.version:
                state = loaded
                continue
            if state.version < 0:
                raise TopicNotFound(f"topic {self.topic!r}: no readable commit log at {self.path}")
            return state

    def _newest_checkpoint(self) -> TopicState | None:
        """The newest readable checkpoint in the directory, found by listing it (only when
        the pointer cannot be used); None if there is none."""
        for _ in range(3):  # a concurrent cleanup may delete what was listed: list again
            versions = self.checkpoint_versions()
            for v in reversed(versions):
                state = self._read_checkpoint(v)
                if state is not None:
                    return state
            if not versions:
                return None
        return None

    def _read_checkpoint(self, version: int) -> TopicState | None:
        path = os.path.join(self.path, checkpoint_name(version))
        try:
            with pa.memory_map(path, "r") as mm:
                table = pa.ipc.open_file(mm).read_all()
        except FileNotFoundError:
            return None
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptLog(f"checkpoint {path} is unreadable: {e}") from None
        return TopicState.from_checkpoint(table, path)

    # -- checkpoints and cleanup ----------------------------------------------------------
    def write_checkpoint(self, state: TopicState, grace_ms: int) -> None:
        """Write ``state`` as a checkpoint, point ``_last_checkpoint`` at it, clean up."""
        previous = self.last_checkpoint()
        if previous is not None and previous >= state.version:
            return
        table = state.to_checkpoint()
        path = os.path.join(self.path, checkpoint_name(state.version))
        tmp = os.path.join(self.path, f"{TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}")
        with pa.OSFile(tmp, "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            batches = table.to_batches()
            for i, b in enumerate(batches):
                w.write_batch(b)
                if i == len(batches) // 2:
                    crash_point("checkpoint.write")
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another committer wrote the same version's checkpoint
        finally:
            os.unlink(tmp)
        fsync_dir(self.path)
        crash_point("checkpoint.pointer")
        with file_lock(os.path.join(self.path, CHECKPOINT_LOCK)):
            # Re-read under the lock: while this committer was writing (or stalled), others
            # may have written newer checkpoints and cleaned up behind them, ours included.
            previous = self.last_checkpoint()
            if previous is not None and previous >= state.version:
                log.debug("topic %s: checkpoint %d is already superseded by %d", self.topic,
                          state.version, previous)
                return
            write_atomic(os.path.join(self.path, LAST_CHECKPOINT), str(state.version).encode())
        log.debug("topic %s: checkpoint at version %d", self.topic, state.version)
        if previous is not None:
            self.cleanup(previous, grace_ms)

    def cleanup(self, keep_from: int, grace_ms: int) -> int:
        """Delete entries and checkpoints below ``keep_from`` (and stale temp files) that are
        older than the grace period, in ascending order. Returns how many were deleted."""
        cutoff = time.time() - grace_ms / 1000.0
        old: list[tuple[int, str]] = []
        for name in os.listdir(self.path):
            full = os.path.join(self.path, name)
            if name.startswith(TMP_PREFIX):
                try:
                    if os.stat(full).st_mtime < cutoff:
                        os.unlink(full)
                except FileNotFoundError:
                    pass
                continue
            parsed = parse_log_name(name)
            if parsed is not None and parsed[0] < keep_from:
                old.append((parsed[0], name))
        deleted = 0
        for _version, name in sorted(old):
            full = os.path.join(self.path, name)
            try:
                if os.stat(full).st_mtime >= cutoff:
                    break  # keep ascending order: stop at the first one still in its grace
                os.unlink(full)
                deleted += 1
            except FileNotFoundError:
                continue
        return deleted

    def checkpoint_versions(self) -> list[int]:
        return sorted(p[0] for n in os.listdir(self.path)
                      if (p := parse_log_name(n)) and p[1] == CHECKPOINT_SUFFIX)
