"""Decoding a topic's chunks: each an Arrow IPC stream in the schema the topic had when it
was written, read as the topic's schema now (see :class:`ChunkDecoder`)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from .chunk import _UNREADABLE, read_chunk
from .errors import CorruptSegment
from .schemas import Adapter, readable_as

_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an IPC stream's end marker


class ChunkDecoder:
    """Decodes a run of chunks of one topic (zero-copy unless compressed).

    A chunk is an IPC stream: the schema, record batches, the end marker. Opening a stream
    reader parses the schema again for every chunk, which is most of the cost of reading a
    small one; once a chunk has been read so, a chunk that starts with the same schema
    message and holds a single record batch is decoded from that batch's message alone.
    Anything else (several batches, dictionaries, another schema) takes the general path.

    A topic's chunks hold the schema the topic had when each was written. With ``target``
    (the topic's schema now) every batch is read as it: columns added since are nulls and
    widened ones are cast (:class:`~tier_store.schemas.Adapter`); a chunk whose columns are
    not the target's, in its order (some may be missing), is :class:`CorruptSegment`.

    Whatever the bytes, decoding gives batches or :class:`CorruptSegment`, never another
    exception. With ``check`` (readers that verify checksums) every batch passes Arrow's
    full validation (offsets in order and in bounds, UTF-8, dictionary indices) and holds
    the target's columns, or without a target those of the run's first chunk. Writers
    validate every batch before it is stored, so a chunk that matches its checksum fails
    this only if an older version wrote it unvalidated or its checksum was forged; without
    the check such a chunk could crash the reading process. It costs O(rows) for
    variable-length columns and nothing more for fixed-width ones (``bench/RESULTS.md``).
    Without ``check``, nothing is validated.
    """

    # Per key (a topic's incarnation), the schema messages its chunks start with (newest
    # first; a few, as its schema evolved), kept across decoders: a read of one small chunk
    # per partition then skips parsing the schema too.
    _known: dict[str, list[tuple[pa.Schema, pa.Buffer]]] = {}
    _KNOWN_MAX = 256
    _SCHEMAS_MAX = 8
    # Per schema message met (by identity: ``_known`` keeps them), the target last read it as
    # and how (None: as it is), kept across decoders: a fresh one per read costs no more.
    _adapters: dict[int, tuple[pa.Buffer, pa.Schema, Adapter | None]] = {}

    def __init__(self, check: bool = True, key: str = "",
                 target: pa.Schema | None = None,
                 columns: tuple[str, ...] | None = None) -> None:
        self._check = check
        self._key = key
        self._target = target
        # Only these of the target's columns are read (validated, adapted, handed out).
        self._columns = columns
        self._out = target if columns is None or target is None else \
            pa.schema([target.field(c) for c in columns])
        # Never changed in place (shared with ``_known``): a new schema makes a new list.
        self._seen: list[tuple[pa.Schema, pa.Buffer]] = \
            ChunkDecoder._known.get(key, []) if key else []
        self._first: pa.Schema | None = self._seen[-1][0] if self._seen and not target \
            else None

    def batches(self, buf: pa.Buffer, where: Callable[[], str]) -> list[pa.RecordBatch]:
        """The chunk's record batches; ``where`` names the chunk in an error."""
        hit = self._single(buf)
        if hit is not None:
            one, seen = hit
            if self._check:
                try:
                    # Only what is handed out: other columns' bytes are never looked at.
                    (one if self._columns is None else
                     one.select([c for c in self._columns if c in seen[0].names])
                     ).validate(full=True)
                except _UNREADABLE as e:
                    raise CorruptSegment(f"{where()}: the chunk holds an invalid record batch "
                                         f"({type(e).__name__}: {e})") from None
            out = [one]
        else:
            out = list(read_chunk(buf, where(), self._check))
            if not out:
                return out
            seen = self._learn(out[0].schema)
        if self._target is None:
            if self._check and self._first is not None and \
                    not all(_names(b.schema) == self._first.names for b in out):
                raise CorruptSegment(f"{where()}: the chunk's columns are not the ones the "
                                     f"topic's other chunks hold ({self._first})")
            if self._first is None:
                self._first = out[0].schema
            return out
        adapter = self._adapter(seen, where)
        if adapter is None:
            return out
        try:
            return [adapter(b) for b in out]
        except _UNREADABLE as e:
            raise CorruptSegment(f"{where()}: the chunk does not read as the topic's schema "
                                 f"({type(e).__name__}: {e})") from None

    def _learn(self, schema: pa.Schema) -> tuple[pa.Schema, pa.Buffer]:
        """The entry of ``_seen`` for chunks of ``schema``, added if new."""
        prefix = schema.serialize()
        for s, p in self._seen:
            if p.equals(prefix):
                return s, p
        self._seen = [(schema, prefix), *self._seen][:self._SCHEMAS_MAX]
        if self._key:
            known = ChunkDecoder._known
            if self._key not in known and len(known) >= self._KNOWN_MAX:
                known.pop(next(iter(known)), None)
            known[self._key] = self._seen
        return schema, prefix

    def _adapter(self, seen: tuple[pa.Schema, pa.Buffer], where: Callable[[], str]
                 ) -> Adapter | None:
        schema, prefix = seen
        target, out = self._target, self._out
        assert target is not None and out is not None
        adapters = ChunkDecoder._adapters
        held = adapters.get(id(prefix))
        if held is not None and held[0] is prefix and (held[1] is out or held[1].equals(out)):
            return held[2]
        names = _names(schema)
        # The chunk's columns must be the target's, in its order, each of its type or one it
        # widens; those it lacks were added since (nullable).
        if names is None or [n for n in target.names if n in names] != names:
            raise CorruptSegment(f"{where()}: the chunk's columns {names} are not those of the "
                                 f"topic's schema or an older one ({target.names})")
        bad = [f"{f.name} is {f.type} there, {target.field(f.name).type} in the topic"
               for f in schema if not readable_as(f.type, target.field(f.name).type)]
        bad += [f"{f.name} is missing, and not nullable in the topic" for f in target
                if f.name not in names and not f.nullable]
        if bad:
            raise CorruptSegment(f"{where()}: the chunk does not hold the topic's schema or an "
                                 f"older one: {'; '.join(bad)}")
        adapter = Adapter(schema, out)
        if len(adapters) >= 4 * self._KNOWN_MAX:
            adapters.clear()
        adapters[id(prefix)] = (prefix, out, None if adapter.identity else adapter)
        return None if adapter.identity else adapter

    def _single(self, buf: pa.Buffer
                ) -> tuple[pa.RecordBatch, tuple[pa.Schema, pa.Buffer]] | None:
        for seen in self._seen:
            prefix = seen[1]
            if buf.size >= prefix.size + 16 and buf.slice(0, prefix.size).equals(prefix):
                break
        else:
            return None
        schema = seen[0]
        try:
            msg = pa.ipc.read_message(buf.slice(prefix.size))
            if msg.type != "record batch":
                return None
            end = prefix.size + 8 + msg.metadata.size + msg.body.size
            if end + len(_EOS) != buf.size or buf.slice(end).to_pybytes() != _EOS:
                return None
            return pa.ipc.read_record_batch(msg, schema), seen
        except _UNREADABLE:
            return None  # the general path reads it or names what is wrong


def _names(schema: pa.Schema) -> list[str] | None:
    try:
        return schema.names
    except _UNREADABLE:  # a name that is not UTF-8
        return None
