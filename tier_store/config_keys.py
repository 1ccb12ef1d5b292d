"""The declared configuration keys: :class:`ConfigKey` and the table :data:`KEYS`.

Kept apart from :mod:`tier_store.config` (parsing, precedence, tiers), which re-exports every
name here, so ``from tier_store.config import KEYS, ConfigKey, parse_size`` keeps working.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_SIZE_RE = re.compile(r"^\s*(-?\d+)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024 * GiB}

TIER_TYPES = ("PMEM", "NVME", "SSD", "HDD", "FILE", "REMOTE", "LAKE")
CHANNEL_TYPES = ("file", "pmem", "tiered")
COMPRESSION_TYPES = ("none", "lz4", "zstd")


def parse_size(text: str) -> int:
    """Parse ``1073741824``, ``512m``, ``1GiB`` (binary units) into bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(text)
    unit = (m.group(2) or "").lower()[:1]
    return int(m.group(1)) * _SIZE_UNITS[unit]


@dataclass(frozen=True)
class ConfigKey:
    """One declared configuration key."""

    name: str
    kind: str  # int | size | float | enum | list | path | json
    default: Any
    doc: str
    changeable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    special: tuple[Any, ...] = ()  # values allowed outside [minimum, maximum], e.g. -1
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)
    # A rule the value must also meet that the range cannot say (checked elsewhere), so
    # that allowed() describes everything a value is checked against.
    note: str = ""
    # When the default applies only under another key's value: said beside it in the docs.
    default_when: str = ""

    def allowed(self) -> str:
        """Describe the allowed values, for errors and docs: everything parse() accepts."""
        if self.kind == "enum":
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "list":
            text = "a comma-separated list of " + ", ".join(self.choices)
        elif self.kind == "path":
            text = "a directory path (a REMOTE or LAKE tier: an fsspec URL), without commas"
        elif self.kind == "json":
            text = "a JSON object"
        elif self.kind == "float" and self.minimum is not None and self.maximum is not None:
            text = f"a number in [{_fmt(self.minimum)}, {_fmt(self.maximum)}]"
        else:
            what = {"int": "an integer",
                    "size": "a size in bytes (suffixes k, m, g, t: KiB, MiB, GiB, TiB)",
                    "float": "a number"}[self.kind]
            parts = []
            if self.minimum is not None:
                parts.append(f">= {_fmt(self.minimum)}")
            if self.maximum is not None:
                parts.append(f"<= {_fmt(self.maximum)}")
            text = what + (" " + " and ".join(parts) if parts else "")
        if self.note:
            text += f" ({self.note})"
        if self.default is None or (self.kind == "path" and self.default == ""):
            text += ", or empty"
        if self.special:
            text += ", or " + " or ".join(_fmt(s) for s in self.special)
        return text

    def parse(self, value: Any) -> Any:
        """Convert ``value`` (a string from a file or a Python value) and check its range."""
        if self.default is None and (value is None or str(value).strip() == ""):
            return None  # an optional key left empty
        # A JSON value may hold a secret given by mistake: never echoed.
        shown = "given" if self.kind == "json" else repr(value)
        try:
            parsed = self._convert(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"invalid value {shown} for {self.name}: expected {self.allowed()}"
            ) from None
        out_of_range = (self.minimum is not None and parsed < self.minimum) or (
            self.maximum is not None and parsed > self.maximum)
        if self.kind in ("int", "size", "float") and parsed not in self.special and out_of_range:
            raise ConfigError(
                f"value {value!r} for {self.name} is out of range: expected {self.allowed()}"
            )
        if self.check is not None and (problem := self.check(parsed)):
            raise ConfigError(f"invalid value {shown} for {self.name}: {problem}")
        return parsed

    def _convert(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise TypeError(value)
        if self.kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(str(value).strip()) if isinstance(value, str) else int(value)
        if self.kind == "size":
            if isinstance(value, str):
                return parse_size(value)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if self.kind == "float":
            parsed = float(value)
            if not math.isfinite(parsed):  # nan would pass every range check
                raise ValueError(value)
            return parsed
        if self.kind == "enum":
            text = str(value).strip().lower()
            if text not in self.choices:
                raise ValueError(value)
            return text
        if self.kind == "list":
            items = value if isinstance(value, list | tuple) else str(value).split(",")
            out = tuple(str(v).strip().upper() for v in items if str(v).strip())
            if not out or any(v not in self.choices for v in out):
                raise ValueError(value)
            return out
        if self.kind == "path":
            text = os.fspath(value).strip() if not isinstance(value, str) else value.strip()
            if "," in text:
                raise ValueError(value)
            return text
        if self.kind == "json":
            parsed = json.loads(value) if isinstance(value, str | bytes) else value
            if not isinstance(parsed, Mapping):
                raise ValueError(value)
            return json.loads(json.dumps(dict(parsed)))  # plain, JSON-able, a copy
        raise AssertionError(self.kind)


_SECRET_RE = re.compile(r"key|secret|token|password|passwd|credential", re.IGNORECASE)


def _no_credentials(options: Any, where: str = "") -> str | None:
    """Why ``options`` must not be given (a key that looks like a credential), or None."""
    if not isinstance(options, Mapping):
        return None
    for k, v in options.items():
        name = f"{where}{k}"
        if _SECRET_RE.search(str(k)):
            return (f"option {name!r} looks like a credential; credentials never go in the "
                    "store's configuration (it is shown in logs and query plans): give them "
                    "by the AWS environment variables (AWS_ACCESS_KEY_ID, "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE) or ~/.aws/credentials")
        problem = _no_credentials(v, f"{name}.")
        if problem:
            return problem
    return None


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


_DAY_MS = 24 * 3600 * 1000

KEYS: dict[str, ConfigKey] = {
    k.name: k
    for k in [
        ConfigKey("log.channel.type", "enum", "file",
                  "Storage layout: one file tier (file), one pmem tier (pmem), or the tiers "
                  "listed in storage.tiers.types (tiered). Setting storage.tiers.types without "
                  "this key implies tiered.", choices=CHANNEL_TYPES),
        ConfigKey("storage.tiers.types", "list", ("PMEM", "HDD"),
                  "Tier types, fastest first, for log.channel.type=tiered (setting this key "
                  "implies tiered; a list contradicting log.channel.type=file or pmem is an "
                  "error). PMEM "
                  "tiers are written through a memory mapping with libpmem; REMOTE tiers (an "
                  "fsspec URL) hold sealed segments only; a LAKE tier (last; a directory or URL) "
                  "holds the oldest segments as a Delta Lake table; the others are written "
                  "with write + fsync.",
                  choices=TIER_TYPES, note="the first not REMOTE or LAKE; LAKE only last",
                  default_when="with log.channel.type=tiered; the default store has one FILE "
                               "tier"),
        ConfigKey("storage.tiers.first.paths", "path", "",
                  "Directory of tier 1 (empty: <root>/tier-1). Alias of storage.tiers.1.paths."),
        ConfigKey("storage.tiers.first.sizes", "size", -1,
                  "Capacity of tier 1 in bytes; -1 (as in Pafka) takes the free space of its "
                  "filesystem, less a reserve of 5% of it (1 GiB at most). A PMEM tier "
                  "pre-allocates its pool, so there -1 is 1 GiB. Alias of "
                  "storage.tiers.1.sizes.", minimum=64 * KiB, special=(-1,)),
        ConfigKey("storage.tiers.second.paths", "path", "",
                  "Directory of tier 2 (empty: <root>/tier-2). Alias of storage.tiers.2.paths."),
        ConfigKey("storage.tiers.second.sizes", "size", 0,
                  "Capacity of tier 2 in bytes; 0 means limited only by the filesystem. "
                  "Alias of storage.tiers.2.sizes.", minimum=0),
        ConfigKey("storage.root.options", "json", None,
                  "fsspec/s3fs options of an s3:// store root, e.g. {\"endpoint_url\": "
                  "\"http://127.0.0.1:7480\"} (and retry_attempts, retry_max_seconds). Never "
                  "credentials: those come from the AWS environment variables or config "
                  "files, as s3fs reads them (Spark executors: spark.executorEnv.*). Not "
                  "saved with the store.", changeable=True, check=_no_credentials,
                  note="no credentials"),
        ConfigKey("storage.host.dir", "path", "",
                  "This host's directory for an s3:// store root: its locks and the "
                  "partitions' active pointers (empty: <tier 1 directory>/_host). Not saved "
                  "with the store.", changeable=True),
        ConfigKey("storage.migrate.threshold", "float", 0.5,
                  "Fraction of each tier with a capacity (all but the last) that should hold "
                  "data in the balanced state; it decides how much a tier holds, never the "
                  "order (the newest sealed segments are always on the fastest tiers). -1 "
                  "disables migration (retention still runs).", changeable=True, minimum=0.0,
                  maximum=1.0, special=(-1,)),
        ConfigKey("storage.migrate.threshold.low", "float", None,
                  "Lower edge of a hysteresis band: a tier below it takes segments up from "
                  "slower tiers (empty: storage.migrate.threshold).", changeable=True,
                  minimum=0.0, maximum=1.0, note="not above storage.migrate.threshold.high"),
        ConfigKey("storage.migrate.threshold.high", "float", None,
                  "Upper edge of a hysteresis band: a tier above it passes its oldest segments "
                  "down (empty: storage.migrate.threshold).", changeable=True,
                  minimum=0.0, maximum=1.0, note="not below storage.migrate.threshold.low"),
        ConfigKey("storage.migrate.interval.ms", "int", 5000,
                  "How often the migration service applies the policy, in milliseconds.",
                  changeable=True, minimum=1),
        ConfigKey("storage.migrate.bytes.per.second", "size", 0,
                  "Bandwidth the migration service may take for copying; 0 = no cap.",
                  changeable=True, minimum=0),
        ConfigKey("storage.migrate.threads", "int", 1,
                  "Segments moved in parallel by the migration service.", changeable=True,
                  minimum=1, maximum=64),
        ConfigKey("log.file.direct.bytes", "size", 0,
                  "Chunks at least this big are written to file tiers with direct I/O "
                  "(O_DIRECT), past the page cache: less CPU per durable write, but readers "
                  "of fresh data then read from the device; 0 = never.",
                  changeable=True, minimum=0),
        ConfigKey("log.pmem.pool.ratio", "float", 0.8,
                  "Fraction of a PMEM tier pre-allocated as a pool of segment files. A PMEM "
                  "tier holds segments only in its pool, so its usable capacity is this ratio "
                  "times its size, in whole log.segment.bytes files: 0.8 of a 1 GiB tier with "
                  "64 MiB segments is 12 pool files, 768 MiB (pafka tiers shows it).",
                  minimum=0.01, maximum=1.0),
        ConfigKey("log.segment.bytes", "size", 64 * MiB,
                  "Size at which the active segment is sealed and the next one started.",
                  minimum=16 * KiB, maximum=1024 * GiB),
        ConfigKey("log.segment.ms", "int", 7 * _DAY_MS,
                  "Age at which an idle active segment is sealed, in milliseconds.",
                  changeable=True, minimum=1),
        ConfigKey("log.retention.bytes", "size", -1,
                  "Bytes kept per partition before the oldest sealed segments are deleted; "
                  "-1 keeps all.", changeable=True, minimum=0, special=(-1,)),
        ConfigKey("log.retention.ms", "int", 7 * _DAY_MS,
                  "Age after which sealed segments are deleted, in milliseconds; -1 keeps all.",
                  changeable=True, minimum=0, special=(-1,)),
        ConfigKey("lake.retention.ms", "int", -1,
                  "Age after which a topic's rows leave its lake table (a LAKE tier), whole "
                  "files at a time, in milliseconds; -1 keeps them all. log.retention.* "
                  "drops lake segments from the log only.", changeable=True, minimum=0,
                  special=(-1,)),
        ConfigKey("log.retention.check.interval.ms", "int", 300_000,
                  "How often a committing process checks retention, in milliseconds (as "
                  "Kafka's key); the migration service also checks it on every run. 0 checks "
                  "after every commit.", changeable=True, minimum=0),
        ConfigKey("log.reader.map.bytes", "size", 512 * MiB,
                  "Bytes of segment files a reading process keeps mapped, least recently used "
                  "first out: what reading adds to its memory (RSS). Applies to the process "
                  "that opens the store.", changeable=True, minimum=1 * MiB),
        ConfigKey("log.checkpoint.interval", "int", 100,
                  "Commit-log entries between checkpoints of the topic state.", changeable=True,
                  minimum=2, maximum=1_000_000),
        ConfigKey("log.cleanup.grace.ms", "int", 600_000,
                  "Age before unreferenced files, old log entries and freed segments are "
                  "reclaimed, in milliseconds; must be longer than any batch and any move.",
                  changeable=True, minimum=0),
        ConfigKey("num.partitions", "int", 1, "Partitions of a topic created without a count.",
                  changeable=True, minimum=1, maximum=100_000),
        ConfigKey("log.chunk.statistics", "enum", "numeric",
                  "Which columns of new chunks record their min, max and null count, which "
                  "let filtered reads skip chunks: numeric (integers, floats, timestamps, "
                  "dates), all (strings too, which costs a sink several percent more), or "
                  "none.", changeable=True, choices=("numeric", "all", "none")),
        ConfigKey("compression.type", "enum", "none",
                  "Arrow IPC buffer compression of new chunks.", changeable=True,
                  choices=COMPRESSION_TYPES),
    ]
}
