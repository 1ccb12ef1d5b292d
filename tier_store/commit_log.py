"""A topic's commit log: numbered JSON entries plus periodic checkpoints, kept in a
:class:`~tier_store.logstore.LogStore` (a directory of a local or NFS filesystem by default).

Guarantees (the store's contract gives the first three; see :mod:`tier_store.logstore`):

* **Atomic visibility.** A reader sees the whole entry or none.
* **One writer per number.** Publication is put-if-absent, so two committers never both
  publish version N; the loser re-reads what it missed and retries or gives up
  (:class:`~tier_store.errors.CommitConflict`).
* **Durable before visible to the next step.** An acknowledged commit survives a crash of
  the machine.
* **Incremental reads.** Opening reads the last checkpoint and probes the numbers after it;
  refreshing probes from the handle's version. The log is never listed to read.
* **Bounded size.** Every ``log.checkpoint.interval`` versions a checkpoint (the whole state,
  one Arrow IPC file) is written; entries and checkpoints older than the previous checkpoint
  are deleted once they are older than ``log.cleanup.grace.ms``.
* **The checkpoint pointer only moves forward.** The store moves ``_last_checkpoint`` as one
  atomic step against concurrent committers: one that stalled while others wrote newer
  checkpoints and cleaned up never points it back at a deleted one. A pointer naming a
  missing checkpoint anyway (left by an older release) is survived: the newest checkpoint
  present is read instead, then the entries after it.

Integrity: every entry carries a checksum of its version, the topic's id and its bytes
(:mod:`tier_store.entries`); every checkpoint ends with a trailer holding its version and a
checksum of its bytes, checked before Arrow parses any of them. Replay then checks each entry
against the state it extends, and a checkpoint's state against itself (:mod:`tier_store.state`).
A damaged, malformed or misplaced entry or checkpoint raises
:class:`~tier_store.errors.CorruptLog` naming the file: the topic does not open, rather than
opening with rows missing or twice.

Thread-safety: a :class:`CommitLog` keeps only the topic's id once read (the same for every
reader of one incarnation); it is safe to share.
"""

from __future__ import annotations

import logging
import struct
import time

import pyarrow as pa
import xxhash

from .crash import crash_point
from .entries import CreateEntry, Entry, decode
from .errors import CorruptLog, TopicNotFound
from .index_pieces import PiecesGone
from .logstore import LogStore, PosixLogStore
from .pending_checkpoint import PendingCheckpoint
from .state import TopicState, checkpoint_table

log = logging.getLogger(__name__)

_TRAILER = struct.Struct("<8sQQ")  # magic, version, xxh3-64 of the bytes before
_MAGIC = b"PAFKACP1"
_MAX_VERSION = 10**20 - 1  # what 20-digit file names hold


def _checkpoint_digest(body: memoryview | bytes, version: int) -> int:
    h = xxhash.xxh3_64(body)
    h.update(_MAGIC + version.to_bytes(8, "little"))
    return h.intdigest()


def encode_checkpoint(table: pa.Table, version: int) -> bytes:
    """Checkpoint ``version`` as stored: ``table`` as an Arrow IPC file, then the trailer."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        for b in table.to_batches():
            w.write_batch(b)
    body = sink.getvalue()
    return body.to_pybytes() + _TRAILER.pack(_MAGIC, version,
                                             _checkpoint_digest(memoryview(body), version))


def checkpoint_body(data: bytes | pa.Buffer) -> pa.Buffer:
    """The Arrow IPC file of a stored checkpoint (unchecked; for tools and tests)."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return buf.slice(0, max(0, buf.size - _TRAILER.size))


def checked_checkpoint(data: bytes | pa.Buffer, version: int, where: str) -> pa.Buffer:
    """The Arrow IPC file of checkpoint ``version`` once its trailer matches;
    :class:`CorruptLog` naming ``where`` otherwise."""
    buf = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    view = memoryview(buf)
    if len(view) < _TRAILER.size:
        raise CorruptLog(f"checkpoint {where} is damaged: {len(view)} bytes, too short")
    magic, held, digest = _TRAILER.unpack(view[len(view) - _TRAILER.size:])
    body = view[:len(view) - _TRAILER.size]
    if magic != _MAGIC:
        raise CorruptLog(f"checkpoint {where} is damaged: no checksum trailer (truncated, or "
                         "written by a release without checksums)")
    if held != version:
        raise CorruptLog(f"checkpoint {where} holds version {held}, not {version}")
    if _checkpoint_digest(body, version) != digest:
        raise CorruptLog(f"checkpoint {where} is damaged: its checksum does not match")
    return buf.slice(0, len(body))


