"""Relocating a tier: pointing a store at the new place of a tier directory.

A tier's path is a layout key, fixed when the store is created, because the commit log names
segments by tier and the tier's path says where they are. When the directory itself moves
(another PMem mount point, a new disk, a bucket copied elsewhere), or when a copy of a store
gets copies of its tiers outside the root, :func:`relocate_tier` records the new path, once
it has checked that the new place holds the tier's committed segments. It never copies data:
the operator moves or copies the directory first, with writers and the migration service
stopped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..chunk import checksum
from ..commit_log import CommitLog
from ..config import StoreConfig, canonical_key, parse_config, tier_key
from ..errors import ConfigError, CorruptSegment, StoreNotFound
from ..layout import (
    STORE_FILE,
    STORE_LOCK,
    TIERS_LOCK,
    file_lock,
    is_topic,
    is_url,
    write_atomic,
)
from ..reading import read_range
from ..state import TopicState
from ..tiers import make_tier
from ..tiers.base import Tier
from .claims import (
    LocalClaim,
    claim_data,
    claim_of,
    enclosing_owner,
    owner_store,
    read_owner,
    same_store,
)
from .rootfiles import PosixRootFiles
from .saved import inside, portable, read_saved, relocations, resolve_path, tier_overlap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Relocation:
    """What :func:`relocate_tier` did: the tier, its old and new path, what it checked."""

    tier: int
    old_path: str
    new_path: str
    segments: int
    bytes: int


def relocate_tier(root: str | os.PathLike[str], number: int, path: str,
                  progress: Callable[[int], None] | None = None) -> Relocation:
    """Point tier ``number`` of the store at ``root`` to ``path``, where its directory was
    moved or copied, and save that in ``_store.json``.

    The store need not open: a copy whose tiers still name the original's directories does
    not. ``path`` must be of the tier's kind (a local directory, or an fsspec URL for a
    REMOTE tier), belong to no other store and overlap no other tier or topic of this one,
    and hold every segment the commit log places on the tier: each with its header, at
    least as long as its committed chunks, its last committed chunk matching its checksum
    (``progress`` is called with 1 per segment checked; ``pafka check`` verifies every
    chunk). Otherwise :class:`ConfigError` says what is wrong and nothing changes, as when an
    entry is published meanwhile without the store's lock (a release before the lock).
    Commits and moves wait while it runs; afterwards those of data written to the tier's old
    place are refused (:meth:`Store.publishing`), and the writer must open the store again.
    Stop the store's writers and migration service first.

    A store whose root is on an object store (``s3://``) is refused: the relocation fence
    is a lock of one host, so a commit from another host could publish data written to the
    tier's old place after the check; and its tiers are each host's own directories, which
    one saved path cannot name for every host.
    """
    if is_url(os.fspath(root)):
        raise ConfigError(f"the store at {os.fspath(root)} is on an object store, shared by "
                          "hosts: its tiers cannot be relocated (the relocation fence orders "
                          "one host's commits only). Copy the tier back where the store "
                          "expects it")
    root = os.path.abspath(os.fspath(root))
    files = PosixRootFiles(root)
    if not os.path.isfile(os.path.join(root, STORE_FILE)):
        raise StoreNotFound(f"no store at {root} (no {STORE_FILE})")
    with file_lock(os.path.join(root, STORE_LOCK)), file_lock(os.path.join(root, TIERS_LOCK)):
        saved = read_saved(root)
        if saved is None:
            raise ConfigError(f"{root}/{STORE_FILE} is gone")
        config = StoreConfig(parse_config(saved["config"]))
        specs = config.tiers(root)
        if isinstance(number, bool) or not isinstance(number, int) or \
                not 1 <= number <= len(specs):
            raise ConfigError(f"tier {number!r}: the store at {root} has tiers 1.."
                              f"{len(specs)} ({', '.join(s.type for s in specs)})")
        spec = specs[number - 1]
        old = saved["layout"]["tier.paths"][number - 1]
        key = canonical_key(f"storage.tiers.{number}.paths")
        new = parse_config({key: path})[key]  # the key's own rules (no commas, stripped)
        if not new:
            raise ConfigError(f"{key}: the new path of tier {number} is empty")
        remote = spec.type == "REMOTE"
        if remote != is_url(new):
            raise ConfigError(f"{new}: tier {number} is {spec.type}, so its path is "
                              f"{'an fsspec URL' if remote else 'a local directory'}")
        if remote:
            new = new.rstrip("/")
        else:
            new = resolve_path(os.getcwd(), key, new)
            _check_new_dir(root, saved["id"], number, new, old)
        for n, p in enumerate(s.path for s in specs):
            overlap = tier_overlap(new, p) if n + 1 != number else None
            if overlap == "same":
                raise ConfigError(f"{new} is the store's tier {n + 1}; a tier needs a place "
                                  "of its own")
            if overlap:
                raise ConfigError(f"{new} overlaps the store's tier {n + 1} ({p}); a tier "
                                  "needs a place of its own")
        tier = make_tier(replace(spec, path=new), config)
        states = _states(files)
        versions = {name: st.version for name, st in states.items()}
        segments, total = _check_segments(number, tier, states, progress)
        for name, st in states.items():
            now = CommitLog.on(files.topic_log(name)).refresh(st).version  # updates st
            if now != versions[name]:
                raise ConfigError(
                    f"topic {name!r} committed while tier {number} was being checked "
                    f"(version {versions[name]} -> {now}): stop the store's writers and "
                    "migration service, then relocate; nothing changed")
        created = sorted(set(files.topic_names()) - set(states))
        if created:
            raise ConfigError(
                f"topic {created[0]!r} was created while tier {number} was being checked: stop "
                "the store's writers and migration service, then relocate; nothing changed")
        _take(root, saved["id"], number, new)
        # Every spelling of the key goes: the canonical one is what is saved from now on.
        saved["config"] = {k: v for k, v in saved["config"].items()
                           if tier_key(k) != (number, "paths")}
        saved["config"][key] = new
        saved["layout"]["tier.paths"][number - 1] = new
        if not _same_place(old, new):
            # What writers that opened the store before this record with their chunks:
            # commits of data written under an older count are refused (Store.publishing).
            counts = relocations(saved)
            counts[number - 1] += 1
            saved["layout"]["tier.relocations"] = counts
        write_atomic(os.path.join(root, STORE_FILE),
                     json.dumps(portable(root, saved), indent=1).encode())
        if not _same_place(old, new):
            _release(root, saved["id"], number, old)
    log.info("store %s: tier %d relocated from %s to %s (%d segments checked)", root, number,
             old, new, segments)
    return Relocation(number, old, new, segments, total)


def _check_new_dir(root: str, store_id: str, number: int, new: str, old: str
                   ) -> None:
    """``new`` is a directory apart from the store's root and topics and in no other store
    (other tiers of this store are checked by the caller)."""
    if not os.path.isdir(new):
        why = "no such directory" if not os.path.exists(new) else "not a directory"
        raise ConfigError(f"{new}: {why}; move or copy tier {number}'s directory ({old}) "
                          "there first")
    real = os.path.realpath(new)
    real_root = os.path.realpath(root)
    if inside(real, real_root):
        raise ConfigError(f"{new} is the store's root or holds it; a tier needs a directory "
                          "of its own")
    if inside(real_root, real):
        top = os.path.relpath(real, real_root).split(os.sep)[0]
        if is_topic(real_root, top):
            raise ConfigError(f"{new} lies in the directory of topic {top!r}; a tier needs a "
                              "directory of its own")
    owner = enclosing_owner(real, real_root, store_id)
    if owner is not None:
        raise ConfigError(f"{new} lies in {owner}; a tier of the store at {root} needs a "
                          "directory of its own")


def _states(files: PosixRootFiles) -> dict[str, TopicState]:
    return {name: CommitLog.on(files.topic_log(name)).load() for name in files.topic_names()}


def _last_chunks(rows: np.ndarray) -> dict[int, np.void]:
    """Each segment's last committed chunk (highest position), by segment seq."""
    if not len(rows):
        return {}
    order = np.lexsort((rows["pos"], rows["seq"]))
    by = rows[order]
    last = np.flatnonzero(np.append(by["seq"][1:] != by["seq"][:-1], True))
    return {int(by["seq"][i]): by[i] for i in last}


def _check_segments(number: int, tier: Tier, states: dict[str, TopicState],
                    progress: Callable[[int], None] | None) -> tuple[int, int]:
    """Check that ``tier`` (at its new path) holds the committed segments the commit log
    places on tier ``number``; (segments, committed bytes) checked."""
    bad: dict[str, list[str]] = {}
    count = total = 0
    for name, st in states.items():
        last: dict[int, dict[int, np.void]] = {}
        for seg in st.segments.values():
            if seg.tier != number:
                continue
            if seg.partition not in last:
                last[seg.partition] = _last_chunks(st.part(seg.partition).chunks.rows())
            spath = tier.segment_path(name, seg.partition, seg.seq)
            problem = _segment_problem(tier, spath, seg.partition, seg.seq, seg.extent,
                                       last[seg.partition].get(seg.seq))
            if problem:
                bad.setdefault(problem[0], []).append(f"{spath}{problem[1]}")
            count += 1
            total += seg.bytes
            if progress is not None:
                progress(1)
    if bad:
        found = "; ".join(f"{len(v)} {k} (e.g. {', '.join(v[:3])})" for k, v in bad.items())
        raise ConfigError(f"{tier.path} does not hold tier {number}'s segments: of {count}, "
                          f"{found}. Move or copy the whole tier directory there, with the "
                          "store's writers stopped, and try again; nothing changed")
    return count, total


def _segment_problem(tier: Tier, path: str, partition: int, seq: int, extent: int,
                     last: np.void | None) -> tuple[str, str] | None:
    """(kind, detail) of what is wrong with one segment at the new place, or None."""
    try:
        size = tier.file_size(path)
        header = tier.read_header(path)
    except FileNotFoundError:
        return "missing", ""
    except CorruptSegment as e:
        return "with a damaged header", f" ({e})"
    if header is None:
        return "missing", ""
    if (header.partition, header.seq) != (partition, seq):
        return "of another segment", (f" (its header says partition {header.partition}, "
                                      f"segment {header.seq})")
    if size < extent:
        return "shorter than their committed chunks", (f" ({size} bytes, its chunks end at "
                                                       f"{extent})")
    if last is not None:
        buf = read_range(path, int(last["pos"]), int(last["length"]))
        if checksum(buf) != int(last["checksum"]):
            return "whose last committed chunk does not match its checksum", ""
    return None


def _take(root: str, store_id: str, number: int, new: str) -> None:
    """Claim ``new`` for this store, unless another store on this host uses it as a tier;
    a tier in the root carries no claim (one copied along is dropped). A claim from another
    host is taken over: the operator names the place, and it holds this store's segments."""
    claim = claim_of(number, new)
    if isinstance(claim, LocalClaim) and not is_url(new) and \
            inside(os.path.realpath(root), os.path.realpath(new)):
        claim.remove()
        return
    try:
        owner = read_owner(claim)
    except ValueError:
        owner = None  # unreadable: claimed anew
    if owner is not None and not same_store(owner, root, store_id):
        if owner.here():
            other = owner_store(owner.root)
            if other is not None and other.get("id") == owner.id and \
                    any(_same_place(p, new) for p in other["layout"]["tier.paths"]):
                raise ConfigError(f"{new} is a tier of the store at {owner.root} (see "
                                  f"{claim.marker}); tier {number} of the store at {root} "
                                  "needs a copy of its own")
        log.warning("tier %d %s: claim of %s taken over by the store at %s", number, new,
                    owner.text(), root)
    claim.replace(claim_data(root, store_id))


def _same_place(a: str, b: str) -> bool:
    if is_url(a) != is_url(b):
        return False
    if is_url(a):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.exists(a) and os.path.realpath(a) == os.path.realpath(b)


def _release(root: str, store_id: str, number: int, old: str) -> None:
    """Drop this store's claim on the tier's old place, if it is still there."""
    try:
        claim = claim_of(number, old)
        owner = read_owner(claim)
        if owner is not None and same_store(owner, root, store_id):
            claim.remove()
    except (OSError, ValueError, ConfigError) as e:  # the old place may be gone
        log.info("tier %d: old place %s not released: %s", number, old, e)
