"""Relocating a tier: pointing a store at the new place of a tier directory.

A tier's path is a layout key, fixed when the store is created, because the commit log names
segments by tier and the tier's path says where they are. When the directory itself moves
(another PMem mount point, a new disk, a bucket copied elsewhere), or when a copy of a store
gets copies of its tiers outside the root, :func:`relocate_tier` records the new path, once
it has checked that the new place holds every committed segment of the tier, at least up to
its last committed chunk. It never copies data: the operator moves or copies the directory
first, with writers and the migration service stopped.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .commit_log import CommitLog
from .config import StoreConfig, canonical_key, parse_config, tier_key
from .errors import ConfigError
from .layout import (
    STORE_FILE,
    STORE_LOCK,
    TIER_OWNER,
    entry_name,
    file_lock,
    fsync_dir,
    log_dir,
    write_atomic,
)
from .store import _inside, _owner_store, _portable, _resolve_path, read_saved
from .tiers import make_tier
from .tiers.base import Tier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Relocation:
    """What :func:`relocate_tier` did: the tier, its old and new path, the segments checked."""

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
    not. ``path`` is checked first: it must be a tier of the same kind (a local directory,
    or an fsspec URL for a REMOTE tier), no other tier of the store, and hold every segment
    the commit log places on the tier, each at least as long as its last committed chunk
    (``progress`` is called with 1 per segment checked); a local directory outside the root
    must not be another store's tier. Otherwise :class:`ConfigError` says what is missing
    and nothing changes. Stop the store's writers and migration service first: a process
    with the store open goes on using the old path until it opens it again.
    """
    root = os.path.abspath(os.fspath(root))
    if not os.path.isfile(os.path.join(root, STORE_FILE)):
        raise ConfigError(f"no store at {root} (no {STORE_FILE})")
    with file_lock(os.path.join(root, STORE_LOCK)):
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
        remote = spec.type == "REMOTE"
        if remote != ("://" in path):
            raise ConfigError(f"{path}: tier {number} is {spec.type}, so its path is "
                              f"{'an fsspec URL' if remote else 'a local directory'}")
        key = canonical_key(f"storage.tiers.{number}.paths")
        new = path if remote else _resolve_path(os.getcwd(), key, path)
        _check_new_path(root, number, new, old, [s.path for s in specs])
        tier = make_tier(replace(spec, path=new), config)
        segments, total = _check_segments(root, number, tier, progress)
        if not remote:
            _take_directory(root, saved.get("id"), number, new)
        # Every spelling of the key goes: the canonical one is what is saved from now on.
        saved["config"] = {k: v for k, v in saved["config"].items()
                           if tier_key(k) != (number, "paths")}
        saved["config"][key] = new
        saved["layout"]["tier.paths"][number - 1] = new
        write_atomic(os.path.join(root, STORE_FILE),
                     json.dumps(_portable(root, saved), indent=1).encode())
        if not remote:
            _release_directory(root, saved.get("id"), old)
    log.info("store %s: tier %d relocated from %s to %s (%d segments checked)", root, number,
             old, new, segments)
    return Relocation(number, old, new, segments, total)


def _check_new_path(root: str, number: int, new: str, old: str, paths: list[str]) -> None:
    if "://" in new:
        if new.rstrip("/") == old.rstrip("/"):
            raise ConfigError(f"tier {number} is at {new} already")
        return
    if not os.path.isdir(new):
        why = "no such directory" if not os.path.exists(new) else "not a directory"
        raise ConfigError(f"{new}: {why}; move or copy tier {number}'s directory ({old}) "
                          "there first")
    real = os.path.realpath(new)
    for n, p in enumerate(paths, 1):
        if "://" not in p and os.path.exists(p) and os.path.realpath(p) == real:
            raise ConfigError(f"{new} is tier {n}'s directory already" if n == number else
                              f"{new} is the store's tier {n}; a tier needs a directory of "
                              "its own")
    if real == os.path.realpath(root):
        raise ConfigError(f"{new} is the store's root; a tier needs a directory of its own")


def _check_segments(root: str, number: int, tier: Tier, progress: Callable[[int], None] | None
                    ) -> tuple[int, int]:
    """Check that ``tier`` (at its new path) holds the committed segments the commit log
    places on tier ``number``; (segments, bytes) checked."""
    missing: list[str] = []
    short: list[str] = []
    count = total = 0
    for name in sorted(os.listdir(root)):
        d = log_dir(root, name)
        if not (os.path.exists(os.path.join(d, entry_name(0))) or
                os.path.exists(os.path.join(d, "_last_checkpoint"))):
            continue
        st = CommitLog(d, name).load()
        for seg in st.segments.values():
            if seg.tier != number:
                continue
            rows = st.chunks[seg.partition].rows()
            mine = rows[rows["seq"] == seg.seq]
            need = int(np.max(mine["pos"] + mine["len"])) if len(mine) else 0
            spath = tier.segment_path(name, seg.partition, seg.seq)
            try:
                size = tier.file_size(spath)
            except FileNotFoundError:
                missing.append(spath)
            else:
                if size < need:
                    short.append(f"{spath} ({size} bytes, its chunks end at {need})")
            count += 1
            total += need
            if progress is not None:
                progress(1)
    if missing or short:
        what = []
        if missing:
            what.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if short:
            what.append(f"{len(short)} shorter than their committed chunks (e.g. "
                        f"{', '.join(short[:3])})")
        raise ConfigError(f"{tier.path} does not hold tier {number}'s segments: of {count}, "
                          f"{'; '.join(what)}. Move or copy the whole tier directory there, "
                          "with the store's writers stopped, and try again; nothing changed")
    return count, total


def _take_directory(root: str, store_id: str | None, number: int, new: str) -> None:
    """Write this store's claim into ``new`` unless another store uses it as a tier."""
    marker = os.path.join(new, TIER_OWNER)
    if _inside(os.path.realpath(root), os.path.realpath(new)):
        if os.path.exists(marker):  # a claim copied along; tiers in the root carry none
            os.unlink(marker)
            fsync_dir(new)
        return
    try:
        with open(marker, "rb") as f:
            owner = json.loads(f.read())
        owner_root = str(owner["root"])
    except FileNotFoundError:
        owner_root = None
    except (ValueError, KeyError, TypeError):
        owner_root = None  # unreadable: claimed anew below
    if owner_root is not None and owner_root != root:
        other = _owner_store(owner_root)
        real = os.path.realpath(new)
        if other is not None and any(
                "://" not in p and os.path.exists(p) and os.path.realpath(p) == real
                for p in other["layout"]["tier.paths"]):
            raise ConfigError(
                f"{new} is a tier directory of the store at {owner_root} (see {marker}); "
                f"tier {number} of the store at {root} needs a copy of its own")
    write_atomic(marker, json.dumps({"store": store_id, "root": root}).encode())


def _release_directory(root: str, store_id: str | None, old: str) -> None:
    """Drop this store's claim on the tier's old directory, if it is still there."""
    marker = os.path.join(old, TIER_OWNER)
    try:
        with open(marker, "rb") as f:
            owner = json.loads(f.read())
    except (OSError, ValueError):
        return
    if isinstance(owner, dict) and owner.get("root") == root and \
            owner.get("store") == store_id:
        os.unlink(marker)
        fsync_dir(old)
