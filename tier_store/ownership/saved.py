"""``<root>/_store.json``: the saved configuration and layout of a store.

Tier paths inside the root are saved relative to it, so that the root can be moved or
copied as a directory; :func:`read_saved` resolves them against the root it reads from.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..config import tier_key
from ..errors import ConfigError
from ..layout import STORE_FILE, is_url
from .rootfiles import PosixRootFiles

FORMAT = 1


def jsonable(v: Any) -> Any:
    """A config value as JSON holds it (a tuple as a list)."""
    return list(v) if isinstance(v, tuple) else v


def inside(root: str, path: str) -> bool:
    """Whether absolute ``path`` is ``root`` or lies under it."""
    return os.path.commonpath([root, path]) == root


def tier_overlap(a: str, b: str) -> str | None:
    """How two tier places overlap: "same", "nested" (one directory holds the other), or
    None. URLs compare as written (trailing slashes aside); directories by their real
    paths, symlinks resolved."""
    if is_url(a) != is_url(b):
        return None
    if is_url(a):
        return "same" if a.rstrip("/") == b.rstrip("/") else None
    ra, rb = os.path.realpath(a), os.path.realpath(b)
    if ra == rb:
        return "same"
    return "nested" if inside(ra, rb) or inside(rb, ra) else None


def _is_path_key(key: str) -> bool:
    tk = tier_key(key)
    return tk is not None and tk[1] == "paths"


def resolve_path(base: str, key: str, value: Any) -> Any:
    """A local tier path made absolute against ``base``; any other value as it is."""
    if _is_path_key(key) and isinstance(value, str) and value and not is_url(value):
        return os.path.normpath(os.path.join(base, value))
    return value


def _portable_path(root: str, key: str, value: Any) -> Any:
    """A local tier path inside ``root`` made relative to it, so that the root can move."""
    if _is_path_key(key) and isinstance(value, str) and os.path.isabs(value) \
            and inside(root, value):
        return os.path.relpath(value, root)
    return value


_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number",
               float: "number", bool: "boolean", type(None): "null"}


def _saved_shape_problems(saved: Any) -> str:
    """What keeps ``saved`` from having the shape of ``_store.json``, or ''."""
    def kind(v: Any) -> str:
        return f"a JSON {_JSON_TYPES.get(type(v), 'value')}"

    if not isinstance(saved, dict):
        return f"found {kind(saved)}"
    found = [f"{k} is missing" for k in ("format", "id", "config", "layout") if k not in saved]
    if "id" in saved and not isinstance(saved["id"], str):
        found.append(f"id is {kind(saved['id'])}")
    found += [f"{k} is {kind(saved[k])}" for k in ("config", "layout")
              if k in saved and not isinstance(saved[k], dict)]
    layout = saved.get("layout")
    if isinstance(layout, dict):
        if "tier.paths" not in layout:
            found.append("layout.tier.paths is missing")
        elif not isinstance(layout["tier.paths"], list):
            found.append(f"layout.tier.paths is {kind(layout['tier.paths'])}")
        else:
            counts = layout.get("tier.relocations", [])
            if not isinstance(counts, list) or len(counts) > len(layout["tier.paths"]) or \
                    not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                            for x in counts):
                found.append(f"layout.tier.relocations is {counts!r}, not a list of at most "
                             f"{len(layout['tier.paths'])} non-negative integers")
    return "; ".join(found)


def relocations(saved: dict[str, Any]) -> list[int]:
    """How many times each tier was relocated (``layout.tier.relocations`` of a
    :func:`read_saved` result, whose shape it checked; absent in stores never relocated)."""
    got = saved["layout"].get("tier.relocations", [])
    return [*got, *[0] * (len(saved["layout"]["tier.paths"]) - len(got))]


def read_saved(root: str) -> dict[str, Any] | None:
    """``_store.json`` of the store at ``root`` (a local directory) with its relative tier
    paths resolved against ``root``; None if there is none, :class:`ConfigError` naming the
    file if it is damaged."""
    return decode_saved(PosixRootFiles(root).read(STORE_FILE), root)


def decode_saved(raw: bytes | None, root: str, where: str | None = None
                 ) -> dict[str, Any] | None:
    """``_store.json``'s content ``raw`` checked and decoded (see :func:`read_saved`);
    ``where`` names it in errors (default: ``<root>/_store.json``)."""
    if raw is None:
        return None
    path = where or os.path.join(root, STORE_FILE)
    try:
        saved = json.loads(raw)
    except ValueError as e:  # UnicodeDecodeError included
        raise ConfigError(f"{path} is damaged: not JSON ({e})") from None
    if isinstance(saved, dict) and saved.get("format", FORMAT) != FORMAT:
        raise ConfigError(f"{path}: unsupported store format {saved['format']!r} (this "
                          f"release reads format {FORMAT})")
    found = _saved_shape_problems(saved)
    if found:
        raise ConfigError(f"{path} is damaged: expected a JSON object with format, id, config "
                          f"and layout, the layout with a tier.paths array; {found}")
    layout = saved["layout"]
    if is_url(root):
        # An object root holds no tier: every local path in it was saved absolute.
        relative = [v for k, v in [*saved["config"].items(),
                                   *(("storage.tiers.1.paths", p) for p in layout["tier.paths"])]
                    if _is_path_key(k) and isinstance(v, str) and v and not is_url(v)
                    and not os.path.isabs(v)]
        if relative:
            raise ConfigError(f"{path} is damaged: the tier path {relative[0]!r} is relative, "
                              "and a store on an object store keeps its tiers elsewhere")
        return saved
    escaping = [v for k, v in [*saved["config"].items(),
                               *(("storage.tiers.1.paths", p) for p in layout["tier.paths"])]
                if _is_path_key(k) and isinstance(v, str) and v and not is_url(v)
                and not os.path.isabs(v) and not inside(root, resolve_path(root, k, v))]
    if escaping:
        # Only tier paths inside the root are saved relative to it (_portable_path).
        raise ConfigError(f"{path} is damaged: the relative tier path {escaping[0]!r} leads "
                          "outside the store's root")
    saved["config"] = {k: resolve_path(root, k, v) for k, v in saved["config"].items()}
    layout["tier.paths"] = [resolve_path(root, "storage.tiers.1.paths", p)
                            for p in layout["tier.paths"]]
    return saved


def encode_saved(root: str, saved: dict[str, Any]) -> bytes:
    """What :func:`decode_saved` reads back: ``saved`` with tier paths in the root made
    relative (a store can move as a directory)."""
    return json.dumps(portable(root, saved), indent=1).encode()


def portable(root: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as written to ``_store.json``: tier paths inside the root made relative."""
    if is_url(root):
        return {**body, "config": {k: jsonable(v) for k, v in body["config"].items()}}
    return {**body,
            "config": {k: _portable_path(root, k, jsonable(v))
                       for k, v in body["config"].items()},
            "layout": {**body["layout"],
                       "tier.paths": [_portable_path(root, "storage.tiers.1.paths", p)
                                      for p in body["layout"]["tier.paths"]]}}
