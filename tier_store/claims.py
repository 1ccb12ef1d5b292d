"""Tier claims: which store a tier directory (or remote tier URL) belongs to.

A tier outside its store's root carries a ``_pafka_store`` file naming the owning store (id
and root). Two stores must never share a tier: each would take the other's segments for
garbage and delete them, and their new segments would take the same names. A local tier is
claimed when the store opens; a remote one before the store first writes or reclaims files
there (reading it costs a request, so opens do not).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
from dataclasses import dataclass
from typing import Any, Protocol

from .config import TierSpec
from .errors import ConfigError
from .layout import (
    POOL_DIR,
    STORE_FILE,
    TIER_OWNER,
    TMP_PREFIX,
    fsync_dir,
    makedirs_durable,
    write_atomic,
    write_temp,
)
from .saved import inside, read_saved

log = logging.getLogger(__name__)


class Claim(Protocol):
    """The ``_pafka_store`` of one tier."""

    where: str  # the tier, for messages: "tier 1 directory /mnt/pmem0"
    marker: str  # the claim's path or URL

    def read(self) -> bytes | None: ...
    def create(self, data: bytes) -> bool: ...
    def replace(self, data: bytes) -> None: ...
    def remove(self) -> None: ...
    def holds_data(self) -> bool: ...


class LocalClaim:
    """A claim in a local directory: created exclusively (link), replaced atomically."""

    def __init__(self, number: int, path: str, where: str | None = None):
        self.path = path
        self.where = where or f"tier {number} directory {path}"
        self.marker = os.path.join(path, TIER_OWNER)

    def read(self) -> bytes | None:
        try:
            with open(self.marker, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def create(self, data: bytes) -> bool:
        tmp = write_temp(self.path, data)
        try:
            os.link(tmp, self.marker)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        fsync_dir(self.path)
        return True

    def replace(self, data: bytes) -> None:
        write_atomic(self.marker, data)

    def remove(self) -> None:
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            return
        fsync_dir(self.path)

    def holds_data(self) -> bool:
        """Anything but the pool and the claim: topics' segments."""
        return any(n not in (TIER_OWNER, POOL_DIR) and not n.startswith(TMP_PREFIX)
                   for n in os.listdir(self.path))


class RemoteClaim:
    """A claim object on an fsspec filesystem. Object stores have no exclusive create: a
    new claim is written and read back, which catches all but a near-simultaneous race."""

    def __init__(self, number: int, fs: Any, base: str, url: str):
        self.fs, self.base = fs, base
        self.where = f"tier {number} {url}"
        self.marker = fs.unstrip_protocol(posixpath.join(base, TIER_OWNER))

    def read(self) -> bytes | None:
        try:
            return bytes(self.fs.cat_file(self.marker))
        except FileNotFoundError:
            return None

    def create(self, data: bytes) -> bool:
        try:
            self.fs.pipe_file(self.marker, data, mode="create")
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):
            # No exclusive create on this filesystem: write, then read back.
            self.fs.pipe_file(self.marker, data)
        return self.read() == data

    def replace(self, data: bytes) -> None:
        self.fs.pipe_file(self.marker, data)

    def remove(self) -> None:
        try:
            self.fs.rm(self.marker)
        except FileNotFoundError:
            pass

    def holds_data(self) -> bool:
        self.fs.invalidate_cache(self.base)  # a cached listing may predate other writers
        if not self.fs.exists(self.base):
            return False
        return any(posixpath.basename(n.rstrip("/")) != TIER_OWNER and
                   not posixpath.basename(n.rstrip("/")).startswith(TMP_PREFIX)
                   for n in self.fs.ls(self.base, detail=False))


def claim_of(number: int, path: str) -> Claim:
    """The claim of tier ``number`` at ``path`` (a local directory or an fsspec URL)."""
    if "://" not in path:
        return LocalClaim(number, path)
    from .tiers.remote import filesystem
    fs, base = filesystem(path)
    from fsspec.implementations.local import LocalFileSystem
    if isinstance(fs, LocalFileSystem):  # file://: durable, atomic local writes
        return LocalClaim(number, base, f"tier {number} {path}")
    return RemoteClaim(number, fs, base, path)


def owner_store(root: str) -> dict[str, Any] | None:
    """The saved configuration of the store at ``root``; None if there is none (readable)."""
    try:
        return read_saved(root)
    except (OSError, ConfigError):
        return None


HOST = socket.gethostname()


@dataclass(frozen=True)
class Owner:
    """The store a claim names: its root, id (None: made by a release without ids) and host
    (None: claimed by a release that did not record it, taken as this host)."""

    root: str
    id: str | None
    host: str | None

    def here(self) -> bool:
        return self.host in (None, HOST)

    def text(self) -> str:
        return f"the store at {self.root}" + ("" if self.here() else f" on host {self.host}")


def claim_data(root: str, store_id: str | None) -> bytes:
    """What a claim by the store at ``root`` holds."""
    return json.dumps({"store": store_id, "root": root, "host": HOST}).encode()


