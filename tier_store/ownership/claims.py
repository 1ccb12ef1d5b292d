"""Tier claims: which store a tier directory (or remote tier URL) belongs to.

A tier outside its store's root carries a ``_pafka_store`` file naming the owning store (id,
root and host). Two stores must never share a tier: each would take the other's segments for
garbage and delete them, and their new segments would take the same names. A local tier is
claimed when the store opens; a remote one is checked before each move or garbage collection
there (reading it costs a request, so opens do not). A store's own claim is known by its root
and id on any host; the host decides only when the claiming store cannot be checked from here.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import TierSpec
from ..errors import ConfigError, CorruptState
from ..layout import (
    HOST_DIR,
    POOL_DIR,
    STORE_FILE,
    TIER_OWNER,
    TMP_PREFIX,
    create_exclusive,
    fsync_dir,
    is_url,
    read_regular,
    write_atomic,
)
from .roots import read_saved_at
from .saved import inside

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
        return read_regular(self.marker, CorruptState, "tier claim")

    def create(self, data: bytes) -> bool:
        return create_exclusive(self.marker, data)

    def replace(self, data: bytes) -> None:
        write_atomic(self.marker, data)

    def remove(self) -> None:
        try:
            os.unlink(self.marker)
        except FileNotFoundError:
            return
        fsync_dir(self.path)

    def holds_data(self) -> bool:
        """Anything but the pool, the claim and a host directory: topics' segments."""
        return any(n not in (TIER_OWNER, POOL_DIR, HOST_DIR) and not n.startswith(TMP_PREFIX)
                   for n in os.listdir(self.path))


class RemoteClaim:
    """A claim object on an fsspec filesystem: created with a conditional put where the
    filesystem has one (S3: ``If-None-Match``; a 412 answer is a claim that exists, however
    the filesystem translates it), else written and read back, which catches all but a
    near-simultaneous race."""

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
        for attempt in range(8):
            try:
                self.fs.pipe_file(self.marker, data, mode="create")
            except FileExistsError:
                return False
            except (TypeError, NotImplementedError, ValueError):
                # No exclusive create on this filesystem: write, then read back.
                self.fs.pipe_file(self.marker, data)
            except OSError as e:
                # s3fs turns a 412 into FileExistsError only when the server names the
                # failed condition (radosgw does not): the status code decides.
                status = http_status(e)
                if status == 412:
                    return False
                if status == 409 and attempt < 7:  # a concurrent conditional put: again
                    time.sleep(0.05 * 2 ** attempt)
                    continue
                raise
            return self.read() == data
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


def http_status(error: BaseException) -> int | None:
    """The HTTP status of the botocore answer behind ``error`` (or its causes), if any."""
    seen: BaseException | None = error
    for _ in range(5):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(status, int):
                return status
        seen = seen.__cause__ or seen.__context__
    return None


def claim_of(number: int, path: str) -> Claim:
    """The claim of tier ``number`` at ``path`` (a local directory or an fsspec URL)."""
    if not is_url(path):
        return LocalClaim(number, path)
    from ..tiers.remote import filesystem
    fs, base = filesystem(path)
    from fsspec.implementations.local import LocalFileSystem
    if isinstance(fs, LocalFileSystem):  # file://: durable, atomic local writes
        return LocalClaim(number, base, f"tier {number} {path}")
    return RemoteClaim(number, fs, base, path)


def owner_store(root: str) -> dict[str, Any] | None:
    """The saved configuration of the store at ``root`` (a directory or an object root);
    None if there is no store there. A store that is there but cannot be read is
    :class:`ConfigError`: it is not gone."""
    try:
        return read_saved_at(root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ConfigError, CorruptState) as e:
        raise ConfigError(f"cannot tell whether the store at {root} still exists: {e}") \
            from None


# Names the host in claims. Only consulted when a claim's root cannot be seen from here: a
# store's root seen from another host (a shared filesystem) is checked there, not by name.
HOST = os.environ.get("PAFKA_HOST_ID") or socket.gethostname()
UNKNOWN_HOST = "(a host the claim does not name)"


@dataclass(frozen=True)
class Owner:
    """The store a claim names: its root, id and the host that claimed it."""

    root: str
    id: str
    host: str

    def here(self) -> bool:
        return self.host == HOST

    def text(self) -> str:
        return f"the store at {self.root}" + ("" if self.here() else f" on host {self.host}")


def claim_data(root: str, store_id: str) -> bytes:
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
        # A claim naming no host cannot be this host's for sure: it counts as another's.
        fields = (owner["root"], owner["store"], owner.get("host") or UNKNOWN_HOST)
        if not all(isinstance(f, str) and f for f in fields):
            raise ValueError(f"root, store and host must be non-empty strings, got {fields!r}")
        return Owner(*fields)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(str(e)) from None


