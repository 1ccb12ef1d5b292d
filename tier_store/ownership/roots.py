"""The two kinds of store root, told apart and opened: a local directory
(:class:`~tier_store.ownership.rootfiles.PosixRootFiles`) or an ``s3://bucket/prefix`` URL
(:class:`~tier_store.ownership.objectroot.ObjectRootFiles`).

No other URL scheme may be a root: a root's files and commit logs need an atomic
put-if-absent, and fsspec's generic filesystems only check, then write. Options of an
``s3://`` root (``storage.root.options``, e.g. its ``endpoint_url``) are remembered per
process for the URL, so that what opens the store again without them (a read planned
again, a tier's claim checked) reaches the same server.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any

from ..config import OPEN_KEYS, canonical_key
from ..errors import ConfigError
from ..layout import HOST_DIR, ROOT_SCHEMES, STORE_FILE, is_url
from .objectroot import ObjectRootFiles
from .rootfiles import PosixRootFiles, RootFiles
from .saved import decode_saved, read_saved

if TYPE_CHECKING:
    from ..objects import ObjectStore

_guard = threading.Lock()
_options: dict[str, dict[str, Any]] = {}  # root URL -> the options it was last opened with


def root_location(root: str | os.PathLike[str]) -> str:
    """``root`` as a store names it: an absolute directory, or an ``s3://`` URL without a
    trailing slash. Any other scheme is :class:`ConfigError`."""
    text = os.fspath(root)
    if not is_url(text):
        return os.path.abspath(text)
    scheme, rest = text.split("://", 1)
    if scheme.lower() not in ROOT_SCHEMES:
        raise ConfigError(
            f"store root {text}: a store root is a local directory or an s3:// URL, not "
            f"{scheme}://. A root's commit logs need atomic conditional writes (S3's "
            "If-None-Match), which other fsspec filesystems only imitate by checking, then "
            "writing: two writers could both win. Keep the root local, or on S3")
    rest = rest.strip("/")
    if not rest or rest.startswith("/"):
        raise ConfigError(f"store root {text}: name a bucket, e.g. s3://bucket/pafka")
    return f"s3://{rest}"


def object_store(url: str, options: Mapping[str, Any] | None = None) -> ObjectStore:
    """The object store at root ``url``, with ``options`` (default: those this process
    last opened it with)."""
    from ..objects import ObjectStore
    with _guard:
        if options is None:
            options = _options.get(url)
        else:
            _options[url] = dict(options)
    return ObjectStore.open(url, options or None)


def root_files(root: str, given: Mapping[str, Any]) -> RootFiles:
    """The files of the store root ``root`` (as :func:`root_location` gives it), opened
    with the settings ``given``."""
    if not is_url(root):
        extra = [k for k in OPEN_KEYS if given.get(k)]
        if extra:
            raise ConfigError(f"{extra[0]} applies to s3:// store roots only; the store at "
                              f"{root} is a local directory, which keeps its locks and "
                              "pointers itself")
        return PosixRootFiles(root)
    files = ObjectRootFiles(object_store(root, given.get("storage.root.options")), None)
    files.host_dir = _host_dir(files, given)
    return files


def _host_dir(files: ObjectRootFiles, given: Mapping[str, Any]) -> str | None:
    """This host's directory for the store: ``storage.host.dir``, else ``_host`` in tier
    1's directory (given, or saved); None for a store not created yet without tier paths
    (creating it is then refused)."""
    explicit = given.get("storage.host.dir")
    if explicit:
        if is_url(explicit):
            raise ConfigError(f"storage.host.dir={explicit}: this host's directory must be a "
                              "local directory")
        return os.path.abspath(explicit)
    first = given.get("storage.tiers.first.paths")
    if not first:
        saved = decode_saved(files.read(STORE_FILE), files.root, files.where(STORE_FILE))
        if saved is None:
            return None
        first = saved["layout"]["tier.paths"][0]
    if is_url(first):
        raise ConfigError(f"tier 1 of the store at {files.root} is {first}, not a local "
                          "directory: set storage.host.dir to a local directory for this "
                          "host's locks and pointers")
    return os.path.join(first, HOST_DIR)


def check_object_tiers(root: str, given: Mapping[str, Any], tiers: list[Any]) -> None:
    """A new store at an object root names its tiers' places: none defaults into the root."""
    for spec in tiers:
        key = f"storage.tiers.{spec.number}.paths"
        if not given.get(canonical_key(key)):
            raise ConfigError(f"the store at {root} is on an object store, which holds no "
                              f"tier: set {key} to tier {spec.number}'s local directory (or, "
                              "for a REMOTE tier, its URL)")


def read_saved_at(root: str) -> dict[str, Any] | None:
    """``_store.json`` of the store at ``root`` (a directory or an object root), decoded;
    None if there is no store there."""
    if not is_url(root):
        return read_saved(root)
    files = ObjectRootFiles(object_store(root), None)
    return decode_saved(files.read(STORE_FILE), root, files.where(STORE_FILE))


def store_exists(root: str) -> bool:
    """Whether a store was created at ``root``."""
    if not is_url(root):
        return PosixRootFiles(root).stamp(STORE_FILE) is not None
    return ObjectRootFiles(object_store(root), None).stamp(STORE_FILE) is not None


def store_identity(root: str) -> Hashable | None:
    """What tells the store at ``root`` apart from one deleted and created again there."""
    if not is_url(root):
        try:
            st = os.stat(os.path.join(root, STORE_FILE))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_dev, st.st_ino
    raw = ObjectRootFiles(object_store(root), None).read(STORE_FILE)
    if raw is None:
        return None
    try:
        return root, json.loads(raw).get("id")
    except (ValueError, AttributeError):
        return root, None  # damaged: opening it says how


__all__ = ["check_object_tiers", "object_store", "read_saved_at", "root_files",
           "root_location", "store_exists", "store_identity"]
