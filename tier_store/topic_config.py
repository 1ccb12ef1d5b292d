"""Which configuration keys a topic may set for itself, and their checks.

A topic's own keys live in its commit log: the ``create`` entry's config, then ``config``
entries (:meth:`Topic.set_config`); :meth:`Topic.setting` reads them before the store's.
Only keys read through ``Topic.setting`` have an effect per topic, so only those are
accepted: the rest are the store's layout, its migration service, or one open's own.

Kafka's topic-level names (``retention.ms``, ``segment.ms``, ...) are accepted as aliases
of the store keys they mean (``log.retention.ms``, ``log.segment.ms``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .config import KEYS, canonical_key, key_for
from .entries import ConfigEntry
from .errors import ConfigError
from .topic_log import now_ms

if TYPE_CHECKING:
    from .topic import Topic

#: The keys a topic may override: every one is read through ``Topic.setting``.
TOPIC_KEYS: tuple[str, ...] = ("log.retention.ms", "log.retention.bytes", "log.segment.ms",
                               "log.cleanup.grace.ms", "log.checkpoint.interval",
                               "compression.type", "lake.retention.ms",
                               "log.chunk.statistics")

#: Kafka's topic-level names of the same settings.
KAFKA_ALIASES: dict[str, str] = {"retention.ms": "log.retention.ms",
                                 "retention.bytes": "log.retention.bytes",
                                 "segment.ms": "log.segment.ms",
                                 "cleanup.grace.ms": "log.cleanup.grace.ms",
                                 "checkpoint.interval": "log.checkpoint.interval"}

_WHY_NOT = {
    "log.segment.bytes": "segment files have one size in the whole store (a PMEM tier's pool "
                         "is made of them); it is fixed when the store is created",
}


def topic_key(name: str) -> str:
    """The store key that topic-level key ``name`` sets; :class:`ConfigError` naming the
    keys a topic may set when it is none of them."""
    text = str(name).strip()
    canon = KAFKA_ALIASES.get(text, text)
    if canon == "segment.bytes":
        canon = "log.segment.bytes"
    if canon in TOPIC_KEYS:
        return canon
    allowed = ", ".join(TOPIC_KEYS)
    known = canonical_key(canon)
    if known in _WHY_NOT:
        raise ConfigError(f"{text} cannot be set per topic: {_WHY_NOT[known]}; a topic may set "
                          f"{allowed}")
    try:
        key_for(known)
    except ConfigError as e:  # an unknown key: the error names the closest ones
        raise ConfigError(f"{e}; a topic may set {allowed}") from None
    raise ConfigError(f"{text} cannot be set per topic: it is a setting of the whole store "
                      f"(see conf/pafka.properties); a topic may set {allowed}")


def unset_key(name: str) -> str:
    """The store key that unsetting ``name`` drops: a key a topic may set, or any other
    known key (a topic created by an older version may hold one)."""
    try:
        return topic_key(name)
    except ConfigError:
        known = canonical_key(str(name).strip())
        key_for(known)  # an unknown name: the error names the closest ones
        return known


def check_topic_config(changes: Mapping[str, Any], unset: bool = True) -> dict[str, Any]:
    """``changes`` (key to value; None unsets the key when ``unset``) with each key made a
    store key and each value parsed and checked as the store's configuration checks it.
    Two names of one key (``retention.ms`` and ``log.retention.ms``) are an error."""
    out: dict[str, Any] = {}
    named: dict[str, str] = {}
    for name, value in changes.items():
        if value is None and not unset:
            raise ConfigError(f"{name}: a value is needed here")
        key = unset_key(name) if value is None else topic_key(name)
        if key in named:
            raise ConfigError(f"{named[key]} and {name} both name {key}: give it once")
        named[key] = str(name)
        if value is None:
            out[key] = None
            continue
        parsed = KEYS[key].parse(value)
        out[key] = list(parsed) if isinstance(parsed, tuple) else parsed
    return out


def set_config(topic: Topic, changes: Mapping[str, Any]) -> dict[str, Any]:
    """``Topic.set_config``: set the topic's own keys (a value of None unsets one) in one
    ``config`` entry of its commit log, which every process reads; each key and value is
    checked by :func:`check_topic_config` first. Returns the topic's own keys after it."""
    conf = check_topic_config(changes)
    if conf:
        topic.log.publish_retrying(lambda st: ConfigEntry(max(st.last_ts, now_ms()), conf))
    return topic.refresh().config


__all__ = ["KAFKA_ALIASES", "TOPIC_KEYS", "check_topic_config", "set_config", "topic_key",
           "unset_key"]