def decode_checkpoint(data: bytes | pa.Buffer, version: int, topic: str, where: str
                      ) -> TopicState:
    """The state stored checkpoint ``data`` holds, once it is checked to be checkpoint
    ``version`` of ``topic``; :class:`CorruptLog` naming ``where`` otherwise."""
    try:
        table = pa.ipc.open_file(checked_checkpoint(data, version, where)).read_all()
        table.validate(full=True)  # buffers in bounds before numpy reads them
    except (pa.ArrowException, OSError, ValueError) as e:
        raise CorruptLog(f"checkpoint {where} is unreadable: {e}") from None
    except KeyError as e:  # ArrowKeyError
        raise CorruptLog(f"checkpoint {where} is unreadable: {e!r}") from None
    return TopicState.from_checkpoint(table, where, version, topic)


class CommitLog:
    """The commit log of one topic: ``CommitLog(log_dir, topic)`` on its ``_log/``
    directory, or ``CommitLog(location, topic, store=...)`` on any :class:`LogStore`."""

    def __init__(self, path: str, topic: str, store: LogStore | None = None):
        self.store: LogStore = store if store is not None else PosixLogStore(path, topic)
        self.path = path
        self.topic = topic
        # The topic's id, once read: entries after entry 0 are checksummed with it.
        self._topic_id: str | None = None
        # When this handle last looked for staged files a crash left: a listing, so once per
        # grace period of a long-lived handle, never from a short-lived committer.
        self._temporaries_at = time.monotonic()

    @classmethod
    def on(cls, store: LogStore) -> CommitLog:
        """The commit log kept in ``store``."""
        return cls(store.location, store.topic, store=store)

    def check_incarnation(self) -> None:
        """Raise :class:`TopicDeleted` if the log's path now leads to another log (the topic
        was deleted, and perhaps created again) than the one this handle read."""
        self.store.check_incarnation()

    def close(self) -> None:
        """Let go of what the store holds open."""
        self.store.close()

    # -- publication ----------------------------------------------------------------------
    def publish(self, version: int, entry: Entry) -> bool:
        """Publish ``entry`` as ``version``; False if that number is already taken."""
        if version == 0:
            topic_id = entry.id if isinstance(entry, CreateEntry) else ""
        else:
            topic_id = self.topic_id()
        return self.store.put_if_absent(version, entry.encode(version, topic_id))

    def topic_id(self) -> str:
        """The topic's id (read from the log the first time it is needed)."""
        if self._topic_id is None:
            self.load()
        assert self._topic_id is not None
        return self._topic_id

    def _learn(self, state: TopicState) -> TopicState:
        if state.version >= 0 and self._topic_id is None:
            self._topic_id = state.topic_id
        return state

    # -- reading --------------------------------------------------------------------------
    def read_entry(self, version: int, topic_id: str | None = None) -> Entry | None:
        """Entry ``version`` (None if there is none), checked against ``topic_id`` (default:
        the id this log has read)."""
        data = self.store.read(version)
        if data is None:
            return None
        if topic_id is None:
            topic_id = self.topic_id() if version else ""
        return decode(data, self.store.entry_location(version), version, topic_id)

    def last_checkpoint(self) -> int | None:
        """The version the checkpoint pointer names; None if none (or not a version)."""
        cp = self.store.last_checkpoint_hint()
        if cp is not None and (isinstance(cp, bool) or not isinstance(cp, int)
                               or not 0 <= cp <= _MAX_VERSION):
            log.warning("topic %s: the checkpoint pointer in %s names %r, not a version; "
                        "looking for checkpoints instead", self.topic, self.path, cp)
            return None
        return cp

    def load(self) -> TopicState:
        """The topic's newest state: last checkpoint, then every entry after it."""
        self.check_incarnation()
        if not self.store.exists():
            raise TopicNotFound(f"topic {self.topic!r} has no commit log at {self.path}")
        cp = self.last_checkpoint()
        state = self._read_checkpoint(cp) if cp is not None else None
        if state is None and (cp is not None or not self.store.contains(0)):
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
            state.index.store = self.store
            if not self.store.contains(0):
                raise TopicNotFound(f"topic {self.topic!r}: commit log {self.path} is empty")
        return self._learn(self.refresh(state))

    def refresh(self, state: TopicState) -> TopicState:
        """Apply the entries published since ``state.version``; returns the state to use."""
        self.check_incarnation()
        while True:
            v = state.version + 1
            entry = self.read_entry(v, state.topic_id if v else "")
            if entry is not None:
                try:
                    state.apply(v, entry, self.store.entry_location(v))
                except PiecesGone as e:
                    # A move's sources were collected: only after a checkpoint past it.
                    loaded = self._newer_checkpoint(state.version)
                    if loaded is None:
                        raise CorruptLog(f"topic {self.topic!r}: entry "
                                         f"{self.store.entry_location(v)} cannot be "
                                         f"replayed: {e}") from None
                    state = loaded
                continue
            # No entry v: either nothing new, or old entries were cleaned up behind a
            # checkpoint newer than this handle. Entries are deleted in ascending order, so
            # if our own last entry is still there, nothing was cleaned past us.
            if state.version >= 0 and self.store.contains(state.version):
                return self._learn(state)
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
            return self._learn(state)

    def _newer_checkpoint(self, version: int) -> TopicState | None:
        """The checkpoint the pointer names, or the newest one, if newer than ``version``."""
        cp = self.last_checkpoint()
        loaded = self._read_checkpoint(cp) if cp is not None and cp > version else None
        if loaded is None:
            loaded = self._newest_checkpoint()
        return loaded if loaded is not None and loaded.version > version else None

    def _newest_checkpoint(self) -> TopicState | None:
        """The newest readable checkpoint, found by listing (only when the pointer cannot be
        used); None if there is none."""
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
        where = self.store.checkpoint_location(version)
        try:
            data = self.store.read_checkpoint(version)
        except OSError as e:
            raise CorruptLog(f"checkpoint {where} is unreadable: {e}") from None
        if data is None:
            return None
        state = decode_checkpoint(data, version, self.topic, where)
        state.index.store = self.store
        return state

    # -- checkpoints and cleanup ----------------------------------------------------------
    def write_checkpoint(self, state: TopicState, grace_ms: int, interval: int = 0) -> None:
        """Write ``state`` as a checkpoint, point ``_last_checkpoint`` at it, clean up."""
        pending = self.begin_checkpoint(state)
        if pending is not None:
            pending.write_pieces()
            pending.install()
            self.finish_checkpoint(pending, grace_ms, interval)

    def begin_checkpoint(self, state: TopicState) -> PendingCheckpoint | None:
        """The first step of :meth:`write_checkpoint`, the one that reads ``state`` (so under
        its handle's lock; see :mod:`tier_store.pending_checkpoint`). None if a checkpoint
        at or past its version is there already."""
        previous = self.last_checkpoint()
        if previous is not None and previous >= state.version:
            return None
        state.index.store = self.store
        return state.begin_checkpoint(put=state.index.put)

    def finish_checkpoint(self, pending: PendingCheckpoint, grace_ms: int,
                          interval: int = 0) -> None:
        """The last step of :meth:`write_checkpoint`, once its pieces are written: it reads
        no state, so it runs outside the handle's lock (a commit does not wait for it)."""
        version = pending.version
        table = checkpoint_table(*pending.parts())
        crash_point("checkpoint.pieces")
        self.store.write_checkpoint(version, encode_checkpoint(table, version))
        crash_point("checkpoint.pointer")
        # Others may have written newer checkpoints meanwhile, and cleaned up behind them
        # (ours included): the store never moves the pointer back.
        previous = self.store.advance_checkpoint_hint(version)
        if previous is not None and previous >= version:
            log.debug("topic %s: checkpoint %d is already superseded by %d", self.topic,
                      version, previous)
            return
        log.debug("topic %s: checkpoint at version %d", self.topic, version)
        if previous is not None:
            self.cleanup(previous, grace_ms, interval)

    def cleanup(self, keep_from: int, grace_ms: int, interval: int = 0) -> int:
        """Delete entries and checkpoints below ``keep_from`` (and stale temp files) that are
        older than the grace period, in ascending order. Returns how many were deleted."""
        cutoff = time.time() - grace_ms / 1000.0
        now = time.monotonic()
        if now - self._temporaries_at >= max(grace_ms / 1000.0, 60.0):
            # A listing: once per grace period per handle, not per checkpoint.
            self._temporaries_at = now
            self.store.discard_temporaries(cutoff)
        return self.store.delete(self.store.expired(keep_from, cutoff, interval))

    def checkpoint_versions(self) -> list[int]:
        return self.store.checkpoints()