def read_owner(claim: Claim) -> Owner | None:
    """The store the claim names; None if there is no claim. Raises ValueError if it is
    unreadable."""
    raw = claim.read()
    if raw is None:
        return None
    try:
        owner = json.loads(raw)
        host = owner.get("host")
        return Owner(str(owner["root"]), owner.get("store"),
                     None if host is None else str(host))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(str(e)) from None


def same_store(owner: Owner, root: str, store_id: str | None) -> bool:
    """Whether ``owner`` is the store at ``root``: named so, or its root is this store's
    through another path (a symlink). Stores without ids never match by id."""
    if not owner.here():
        return False
    if owner.root == root and owner.id == store_id:
        return True
    try:
        return os.path.samefile(os.path.join(owner.root, STORE_FILE),
                                os.path.join(root, STORE_FILE))
    except OSError:
        return False


def _relocate_hint(root: str, number: int, claim: Claim) -> str:
    place = "URL" if "://" in claim.where else "DIR"
    return f"`pafka relocate {root} {number} {place}`"


def claim_tier(root: str, store_id: str | None, number: int, claim: Claim) -> None:
    """Make sure no other store writes into the tier of ``claim``.

    The tier is refused when its claim names a store that still exists and is not this one:
    a copy of this root (same id, another ``_store.json``) or another store. The same store
    seen through another path (a symlink) is accepted, and a store moved to this root takes
    its tier's claim along. A tier whose owner is gone is taken over only when it holds no
    segments: they may belong to a store moved elsewhere and not opened there yet.
    """
    mine = claim_data(root, store_id)
    for _ in range(3):
        try:
            owner = read_owner(claim)
        except ValueError:
            # Unreadable (torn by hand or by a disk error; it is written atomically): the
            # store opening it claims it again.
            log.warning("%s: %s is unreadable; claiming the tier for the store at %s",
                        claim.where, claim.marker, root)
            claim.replace(mine)
            return
        if owner is None:
            if claim.create(mine):
                return
            continue  # claimed by another process meanwhile: read theirs
        if same_store(owner, root, store_id):
            if store_id is not None and (owner.id != store_id or owner.host is None):
                claim.replace(mine)  # a claim by a release without ids or hosts
            return
        hint = _relocate_hint(root, number, claim)
        if not owner.here():
            # Whether that store still exists cannot be seen from here: never assume not.
            raise ConfigError(
                f"{claim.where} belongs to {owner.text()} (see {claim.marker}), which cannot "
                f"be checked from host {HOST}. If it is this store, moved here, or that store "
                f"is gone, take the tier with {hint} naming it; otherwise give the store at "
                f"{root} a tier of its own the same way")
        same_id = store_id is not None and owner.id == store_id
        other = owner_store(owner.root)
        if other is not None and other.get("id") == owner.id:
            what = "a copy of that store" if same_id else "another store"
            raise ConfigError(
                f"{claim.where} belongs to the store at {owner.root} (see {claim.marker}); "
                f"the store at {root} is {what} and would write over its segments. Open the "
                f"store at {owner.root}; the store at {root} needs a tier of its own (a copy "
                f"of this one for a copy of the store), recorded with {hint}")
        if not same_id and claim.holds_data():
            raise ConfigError(
                f"{claim.where} holds segments of the store that was at {owner.root} (see "
                f"{claim.marker}), which is gone from there. If that store was moved, open "
                f"it where it is now (if it is the store at {root}, take the tier with {hint} "
                "naming it); if it was deleted, empty the directory")
        log.info("%s: claimed for the store at %s (was %s)", claim.where, root, owner.root)
        claim.replace(mine)
        return
    raise ConfigError(f"{claim.where}: {claim.marker} keeps changing; is another store being "
                      "created with the same tier?")


def enclosing_owner(path: str, root: str, store_id: str | None) -> str | None:
    """What ``path`` (a real path) lies in that is not the store at ``root`` (a real path):
    another store's root, which holds ``_store.json`` and keeps its default tiers without
    claims, or a tier directory above it claimed by another store. None if nothing."""
    d = path
    while True:
        if d != root and os.path.exists(os.path.join(d, STORE_FILE)):
            return f"the store at {d}"
        if d != path and os.path.exists(os.path.join(d, TIER_OWNER)):
            try:
                owner = read_owner(LocalClaim(0, d))
            except (OSError, ValueError):
                owner = None
            if owner is None or not same_store(owner, root, store_id):
                return f"the tier directory {d} (see {os.path.join(d, TIER_OWNER)})"
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def claim_local_tiers(root: str, store_id: str | None, specs: list[TierSpec]) -> None:
    """Claim each local tier whose directory lies outside ``root`` (symlinks resolved: a
    symlink in the root to a PMem mount is copied by ``cp -r`` as a symlink)."""
    real_root = os.path.realpath(root)
    for spec in specs:
        real = os.path.realpath(spec.path)
        if "://" in spec.path or inside(real_root, real):
            continue
        owner = enclosing_owner(real, real_root, store_id)
        if owner is not None:
            raise ConfigError(f"tier {spec.number} directory {spec.path} lies in {owner}; a "
                              "store's tiers need directories of their own")
        makedirs_durable(spec.path)
        claim_tier(root, store_id, spec.number, LocalClaim(spec.number, spec.path))
