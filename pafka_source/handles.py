"""Store handles of the ``pafka`` data source: one per root and configuration in each
process (Spark's Python workers are reused), and the existing store a read needs."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from tier_store import STORE_FILE, Store, StoreNotFound

_stores: dict[tuple[str, str], tuple[tuple[int, int] | None, Store]] = {}
_stores_lock = threading.Lock()


def open_store(root: str, config: dict[str, Any], create: bool = True) -> Store:
    """One store handle per root and config in each process; ``create`` makes a store where
    there is none (a write), else that is :class:`StoreNotFound`.

    A handle is reused only while the store is the same (:meth:`Store.identity`): a store
    deleted and created again under the same root gets a fresh handle."""
    key = (root, json.dumps(config, sort_keys=True, default=str))
    with _stores_lock:
        cached = _stores.get(key)
        ident = Store.identity(root)
        if cached is not None and cached[0] == ident and ident is not None:
            return cached[1]
        s = Store.open(root, config or None, create=create)
        _stores[key] = (Store.identity(root), s)
        return s


def store_to_read(root: str, config: dict[str, Any], shared: bool = True) -> Store:
    """The existing store at ``root`` that a read reads: a read never creates one, so a
    mistyped path fails naming it. ``shared``: the process's cached handle, else a handle
    of the caller's own."""
    try:
        if shared:
            return open_store(root, config, create=False)
        return Store.open(root, config or None, create=False)
    except StoreNotFound:
        pass
    except NotADirectoryError:
        if os.path.isdir(root):
            raise  # a path inside the store, not the root: its own error names it
    raise StoreNotFound(f"no pafka store at {root} (no {STORE_FILE}); a read does not create "
                        "one: check the path given to load()")
