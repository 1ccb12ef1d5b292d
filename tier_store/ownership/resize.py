"""Resizing a tier and creating a topic's first entry: the store's own records of what it
holds, checked before anything is written."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from ..config import canonical_key, parse_config
from ..entries import CreateEntry
from ..errors import ConfigError, InvalidArgument
from ..layout import STORE_FILE, STORE_LOCK, check_topic_name
from ..schemas import schema_to_text
from ..tiers import Tier
from ..topic_config import check_topic_config
from .rootfiles import RootFiles, update
from .saved import decode_saved, encode_saved, jsonable

log = logging.getLogger(__name__)


def resize_tier(files: RootFiles, tier: Tier, size: int | str,
                progress: Callable[[int], None] | None) -> tuple[str, int, int]:
    """Save ``size`` as ``tier``'s capacity in ``_store.json`` and resize it (a pool
    follows); returns (the size key, the new size, the change in pool files). Under the
    store's exclusive lock, so an open never sees half of it.

    On a root shared by hosts (an object store) it works too: the size is one figure of
    the store, saved by a conditional put merged into whatever another host saved
    meanwhile; this host's pool follows now, and each other host's when a process there
    opens the store again (an open completes or trims the pool to the saved size). The
    lock orders this host's opens only, which is all a pool, local to its host, needs."""
    key = canonical_key(f"storage.tiers.{tier.number}.sizes")
    new = parse_config({key: size})[key]
    if tier.is_remote and new:
        raise ConfigError(f"{key}={size}: tier {tier.number} is REMOTE, which has no capacity "
                          "(0, unbounded)")

    def resized(raw: bytes | None) -> bytes:
        saved = decode_saved(raw, files.root, files.where(STORE_FILE))
        if saved is None:
            raise ConfigError(f"{files.root}/{STORE_FILE} is gone")
        saved["config"][key] = new
        return encode_saved(files.root, saved)

    with files.lock(STORE_LOCK):
        resized(files.read(STORE_FILE))  # the store is there, its file sound: before the pool
        changed = tier.resize(new, lambda: update(files, STORE_FILE, resized), progress)
    log.info("store %s: tier %d resized to %d bytes", files.root, tier.number, new)
    return key, new, changed


def create_entry(name: str, schema: Any, partitions: Any,
                 config: Mapping[str, Any] | None) -> CreateEntry:
    """The ``create`` entry of a new topic, its arguments checked."""
    check_topic_name(name)
    if not isinstance(schema, pa.Schema):
        raise InvalidArgument(f"schema of topic {name!r} must be a pyarrow.Schema, "
                              f"got {type(schema).__name__}")
    if len(schema) == 0:
        raise InvalidArgument(f"schema of topic {name!r} has no columns")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise InvalidArgument(f"partitions of topic {name!r} must be a positive integer, "
                              f"got {partitions!r}")
    # Only keys read per topic: any other would be accepted and do nothing.
    topic_conf = check_topic_config(config or {}, unset=False)
    return CreateEntry(int(time.time() * 1000), schema_to_text(schema), partitions,
                       {k: jsonable(v) for k, v in topic_conf.items()}, uuid.uuid4().hex)


__all__ = ["create_entry", "resize_tier"]
