"""Opening a store: its saved configuration checked against what the caller gives, its
tiers checked, claimed and prepared, or the store created.

Opens hold ``_store.lock`` shared; creating a store holds it exclusively, so two processes
creating one store never claim its tiers against each other, and a resize (exclusive) is
never half seen.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..commit_log import CommitLog
from ..config import LAYOUT_KEYS, StoreConfig, TierSpec, parse_config, render_value, tier_key
from ..errors import ConfigError, StoreFull, StoreNotFound
from ..layout import (
    STORE_FILE,
    STORE_LOCK,
    TIER_OWNER,
    is_url,
    makedirs_durable,
)
from ..locks import raise_open_files
from ..tiers import NO_SPACE, Tier, make_tier
from .claims import check_apart, claim_local_tiers
from .rootfiles import RootFiles
from .roots import check_object_tiers
from .saved import FORMAT, decode_saved, encode_saved, inside, relocations, tier_overlap

log = logging.getLogger(__name__)


@dataclass
class Opened:
    """What opening a store established."""

    config: StoreConfig  # the saved configuration with the given overrides
    tiers: list[Tier]
    store_id: str
    relocations: list[int]  # each tier's relocation count at the open


def open_root(files: RootFiles, given: Mapping[str, Any], create: bool) -> Opened:
    """Open the store whose root ``files`` holds, with the settings ``given`` (tier paths
    resolved); create it first unless it exists or ``create`` is False
    (:class:`StoreNotFound`)."""
    root = files.root
    raise_open_files()  # a handle holds a descriptor per topic it opens
    if (not create or is_url(root)) and files.read(STORE_FILE) is None:
        if not create:
            why = "" if is_url(root) or os.path.isdir(root) else (
                ": the directory does not exist" if not os.path.lexists(root) else
                ": it is not a directory")
            raise StoreNotFound(f"no pafka store at {root} (no {STORE_FILE}{why}); check the "
                                "path, or create the store by writing to it")
        if is_url(root):
            check_object_tiers(root, given, StoreConfig(dict(given)).tiers(root))
    files.make_root()
    # Shared against a resize, which saves a new size and changes the pool under the
    # exclusive lock: an open never completes a pool to a size read before that.
    with files.lock(STORE_LOCK, shared=True):
        saved = decode_saved(files.read(STORE_FILE), root, files.where(STORE_FILE))
        if saved is not None:
            return _open_saved(files, saved, given)
    with files.lock(STORE_LOCK):
        if files.read(STORE_FILE) is None:
            _create(files, root, StoreConfig(dict(given)))
    with files.lock(STORE_LOCK, shared=True):
        saved = decode_saved(files.read(STORE_FILE), root, files.where(STORE_FILE))
        if saved is None:
            raise ConfigError(f"{root}/{STORE_FILE} vanished while the store was opened")
        return _open_saved(files, saved, given)


def _open_saved(files: RootFiles, saved: dict[str, Any], given: Mapping[str, Any]) -> Opened:
    """Check ``given`` against the store's saved configuration and its tiers, claim and
    prepare them. Under the shared lock."""
    root = files.root
    store_id = saved["id"]
    base = StoreConfig(parse_config(saved["config"]))
    _check_layout(root, base, given, saved["layout"])
    effective = base.with_overrides(given)
    specs = effective.tiers(root)
    check_shared_tiers(root, specs)
    _check_tier_dirs(files, store_id, specs)
    claim_local_tiers(root, store_id, specs)
    tiers = [make_tier(spec, effective) for spec in specs]
    for t in tiers:
        try:
            t.prepare()
            # On every open, not only the first: a crash while pre-allocating (or a tier on
            # RAM that lost its files) must not leave a pool short for good. Cheap once
            # complete; a pool its filesystem cannot hold whole is left short, with a warning.
            t.ensure_pool()
        except OSError as e:
            if e.errno not in NO_SPACE:
                raise
            # Readers need no room: open, and let placement find the tier full.
            log.warning("tier %d (%s): its filesystem is full (%s); the store opens, and new "
                        "segments go to the next tier with room", t.number, t.path, e)
    return Opened(effective, tiers, store_id, relocations(saved))


def _create(files: RootFiles, root: str, config: StoreConfig) -> None:
    """Create the store at ``root``: make and claim its tiers, then save ``_store.json``."""
    specs = config.tiers(root)
    check_shared_tiers(root, specs)
    _check_distinct_tiers(root, specs)
    store_id = uuid.uuid4().hex
    check_apart(root, store_id, specs)
    # Made and claimed before _store.json exists: from then on, a missing or unclaimed one
    # has moved or is lost, and a store refused a tier is not left behind.
    try:
        for spec in specs:
            if not is_url(spec.path):
                makedirs_durable(spec.path)
        claim_local_tiers(root, store_id, specs)
        saved = {"format": FORMAT, "id": store_id, "config": config.saved(),
                 "layout": config.layout(root)}
        created = files.create(STORE_FILE, encode_saved(root, saved))
    except OSError as e:
        if e.errno not in NO_SPACE:
            raise
        where = ", ".join([root] + [s.path for s in specs if not is_url(s.path)])
        raise StoreFull(f"the store at {root} cannot be created: a filesystem it needs is "
                        f"full ({e.strerror}); free space on the one holding {where} and try "
                        "again") from None
    if not created and files.shared:
        # Another host created the store meanwhile (its lock is not this host's): this open
        # opens that one, and its claims replace the ones made here for the lost one.
        log.info("the store at %s was created by another host meanwhile; opening it", root)
    elif not created:
        raise ConfigError(f"{root}/{STORE_FILE} appeared while the store was being created "
                          "under its lock: was it written by hand?")


def is_shared(root: str, specs: list[TierSpec]) -> bool:
    """Whether the store is shared by many hosts: its root is on S3 and its last tier is
    REMOTE, the one every host reaches (see :mod:`tier_store.sharing`)."""
    return is_url(root) and len(specs) > 1 and specs[-1].type == "REMOTE"


def check_shared_tiers(root: str, specs: list[TierSpec]) -> None:
    """A shared store has one local tier, per host, and the REMOTE one: a segment moved to a
    local tier between them would be on one host only."""
    if is_shared(root, specs) and len(specs) != 2:
        raise ConfigError(
            f"storage.tiers.types={','.join(s.type for s in specs)}: the store at {root} is "
            "shared by many hosts (an s3:// root with a REMOTE tier), which takes two tiers: "
            "one local to each host, then the REMOTE one, e.g. NVME,REMOTE or PMEM,REMOTE")


def _check_distinct_tiers(root: str, specs: list[TierSpec]) -> None:
    """A new store's tiers are each a place of their own, apart from the root's own files."""
    real_root = root if is_url(root) else os.path.realpath(root)
    for i, spec in enumerate(specs):
        if not is_url(spec.path) and not is_url(root) and \
                inside(os.path.realpath(spec.path), real_root):
            raise ConfigError(f"storage.tiers.{spec.number}.paths={spec.path} is the store's "
                              f"root {root} or holds it; a tier needs a directory of its own")
        for other in specs[:i]:
            if tier_overlap(spec.path, other.path):
                raise ConfigError(
                    f"storage.tiers.{other.number}.paths={other.path} and storage.tiers."
                    f"{spec.number}.paths={spec.path} overlap; each tier needs a place of its "
                    "own")


def _check_tier_dirs(files: RootFiles, store_id: str, specs: list[TierSpec]) -> None:
    """An existing store's local tier directories are the ones it was made with: made (and
    claimed, outside the root) before its _store.json was saved, a missing or unclaimed
    one was moved, lost or is an unmounted mount point. Writing there would put new
    segments where none of the old ones are, and split the tier. A missing one in the root
    that no segment is on (a release that saved _store.json first) is made."""
    root = files.root
    for spec in specs:
        if is_url(spec.path):
            continue
        if is_shared(root, specs):
            # Each host has its own tier 1 at this path, claimed by the first open there; a
            # host's copies are a cache of the shared tier, so a lost one is made again.
            makedirs_durable(spec.path)
            continue
        outside = is_url(root) or not inside(os.path.realpath(root),
                                             os.path.realpath(spec.path))
        hint = f"`pafka relocate {root} {spec.number} DIR`"
        if os.path.isdir(spec.path):
            if not outside or os.path.lexists(os.path.join(spec.path, TIER_OWNER)):
                continue
            what = (f"has no {TIER_OWNER}: it is not the directory the tier was made in (an "
                    "unmounted mount point, or a directory made anew). If it is, record it "
                    f"with {hint} naming it")
        elif not outside and not _has_segments(files, spec.number):
            makedirs_durable(spec.path)
            continue
        else:
            what = "is missing"
        lost = (f"create the directory with an empty {TIER_OWNER} file in it" if outside else
                "create the empty directory")
        raise ConfigError(
            f"tier {spec.number} directory {spec.path} of the store at {root} {what}. If the "
            f"tier moved, record where with {hint}; if its data is lost (e.g. a RAM tier "
            f"after a reboot), {lost} to open the store without it (reads of its segments "
            "then fail as data loss)")


def _has_segments(files: RootFiles, number: int) -> bool:
    """Whether a committed segment of any topic is on tier ``number``."""
    return any(s.tier == number for name in files.topic_names()
               for s in CommitLog.on(files.topic_log(name)).load().segments.values())


def _check_layout(root: str, saved: StoreConfig, given: Mapping[str, Any],
                  saved_layout: dict[str, Any]) -> None:
    for key, value in given.items():
        if key in LAYOUT_KEYS and value != saved[key] and tier_key(key) is None:
            raise ConfigError(
                f"{key}={render_value(value)} conflicts with the store at {root}, created with "
                f"{key}={render_value(saved[key])}; layout keys cannot change")
    now_conf = saved.with_overrides(given)
    now = now_conf.layout(root)
    for n, (a, b) in enumerate(zip(now["tier.paths"], saved_layout["tier.paths"], strict=False),
                               1):
        if a != b:
            raise ConfigError(f"storage.tiers.{n}.paths={a} conflicts with the store at {root}, "
                              f"created with {b}; if tier {n}'s directory has moved there, "
                              f"record it with `pafka relocate {root} {n} {a}` "
                              "(tier_store.relocate_tier)")
    for a, b in zip(now_conf.tiers(root), saved.tiers(root), strict=False):
        if a.size != b.size:
            raise ConfigError(
                f"storage.tiers.{a.number}.sizes={a.size} conflicts with the store at {root}, "
                f"whose tier {a.number} has a capacity of {b.size} bytes; a tier's size "
                f"changes with `pafka resize {root} {a.number} SIZE` (Store.resize_tier), for "
                "every process at once")
