"""Bundles: reading chunks out of them for a compaction, and reclaiming them.

On a store shared by many hosts (:mod:`tier_store.sharing`) each write task uploads its
chunks as one object, a *bundle*, under ``<shared tier>/<topic>/_bundles/<incarnation>/``.
A committed chunk on some host's tier 1 names its bundle and position there (the chunk
rows' ``obj_hi``, ``obj_lo`` and ``opos``).

What it does:

* :func:`source_chunks` gives a compaction (a move to the shared tier, :mod:`.moves`) the
  committed chunks of its sources: from this host's own file when the segment is this
  host's and the bytes match their checksum, else from the bundles, by ranged reads sent
  together (adjacent chunks of one bundle in one read). Every chunk is checked against its
  checksum before anything is uploaded.
* :func:`reclaim_bundles` deletes the bundles of a topic that no committed chunk names any
  more (their segments were compacted, or deleted by retention) and those a task uploaded
  and never committed (it was killed, or its commit lost).

Steps of a reclaim, each crash-safe (a bundle is deleted or it is not):

1. List the topic's bundle directory (one LIST per 1,000 bundles). A name that is not 32
   lowercase hex digits and ``.chunks`` is not a bundle: it is left alone and logged.
2. Read the topic's state *after* the listing, and the bundles its chunk rows name, in
   every partition.
3. A bundle is a candidate when no row names it and its ``LastModified`` is older than
   ``log.cleanup.grace.ms``. It is deleted (one request per 1,000) once this process has
   seen it a candidate for the grace period as well.

DANGER: it deletes bundles, the only copy of committed chunks whose writing host lost its
tier 1. What protects them: a bundle named by any chunk of the state read after the listing
is never deleted, and a compacted segment's bundles stay until a reader that planned
against them (before the ``move`` entry) has had the grace period to finish; a reader that
still finds one gone plans again and reads the compacted segment. A bundle is deleted only
when uploaded more than ``log.cleanup.grace.ms`` ago, so a write task's bundle survives
until its commit, unless the commit comes later than that: commits must not name a bundle
shared longer ago than the grace period (the committer's rule).

Who runs it: the migration service on every run, and the driver's housekeeping after a
commit at most every :func:`sweep_interval` seconds per topic (:func:`reclaim_due`): a LIST
per commit would cost more than the commit.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..chunk import checksum
from ..errors import CorruptSegment, DataLoss
from ..ids import bundle_text, check_bundle
from ..layout import segment_id
from ..reading import read_range
from ..sharing import BUNDLE_SUFFIX

if TYPE_CHECKING:
    from ..state import SegmentState, TopicState
    from ..topic import Topic

log = logging.getLogger(__name__)

_guard = threading.Lock()
# (bundle URL) -> time.time() when this process first saw it unreferenced and past grace.
_candidates: dict[str, float] = {}
# (store root, topic, incarnation) -> time.monotonic() of this process's last sweep.
_swept: dict[tuple[str, str, str], float] = {}
_odd: set[str] = set()  # names in a bundle directory that are not bundles, logged once


def source_chunks(topic: Topic, segs: Sequence[SegmentState], rows: np.ndarray
                  ) -> list[pa.Buffer]:
    """The bytes of the committed chunks ``rows`` of segments ``segs`` (one partition), in
    the rows' order, each checked against its checksum. On a single-host store, or for a
    chunk no bundle holds, from the segment's file; on a shared store from this host's own
    file when the segment is this host's and the bytes match, else from its bundle.
    :class:`DataLoss` names a chunk no copy holds, :class:`CorruptSegment` one whose every
    copy is damaged."""
    store = topic.store
    shared = store.shared
    p = segs[0].partition
    by_seq = {s.seq: s for s in segs}
    out: list[pa.Buffer | None] = [None] * len(rows)
    far: list[int] = []  # rows read from their bundle
    for i, r in enumerate(rows):
        seq, pos, length = int(r["seq"]), int(r["pos"]), int(r["length"])
        seg = by_seq[seq]
        path = store.tier(seg.tier).segment_path(topic.name, p, seq)
        if shared is None or int(r["opos"]) < 0:
            try:
                out[i] = read_range(path, pos, length)
            except FileNotFoundError:
                raise DataLoss(f"topic {topic.name!r}: segment {segment_id(p, seq)} cannot "
                               f"move, its file {path} is missing") from None
            continue
        if seg.host == shared.host:
            try:
                buf = read_range(path, pos, length)
                if checksum(buf) == int(r["checksum"]):
                    out[i] = buf
                    continue
            except (FileNotFoundError, CorruptSegment):
                pass  # evicted, or this host's tier 1 was wiped: the bundle has it
        far.append(i)
    url_of: dict[int, str] = {}
    if far:
        assert shared is not None
        url_of = {i: shared.bundle_url(topic.name, topic.id, bundle_text(
            int(rows[i]["obj_hi"]), int(rows[i]["obj_lo"]))) for i in far}
        got = _ranges(shared.tier.fs, [url_of[i] for i in far],
                      [int(rows[i]["opos"]) for i in far], [int(rows[i]["length"]) for i in far])
        for i, buf in zip(far, got, strict=True):
            if isinstance(buf, FileNotFoundError):
                seq = int(rows[i]["seq"])
                raise DataLoss(f"topic {topic.name!r}: segment {segment_id(p, seq)} cannot "
                               f"move: the chunk at offset {int(rows[i]['base'])} is neither "
                               f"in a file here nor in its bundle {url_of[i]}, which is "
                               "missing")
            out[i] = buf
    done: list[pa.Buffer] = []
    for i, (r, buf) in enumerate(zip(rows, out, strict=True)):
        assert buf is not None
        if len(buf) != int(r["length"]) or checksum(buf) != int(r["checksum"]):
            where = url_of.get(i) or f"segment {segment_id(p, int(r['seq']))}"
            raise CorruptSegment(f"topic {topic.name!r}: the chunk at offset {int(r['base'])} "
                                 f"read from {where} does not match its checksum; it was not "
                                 "moved")
        done.append(buf)
    return done


def _ranges(fs: Any, urls: list[str], starts: list[int], lengths: list[int]
            ) -> list[pa.Buffer | FileNotFoundError]:
    """Byte ranges of objects, read together (concurrently where the filesystem can):
    ranges of one object that touch are read as one. A missing object gives
    FileNotFoundError in its ranges' places; any other failure is raised."""
    order = sorted(range(len(urls)), key=lambda k: (urls[k], starts[k]))
    spans: list[list[Any]] = []  # [url, start, end, [indexes]]
    for k in order:
        last = spans[-1] if spans else None
        if last is not None and last[0] == urls[k] and last[2] == starts[k]:
            last[2] += lengths[k]
            last[3].append(k)
        else:
            spans.append([urls[k], starts[k], starts[k] + lengths[k], [k]])
    got = fs.cat_ranges([s[0] for s in spans], [s[1] for s in spans], [s[2] for s in spans])
    out: list[pa.Buffer | FileNotFoundError] = [FileNotFoundError()] * len(urls)
    for (url, start, _end, ks), data in zip(spans, got, strict=True):
        if isinstance(data, FileNotFoundError) or (
                isinstance(data, OSError) and "not found" in str(data).lower()):
            for k in ks:
                out[k] = FileNotFoundError(url)
            continue
        if isinstance(data, BaseException):
            raise data
        whole = pa.py_buffer(data)
        for k in ks:
            out[k] = whole.slice(starts[k] - start, lengths[k])
    return out