def same_store(owner: Owner, root: str, store_id: str) -> bool:
    """Whether ``owner`` is the store at ``root``: its id is this store's and its root is
    this store's (by name, or the same ``_store.json`` through another path)."""
    if owner.id != store_id:
        return False
    if owner.root == root:
        return True
    if is_url(owner.root) or is_url(root):
        return owner.root.rstrip("/") == root.rstrip("/")  # an object root has one name
    try:
        return os.path.samefile(os.path.join(owner.root, STORE_FILE),
                                os.path.join(root, STORE_FILE))
    except OSError:
        return False


def _owner_is_gone(claim: Claim, owner: Owner, root: str, number: int) -> bool:
    """Whether the store a claim names is gone: False if it exists (the caller refuses);
    :class:`ConfigError` if that cannot be told from here."""
    try:
        other = owner_store(owner.root)
    except ConfigError as e:
        raise ConfigError(f"{claim.where} is claimed (see {claim.marker}), and {e}; fix or "
                          "move that store first") from None
    if other is not None and other.get("id") == owner.id:
        return False
    if owner.here():
        return True  # no store there, or another one made there since
    # Claimed on another host: that root here, if any, is another machine's directory.
    raise ConfigError(
        f"{claim.where} belongs to {owner.text()} (see {claim.marker}), which cannot be "
        f"checked from host {HOST}. If it is the store at {root}, moved here, or that store is "
        f"gone, take the tier with {_relocate_hint(root, number, claim)} naming it; otherwise "
        f"give the store at {root} a tier of its own the same way")


def _relocate_hint(root: str, number: int, claim: Claim) -> str:
    place = "URL" if is_url(claim.where) else "DIR"
    return f"`pafka relocate {root} {number} {place}`"


def claim_tier(root: str, store_id: str, number: int, claim: Claim) -> None:
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
            if (owner.id, owner.host) != (store_id, HOST):
                claim.replace(mine)  # a renamed host
            return
        hint = _relocate_hint(root, number, claim)
        same_id = store_id is not None and owner.id == store_id
        if not _owner_is_gone(claim, owner, root, number):
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
                "naming it); if it is no more, move the directory aside")
        log.info("%s: claimed for the store at %s (was %s)", claim.where, root, owner.root)
        claim.replace(mine)
        return
    raise ConfigError(f"{claim.where}: {claim.marker} keeps changing; is another store being "
                      "created with the same tier?")


def enclosing_owner(path: str, root: str, store_id: str) -> str | None:
    """What ``path`` (a real path) lies in that is not the store at ``root`` (a real path):
    another store's root, which holds ``_store.json`` and keeps its default tiers without
    claims, or a tier directory above it claimed by another store that still exists (or
    cannot be checked from here). None if nothing."""
    d = path
    while True:
        if d != root and os.path.exists(os.path.join(d, STORE_FILE)):
            return f"the store at {d}"
        if d != path and os.path.exists(os.path.join(d, TIER_OWNER)):
            claim = LocalClaim(0, d)
            try:
                owner = read_owner(claim)
            except (OSError, ValueError):
                owner = None  # an unreadable claim blocks no one
            if owner is not None and not same_store(owner, root, store_id):
                try:
                    blocks = not _owner_is_gone(claim, owner, root, 0)
                except ConfigError:
                    blocks = True
                if blocks:
                    return f"the tier directory {d} (see {claim.marker})"
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def outside_root(root: str, specs: list[TierSpec]) -> list[TierSpec]:
    """The local tiers whose directories lie outside ``root`` (symlinks resolved: a symlink
    in the root to a PMem mount is copied by ``cp -r`` as a symlink)."""
    if is_url(root):
        return [s for s in specs if not is_url(s.path)]
    real_root = os.path.realpath(root)
    return [s for s in specs
            if not is_url(s.path) and not inside(real_root, os.path.realpath(s.path))]


def check_apart(root: str, store_id: str, specs: list[TierSpec]) -> None:
    """Refuse tiers outside ``root`` that lie in another store (its root or a tier of it).
    Checked where a tier is chosen (a new store, a relocation), not on every open: a store
    made later around an older one's tier must not lock the older one out."""
    real_root = root if is_url(root) else os.path.realpath(root)
    for spec in outside_root(root, specs):
        owner = enclosing_owner(os.path.realpath(spec.path), real_root, store_id)
        if owner is not None:
            raise ConfigError(f"tier {spec.number} directory {spec.path} lies in {owner}; a "
                              "store's tiers need directories of their own")


def claim_local_tiers(root: str, store_id: str, specs: list[TierSpec]) -> None:
    """Claim each local tier whose directory lies outside ``root``; the directories exist."""
    for spec in outside_root(root, specs):
        claim_tier(root, store_id, spec.number, LocalClaim(spec.number, spec.path))
