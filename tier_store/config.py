"""Store configuration: every key declared once, with its type, default, range and help.

The validator, the README's key table and ``conf/pafka.properties`` all come from
:data:`KEYS`. Precedence, highest first: per-call options (a dict), a ``.properties`` file,
the store's saved configuration (``_store.json``), the declared defaults.

Layout keys (tier types, paths, sizes, segment size, channel type) are fixed when a store is
created; a later open that names a different value fails with :class:`ConfigError` naming
both values. A tier's size changes with ``Store.resize_tier`` (``pafka resize``), which saves
it for every process, and its path with ``relocate_tier`` (``pafka relocate``) once its
directory has moved. Keys declared ``changeable`` may differ per open.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config_keys import (
    CHANNEL_TYPES,
    COMPRESSION_TYPES,
    KEYS,
    TIER_TYPES,
    ConfigKey,
    GiB,
    KiB,
    MiB,
    parse_size,
)
from .errors import ConfigError
from .layout import is_url

# The key table lives in config_keys; its names are re-exported here, where callers import
# them from.
__all__ = [
    "CHANNEL_TYPES",
    "COMPRESSION_TYPES",
    "KEYS",
    "LAYOUT_KEYS",
    "OPEN_KEYS",
    "TIER_TYPES",
    "ConfigKey",
    "GiB",
    "KiB",
    "MiB",
    "StoreConfig",
    "TierSpec",
    "canonical_key",
    "imply_channel",
    "key_for",
    "load_config",
    "markdown_table",
    "parse_config",
    "parse_size",
    "properties_text",
    "read_properties",
    "render_value",
    "tier_key",
]

# storage.tiers.<n>.paths / .sizes for n >= 1; first and second are aliases of 1 and 2.
_NUMBERED_RE = re.compile(r"^storage\.tiers\.(\d+)\.(paths|sizes)$")
_ALIASES = {"first": 1, "second": 2}
# Keys saved with the store that may not change after creation.
LAYOUT_KEYS = tuple(k for k, d in KEYS.items() if not d.changeable)
# Keys of one open on one host: never saved with the store, never set per topic.
OPEN_KEYS = ("storage.root.options", "storage.host.dir")


def canonical_key(name: str) -> str:
    """Map ``storage.tiers.1.paths`` to the declared ``storage.tiers.first.paths`` form.

    Numbered tiers above 2 keep their numbered name.
    """
    m = _NUMBERED_RE.match(name)
    if m:
        n = int(m.group(1))
        for alias, num in _ALIASES.items():
            if num == n:
                return f"storage.tiers.{alias}.{m.group(2)}"
    return name


def tier_key(name: str) -> tuple[int, str] | None:
    """``storage.tiers.first.sizes`` / ``storage.tiers.3.paths`` -> (tier number, "sizes" or
    "paths"); None for any other key."""
    m = re.match(r"^storage\.tiers\.(\w+)\.(paths|sizes)$", name)
    if not m:
        return None
    n = _ALIASES.get(m.group(1)) or (int(m.group(1)) if m.group(1).isdigit() else None)
    return (n, m.group(2)) if n is not None else None


def key_for(name: str) -> ConfigKey:
    """Return the declaration of ``name``; unknown names raise naming the closest keys."""
    canon = canonical_key(name)
    if canon in KEYS:
        return KEYS[canon]
    m = _NUMBERED_RE.match(canon)
    if m and int(m.group(1)) >= 3:
        base = KEYS[f"storage.tiers.second.{m.group(2)}"]
        return ConfigKey(canon, base.kind, 0 if m.group(2) == "sizes" else "",
                         f"Tier {m.group(1)}: {m.group(2)}.", changeable=base.changeable,
                         minimum=base.minimum)
    close = difflib.get_close_matches(name, list(KEYS), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see conf/pafka.properties"
    raise ConfigError(f"unknown configuration key {name!r}{hint}")


def read_properties(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read a Java-style ``.properties`` file (``key=value``, ``#`` comments)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read configuration file {str(p)!r}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"cannot read configuration file {str(p)!r}: not UTF-8 text "
                          f"(byte {e.start}: {e.object[e.start:e.start + 1]!r})") from None
    out: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        sep = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if sep <= 0:
            raise ConfigError(f"{p}:{lineno}: expected key=value, got {raw!r}")
        out[line[:sep].strip()] = line[sep + 1 :].strip()
    return out


def parse_config(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate user-supplied keys; returns canonical names mapped to parsed values."""
    out: dict[str, Any] = {}
    for name, value in (values or {}).items():
        key = key_for(str(name))
        out[key.name] = key.parse(value)
    return out