def referenced(st: TopicState) -> set[str]:
    """The bundles the chunks of state ``st`` name, in every partition."""
    names: set[str] = set()
    for part in st.parts:
        rows = part.chunks.rows()
        named = rows[rows["opos"] >= 0]
        if len(named):
            pairs = np.unique(np.stack([named["obj_hi"], named["obj_lo"]], axis=1), axis=0)
            names.update(bundle_text(int(hi), int(lo)) for hi, lo in pairs)
    return names


def reclaim_bundles(topic: Topic, now: float | None = None) -> int:
    """Delete ``topic``'s bundles that no committed chunk names, once they are older than
    ``log.cleanup.grace.ms`` and this process has seen them so for that long (see the
    module docstring); returns how many went. Nothing on a single-host store."""
    shared = topic.store.shared
    if shared is None:
        return 0
    now = time.time() if now is None else now
    grace_s = topic.setting("log.cleanup.grace.ms") / 1000.0
    fs = shared.tier.fs
    where = shared.bundle_dir(topic.name, topic.id)
    with _guard:
        _swept[(topic.store.root, topic.name, topic.id)] = time.monotonic()
    try:
        listing = fs.ls(where, detail=True, refresh=True)
    except FileNotFoundError:
        return 0
    aged: dict[str, str] = {}  # bundle id -> URL, of those uploaded before the grace period
    for info in listing:
        name = posixpath.basename(info["name"].rstrip("/"))
        stem = name[: -len(BUNDLE_SUFFIX)] if name.endswith(BUNDLE_SUFFIX) else None
        try:
            check_bundle(stem)
        except ValueError:
            if info["name"] not in _odd:
                _odd.add(info["name"])
                log.warning("topic %s: %s is not a bundle (32 lowercase hex digits and %s), "
                            "left alone", topic.name, info["name"], BUNDLE_SUFFIX)
            continue
        if info.get("type") == "directory":
            continue
        if now - _modified(info) > grace_s:
            aged[stem] = fs.unstrip_protocol(info["name"])  # type: ignore[index]
    named = referenced(topic.state()) if aged else set()
    doomed: list[str] = []
    with _guard:
        for obj, url in aged.items():
            if obj in named:
                _candidates.pop(url, None)
                continue
            first = _candidates.setdefault(url, now)
            if now - first > grace_s:
                doomed.append(url)
    if not doomed:
        return 0
    topic.store.claim_remote(shared.tier)  # another store's tier: delete nothing
    fs.rm(doomed)
    with _guard:
        for url in doomed:
            _candidates.pop(url, None)
    log.info("topic %s: deleted %d bundles no committed chunk names", topic.name, len(doomed))
    return len(doomed)


def _modified(info: dict[str, Any]) -> float:
    """An object's last-modified time (seconds since the epoch) from a listing entry."""
    t = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
    return t.timestamp() if hasattr(t, "timestamp") else float(t)


def sweep_interval(topic: Topic) -> float:
    """Seconds between two sweeps of a topic's bundles after commits: a tenth of the grace
    period, within [1, 60]."""
    return min(60.0, max(1.0, topic.setting("log.cleanup.grace.ms") / 10000.0))


def reclaim_due(topic: Topic) -> int:
    """:func:`reclaim_bundles` if this process has not swept the topic for
    :func:`sweep_interval` seconds (housekeeping after a commit); else nothing."""
    if topic.store.shared is None:
        return 0
    with _guard:
        last = _swept.get((topic.store.root, topic.name, topic.id))
    if last is not None and time.monotonic() - last < sweep_interval(topic):
        return 0
    return reclaim_bundles(topic)


__all__ = ["reclaim_bundles", "reclaim_due", "referenced", "source_chunks", "sweep_interval"]
