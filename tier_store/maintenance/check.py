"""Check: a topic against its commit log, what ``pafka check`` and crash tests rely on.

What it does: :func:`check_topic` reads the topic's state and its segment files and reports
every disagreement in a :class:`CheckReport`. It checks; it repairs nothing (a crash needs
no repair: the commit log is the source of truth, so opening a store never scans segments,
and what a crash left unreferenced is :mod:`.garbage`'s).

DANGER: none; it only reads. It can be run at any time, beside writers and moves: a
segment moved while it is checked may be reported missing (run it again).

It runs in ordered passes and reports every problem instead of stopping at the first:

1. The log: the state loads from the last checkpoint and the entries after it, with
   consecutive versions, every checksum matching and every entry extending the state before
   it. A topic whose log fails is reported (naming the file) by :func:`check_named`, and the
   other topics are still checked.
2. Offsets: per partition, committed chunks cover ``[earliest, latest)`` with no gap and no
   overlap.
3. Files: every committed segment's file exists on its tier, its header names the same
   partition and sequence, and it is long enough for the chunks committed in it.
4. Checksums (``verify=True``): every committed chunk's bytes match the xxh3 recorded at
   write, and they decode to the records the log recorded, passing Arrow's full validation
   (a chunk an older version stored unvalidated matches its checksum and fails here; readers
   refuse it, or skip it when told to).

On a store shared by many hosts, a tier-1 segment whose chunks were uploaded lives in shared
objects: those are what passes 3 and 4 check (each object exists; each chunk's range matches
its checksum). The segment's file is a cache on its writer's host: checked when it is this
host's and still there, never required (eviction removes it), never looked for elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..chunk import checksum
from ..chunk_decoder import ChunkDecoder
from ..errors import CorruptLog, CorruptSegment
from ..ids import bundle_text, host_id
from ..reading import read_range

if TYPE_CHECKING:
    from ..state import SegmentState, TopicState
    from ..store import Store
    from ..topic import Topic

log = logging.getLogger(__name__)
_warned: set[str] = set()  # corrupt logs already logged, by message


@dataclass
class CheckReport:
    """What a check of one topic found."""

    topic: str
    version: int = -1
    segments: int = 0
    chunks: int = 0
    bytes_verified: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_topic(topic: Topic, verify: bool = True,
                progress: Callable[[int], None] | None = None) -> CheckReport:
    """Check ``topic`` (see the module docstring); ``progress`` gets bytes as they are read."""
    report = CheckReport(topic.name)
    try:
        st = topic.state()
        for p in range(st.partitions):  # a checkpoint's chunk rows load (and are checked) here
            st.part(p).chunks.rows()
    except (CorruptSegment, CorruptLog) as e:
        report.problems.append(str(e))
        return report
    report.version = st.version
    # Second pass: offsets.
    for p in range(st.partitions):
        rows = st.part(p).chunks.rows()
        expect = st.part(p).start_offset
        for base, n in zip(rows["base"].tolist(), rows["records"].tolist(), strict=True):
            if base != expect:
                report.problems.append(f"partition {p}: chunk at offset {base} where {expect} "
                                       "was expected (gap or overlap)")
            expect = base + n
        if expect != st.part(p).next_offset:
            report.problems.append(f"partition {p}: chunks end at offset {expect} but the log "
                                   f"says the latest offset is {st.part(p).next_offset}")
    # Third and fourth passes: files and checksums.
    shared = topic.store.shared
    here = host_id() if shared is not None else None
    for seg in st.segments.values():
        report.segments += 1
        tier = topic.store.tier(seg.tier)
        path = tier.segment_path(topic.name, seg.partition, seg.seq)
        rows = st.part(seg.partition).chunks.rows()
        mine = rows[rows["seq"] == seg.seq]
        if tier.is_lake:
            _check_lake(topic, st, seg, mine, verify, report, progress)
            continue
        if shared is not None and len(mine) and bool((mine["opos"] >= 0).all()):
            _check_shared(topic, seg.id, mine, verify, report, progress)
            if seg.host != here or not tier.local or not _present(tier, path):
                continue  # another host's cache, or this host's evicted one
        try:
            size = tier.file_size(path)
            hdr = tier.read_header(path)
            if hdr is None:
                raise FileNotFoundError(path)
        except FileNotFoundError:
            report.problems.append(f"segment {seg.id} (offsets [{seg.base}, {seg.end})): "
                                   f"file {path} is missing")
            continue
        except CorruptSegment as e:
            report.problems.append(str(e))
            continue
        if (hdr.partition, hdr.seq) != (seg.partition, seg.seq):
            report.problems.append(f"{path}: header names segment {hdr.partition}-{hdr.seq}, "
                                   f"the log says {seg.id}")
        if size < seg.extent:
            report.problems.append(f"{path}: {size} bytes, but committed chunks reach "
                                   f"byte {seg.extent}")
            continue
        if shared is None or not bool((mine["opos"] >= 0).all()):
            report.chunks += len(mine)  # shared chunks were counted with their objects
        if not verify or not len(mine):
            continue
        for r in mine:
            pos, length = int(r["pos"]), int(r["length"])
            base, records = int(r["base"]), int(r["records"])
            what = (f"{path}: chunk at byte {pos} (partition {seg.partition}, offsets "
                    f"[{base}, {base + records}))")
            buf = read_range(path, pos, length)
            if checksum(buf) != int(r["checksum"]):
                report.problems.append(f"{what} does not match its checksum")
            else:
                _check_records(buf, records, what, report)
            report.bytes_verified += length
            if progress is not None:
                progress(length)
    return report


def _check_lake(topic: Topic, st: TopicState, seg: SegmentState, rows: Any, verify: bool,
                report: CheckReport, progress: Callable[[int], None] | None) -> None:
    """A lake segment: its Parquet file is there, of the size the log names; with ``verify``
    its footer and each row group match their checksums and hold their offsets."""
    from ..lake import LakeFile, LakeGroup, decode_groups
    tier, lake = topic.store.tier(seg.tier), seg.lake
    if lake is None:
        report.problems.append(f"segment {seg.id} is on lake tier {seg.tier}, but the log "
                               "names no lake file for it")
        return
    path = tier.file_path(topic.name, st.topic_id, seg.partition, seg.seq, lake.last_seq)
    try:
        size = tier.file_size(path)
    except FileNotFoundError:
        report.problems.append(f"segment {seg.id} (offsets [{seg.base}, {seg.end})): lake "
                               f"file {path} is missing")
        return
    except CorruptSegment as e:
        report.problems.append(str(e))
        return
    if size != lake.size:
        report.problems.append(f"{path}: {size} bytes, the log names {lake.size}")
        return
    report.chunks += len(rows)
    if not verify or st.schema is None:
        return
    footer = tier.read_range(path, lake.footer_pos, lake.footer_length)
    for r in rows:
        g = LakeGroup(int(r["pos"]), int(r["length"]), int(r["base"]), int(r["records"]),
                      int(r["checksum"]), int(r["ts"]))
        f = LakeFile("", lake.size, lake.footer_pos, lake.footer_length, lake.footer_checksum,
                     (g,))
        try:
            decode_groups(path, f, footer, [(g, tier.read_range(path, g.pos, g.length))],
                          st.schema)
        except CorruptSegment as e:
            report.problems.append(str(e))
        report.bytes_verified += g.length
        if progress is not None:
            progress(g.length)


def _check_records(buf: Any, records: int, what: str, report: CheckReport) -> None:
    """Report the chunk in ``buf`` unless it decodes to ``records`` valid records."""
    try:
        rows = sum(b.num_rows for b in ChunkDecoder(check=True).batches(buf, lambda: what))
    except CorruptSegment as e:
        report.problems.append(f"{e} (it matches its checksum: stored unvalidated, or forged)")
        return
    if rows != records:
        report.problems.append(f"{what}: holds {rows} records, the log recorded {records}")


def _present(tier: Any, path: str) -> bool:
    try:
        tier.file_size(path)
    except FileNotFoundError:
        return False
    return True


def _check_shared(topic: Topic, sid: str, rows: Any, verify: bool, report: CheckReport,
                  progress: Callable[[int], None] | None) -> None:
    """Passes 3 and 4 for segment ``sid``'s chunks ``rows`` in shared objects."""
    shared = topic.store.shared
    assert shared is not None
    report.chunks += len(rows)
    seen: dict[str, bool] = {}
    for r in rows:
        url = shared.bundle_url(topic.name, topic.id,
                                bundle_text(int(r["obj_hi"]), int(r["obj_lo"])))
        opos, length, base = int(r["opos"]), int(r["length"]), int(r["base"])
        where = (f"segment {sid}: chunk of offsets [{base}, {base + int(r['records'])}) "
                 f"in shared object {url} at byte {opos}")
        if not verify:
            if url not in seen:
                seen[url] = shared.tier.fs.exists(url)
                if not seen[url]:
                    report.problems.append(f"segment {sid}: shared object {url} is missing")
            continue
        try:
            buf = read_range(url, opos, length)
            ok = checksum(buf) == int(r["checksum"])
        except FileNotFoundError:
            report.problems.append(f"{where}: the object is missing")
            continue
        except (OSError, ValueError) as e:  # a short object: the range is not all there
            report.problems.append(f"{where}: cannot be read ({e})")
            continue
        if not ok:
            report.problems.append(f"{where} does not match its checksum")
        else:
            _check_records(buf, int(r["records"]), where, report)
        report.bytes_verified += length
        if progress is not None:
            progress(length)


def check_named(store: Store, name: str, verify: bool = True,
                progress: Callable[[int], None] | None = None) -> CheckReport:
    """Check topic ``name`` of ``store``; a log that does not load is its report's problem."""
    try:
        topic = store.topic(name)
    except (CorruptSegment, CorruptLog) as e:
        return CheckReport(name, problems=[str(e)])
    return check_topic(topic, verify, progress)


def readable_states(store: Store) -> list[TopicState]:
    """The states of the topics of ``store`` whose commit log loads; each other one is
    logged (once per damage) and left out, so that one damaged topic does not stop the
    store's accounting for the others."""
    out = []
    for name in store.topics():
        try:
            out.append(store.topic(name).state())
        except CorruptLog as e:
            if str(e) not in _warned:
                _warned.add(str(e))
                log.warning("topic %s is left out of the store's accounting: %s", name, e)
    return out


__all__ = ["CheckReport", "check_named", "check_topic", "readable_states"]