def load_config(config: Mapping[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any]:
    """Accept a dict, a ``.properties`` path, or None; return parsed canonical keys.

    What a user gives is completed by :func:`imply_channel` (the saved configuration of a
    store is not: it is read with :func:`parse_config`, as it was saved)."""
    if config is None:
        return {}
    if isinstance(config, str | os.PathLike):
        return imply_channel(parse_config(read_properties(config)))
    if isinstance(config, Mapping):
        return imply_channel(parse_config(config))
    raise ConfigError(
        f"config must be a dict or the path of a .properties file, not {type(config).__name__}"
    )


# The one tier each single-tier channel type makes.
_CHANNEL_TIER = {"file": "FILE", "pmem": "PMEM"}


def imply_channel(values: dict[str, Any]) -> dict[str, Any]:
    """Make an explicit ``storage.tiers.types`` mean what it says.

    ``log.channel.type`` defaults to ``file`` (one FILE tier), and only ``tiered`` reads
    ``storage.tiers.types``: listing the types alone used to make a single FILE tier without
    a word. Types given without a channel type now imply ``tiered``; types that contradict an
    explicit ``file`` or ``pmem`` (anything but that channel's one tier) are an error. Only
    explicit keys count: the types' default (``PMEM,HDD``) implies nothing."""
    types = values.get("storage.tiers.types")
    if types is None:
        return values
    channel = values.get("log.channel.type")
    if channel is None:
        return {**values, "log.channel.type": "tiered"}
    one = _CHANNEL_TIER.get(channel)
    if one is not None and tuple(types) != (one,):
        raise ConfigError(
            f"log.channel.type={channel} makes one {one} tier, but storage.tiers.types="
            f"{render_value(types)} lists {_count(len(types), 'tier')}: set "
            "log.channel.type=tiered for the tiers listed (or leave log.channel.type out: "
            "listing storage.tiers.types implies tiered), or remove storage.tiers.types")
    return values


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


WHOLE_FILESYSTEM = -1
"""A tier size: the free space of the tier's filesystem, less a reserve (Pafka's -1)."""


@dataclass(frozen=True)
class TierSpec:
    """A tier as configured: number (1 = fastest), type, directory, capacity (0 = unbounded,
    :data:`WHOLE_FILESYSTEM`: its filesystem's free space)."""

    number: int
    type: str
    path: str
    size: int

    @property
    def is_pmem(self) -> bool:
        return self.type == "PMEM"

    @property
    def is_lake(self) -> bool:
        return self.type == "LAKE"


class StoreConfig:
    """Resolved configuration of one open store (defaults < saved < given)."""

    def __init__(self, values: Mapping[str, Any]):
        self._values = dict(values)

    def __getitem__(self, name: str) -> Any:
        canon = canonical_key(name)
        if canon in self._values:
            return self._values[canon]
        return key_for(canon).default

    def get(self, name: str, default: Any = None) -> Any:
        canon = canonical_key(name)
        return self._values.get(canon, KEYS[canon].default if canon in KEYS else default)

    def explicit(self) -> dict[str, Any]:
        """The keys set by a file, a dict or the saved config (not defaults)."""
        return dict(self._values)

    def saved(self) -> dict[str, Any]:
        """What :meth:`explicit` saves with a new store: all but this open's own keys."""
        return {k: v for k, v in self._values.items() if k not in OPEN_KEYS}

    def with_overrides(self, values: Mapping[str, Any]) -> StoreConfig:
        merged = dict(self._values)
        merged.update(values)
        return StoreConfig(merged)

    def tiers(self, root: str) -> list[TierSpec]:
        """The tiers the layout keys describe, fastest first."""
        channel = self["log.channel.type"]
        types: Iterable[str]
        if channel == "file":
            types = ("FILE",)
        elif channel == "pmem":
            types = ("PMEM",)
        else:
            types = self["storage.tiers.types"]
        specs = []
        for n, t in enumerate(types, 1):
            path = self[f"storage.tiers.{n}.paths"] or os.path.join(root, f"tier-{n}")
            default_size = WHOLE_FILESYSTEM if n == 1 else 0
            size_key = canonical_key(f"storage.tiers.{n}.sizes")
            size = self._values.get(size_key, default_size)
            if t == "PMEM" and size == WHOLE_FILESYSTEM:
                size = GiB  # a pool is pre-allocated: never all of a filesystem (or of RAM)
            if t == "REMOTE":
                if n == 1:
                    raise ConfigError("storage.tiers.types: the first tier cannot be REMOTE "
                                      "(appends need a local tier); e.g. PMEM,HDD,REMOTE")
                if not self[f"storage.tiers.{n}.paths"]:
                    raise ConfigError(f"storage.tiers.{n}.paths must name the REMOTE tier's "
                                      "fsspec URL, e.g. s3://bucket/pafka")
            elif t == "LAKE":
                if n == 1 or n != len(types):
                    raise ConfigError(f"storage.tiers.types={','.join(types)}: a LAKE tier "
                                      "holds a topic's oldest data, so it comes last and not "
                                      "first; e.g. PMEM,HDD,LAKE or FILE,LAKE")
                if size not in (0, WHOLE_FILESYSTEM):
                    raise ConfigError(f"storage.tiers.{n}.sizes={size}: a LAKE tier has no "
                                      "capacity to set (it keeps what retention keeps)")
                size = 0
            if t != "REMOTE" and not is_url(path):
                path = os.path.abspath(path)
            specs.append(TierSpec(n, t, path, int(size)))
        # A key naming a tier the layout does not have would be silently ignored: say so.
        # Empty paths and zero sizes (what a file listing every key carries) are no setting.
        for name, value in self._values.items():
            tk = tier_key(name)
            if tk and tk[0] > len(specs) and value not in ("", 0, None):
                described = (f"storage.tiers.types={','.join(s.type for s in specs)}"
                             if channel == "tiered" else f"log.channel.type={channel}")
                raise ConfigError(f"{name}={render_value(value)} names tier {tk[0]}, but the "
                                  f"store has {len(specs)} tier{'s' if len(specs) != 1 else ''}"
                                  f" ({described}); add the tier to storage.tiers.types")
        return specs

    def layout(self, root: str) -> dict[str, Any]:
        """What is saved at the root and checked on every later open."""
        return {
            "log.channel.type": self["log.channel.type"],
            "storage.tiers.types": [t.type for t in self.tiers(root)],
            "tier.paths": [t.path for t in self.tiers(root)],
            "log.segment.bytes": self["log.segment.bytes"],
            "log.pmem.pool.ratio": self["log.pmem.pool.ratio"],
        }


def properties_text() -> str:
    """Render every declared key as a ``.properties`` file (conf/pafka.properties).

    Every value is a default, so every key is commented out (Kafka's style): the file then
    opens any store, new or existing, and a key takes effect only once uncommented. Pinning
    the layout keys would make opening a store created with other values a conflict.
    """
    lines = ["# Pafka for Spark: store configuration. Every key, its default and what it means.",
             "# Generated from tier_store/config_keys.py (KEYS); a test checks the two agree.",
             "#",
             "# Every key is commented out at its default: uncomment a line to set it. Keys",
             "# marked 'Fixed when the store is created' are saved in <root>/_store.json on the",
             "# first open; a later open that sets one to another value is an error.", ""]
    for key in KEYS.values():
        lines.append(f"# {key.doc}")
        fixed = "" if key.changeable else (
            " Saved when the store is created; `pafka resize` changes it."
            if key.name.endswith(".sizes") else
            " Saved when the store is created; `pafka relocate` changes it, once the tier's "
            "directory has moved." if key.name.endswith(".paths") else
            " Fixed when the store is created.")
        lines.append(f"# Allowed: {key.allowed()}.{fixed}")
        if key.default_when:
            lines.append(f"# The default applies {key.default_when}.")
        lines.append(f"#{key.name}={render_value(key.default)}")
        lines.append("")
    lines += ["# More than two tiers: storage.tiers.<n>.paths / .sizes for tier n of",
              "# storage.tiers.types (1-based; first = 1, second = 2), e.g. a REMOTE third tier",
              "# for storage.tiers.types=PMEM,HDD,REMOTE: its fsspec URL (it holds sealed",
              "# segments only) and its capacity (0 = unbounded).",
              "# Allowed: as tier 2; naming a tier storage.tiers.types does not have is an error."
              " Saved when the store is created; `pafka resize` and `pafka relocate` change"
              " them.",
              "#storage.tiers.3.paths=s3://bucket/pafka",
              "#storage.tiers.3.sizes=0", ""]
    return "\n".join(lines)


def render_value(value: Any) -> str:
    """Render a parsed value back to its ``.properties`` text."""
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return "" if value is None else str(value)


def _changeable_text(key: ConfigKey) -> str:
    if key.changeable:
        return "yes"
    if key.name.endswith(".sizes"):
        return "`pafka resize`"
    return "`pafka relocate`" if key.name.endswith(".paths") else "no"


def markdown_table() -> str:
    """The README's table of keys."""
    rows = ["| key | default | allowed | changeable | meaning |", "|---|---|---|---|---|"]
    for key in KEYS.values():
        when = f" ({key.default_when})" if key.default_when else ""
        rows.append(f"| `{key.name}` | `{render_value(key.default)}`{when} | {key.allowed()} | "
                    f"{_changeable_text(key)} | {key.doc} |")
    rows.append("| `storage.tiers.<n>.paths` / `.sizes` | | as tier 2; n at most the number "
                "of storage.tiers.types | `pafka relocate` / `pafka resize` | Tier n of "
                "storage.tiers.types (1-based; `first` = 1, `second` = 2), e.g. a REMOTE "
                "third tier. |")
    return "\n".join(rows)
