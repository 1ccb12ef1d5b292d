"""Streaming and batch offsets of the ``pafka`` source: where a read starts and ends.

Positions are Kafka's: ``{"<topic>": {"<partition>": <next offset>}}`` with partitions in
ascending order (Spark compares offsets as JSON text). A streaming offset also names each
topic's incarnation under :data:`IDS_KEY`, so that a checkpoint names the topic it read, not
only its name.
"""

from __future__ import annotations

import logging
from typing import Any

from tier_store import InvalidArgument, Topic, TopicDeleted

from .options import SourceOptions

log = logging.getLogger(__name__)

Offsets = dict[str, dict[str, int]]
# The key, beside the topics, under which a streaming offset names each topic's incarnation
# (topic names cannot start with "_").
IDS_KEY = "_ids"


def split_ids(offsets: dict[str, Any]) -> tuple[Offsets, dict[str, str]]:
    """(the topics' offsets, their incarnation ids) of a streaming offset."""
    ids = offsets.get(IDS_KEY)
    return ({n: v for n, v in offsets.items() if n != IDS_KEY},
            dict(ids) if isinstance(ids, dict) else {})


def with_ids(offsets: Offsets, topics: dict[str, Topic],
             previous: dict[str, str] | None = None) -> Offsets:
    """``offsets`` with each topic's incarnation under :data:`IDS_KEY`. A topic no longer
    there keeps the id ``previous`` gave it: created again, it is then known as another."""
    ids = {n: previous[n] for n in offsets if previous and previous.get(n)}
    ids.update({n: topics[n].id for n in offsets if n in topics and topics[n].id})
    out: dict[str, Any] = dict(offsets)
    if ids:
        out[IDS_KEY] = dict(sorted(ids.items()))
    return out


def recreated(ids: dict[str, str], topics: dict[str, Topic], fail_on_data_loss: bool
              ) -> set[str]:
    """Topics whose incarnation is not the one ``ids`` (from a checkpoint's offsets) names:
    deleted and created again since. With ``fail_on_data_loss`` that is an error; otherwise
    they are read again from their earliest offset."""
    out = set()
    for name, was in ids.items():
        t = topics.get(name)
        if t is None or not was or not t.id or t.id == was:
            continue
        msg = (f"topic {name!r} was deleted and created again since this query's offsets "
               f"were recorded (they name topic id {was}; the topic now has id {t.id}): "
               "the new topic's records are not the ones the query was reading")
        if fail_on_data_loss:
            raise TopicDeleted(f"{msg}. Start the query with a new checkpoint location, or "
                               "set failOnDataLoss=false to read the new topic from its "
                               "earliest offset")
        log.warning("%s; reading the new topic from its earliest offset "
                    "(failOnDataLoss=false)", msg)
        out.add(name)
    return out


def bounds(earliest: int, latest: int) -> str:
    """A partition's range, as errors name it."""
    return f"earliest {earliest}, latest {latest}"


def check_offset_options(topics: list[Topic], opts: SourceOptions) -> None:
    """Every topic and partition that startingOffsets, endingOffsets or
    startingOffsetsByTimestamp names is one this read reads."""
    by_name = {t.name: t for t in topics}
    for option, spec in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending),
                         ("startingOffsetsByTimestamp", opts.starting_by_timestamp)):
        if not isinstance(spec, dict):
            continue
        for name, parts in spec.items():
            t = by_name.get(name)
            if t is None:
                raise InvalidArgument(f"option {option!r} names topic {name!r}, which this read "
                                      "does "
                                      f"not read (it reads {', '.join(sorted(by_name))})")
            unknown = [p for p in parts if int(p) >= t.partitions]
            if unknown:
                raise InvalidArgument(f"option {option!r} names partition {', '.join(unknown)} of "
                                      f"topic {name!r}, which has partitions 0..{t.partitions - 1}")


def resolve_offsets(topics: dict[str, Topic], spec: Any, default: str, kind: str) -> Offsets:
    """Offsets for every partition of every topic from a starting/ending ``spec`` (option
    ``kind``), ``default`` ("earliest" or "latest") where it names none."""
    out: Offsets = {}
    for name, t in topics.items():
        earliest, latest = t.earliest_offsets(), t.latest_offsets()
        parts: dict[str, int] = {}
        chosen = spec if spec is not None else default
        given = chosen.get(name, {}) if isinstance(chosen, dict) else {}
        if isinstance(chosen, dict):
            unknown = [p for p in given if int(p) >= t.partitions]
            if unknown:
                raise InvalidArgument(f"{kind} names partitions {unknown} of topic {name!r}, "
                                      f"which has partitions 0..{t.partitions - 1}")
        for p in range(t.partitions):
            if isinstance(chosen, str):
                off = earliest[p] if chosen == "earliest" else latest[p]
            else:
                off = given.get(str(p), -2 if kind.startswith("starting") else -1)
                off = earliest[p] if off == -2 else latest[p] if off == -1 else off
            parts[str(p)] = off
        out[name] = parts
    if isinstance(spec, dict):
        missing = [n for n in spec if n not in out]
        if missing:
            raise InvalidArgument(f"{kind} names topics {missing} that are not read "
                                  f"(reading {list(out)})")
    return out


def offsets_by_timestamp(topics: dict[str, Topic], opts: SourceOptions) -> Offsets | None:
    """Where startingTimestamp or startingOffsetsByTimestamp starts each partition (a
    partition it names no time for: its earliest offset); None without either option."""
    if opts.starting_timestamp is None and opts.starting_by_timestamp is None:
        return None
    out: Offsets = {}
    for name, t in topics.items():
        stamps = (opts.starting_by_timestamp or {}).get(name, {})
        out[name] = {}
        for p in range(t.partitions):
            ts = opts.starting_timestamp if opts.starting_timestamp is not None \
                else stamps.get(str(p))
            out[name][str(p)] = t.offset_for_time(p, ts) if ts is not None \
                else t.earliest_offsets()[p]
    return out


def group_offsets(topics: dict[str, Topic], group: str) -> Offsets:
    """The committed offsets of consumer group ``group`` for every partition read; a
    partition (or topic) the group has no offset for starts at its earliest offset, as
    Kafka's ``auto.offset.reset=earliest``. A group none of the topics has is an error
    listing the groups they have: most likely a misspelt name."""
    positions = {name: t.positions().get(group) for name, t in topics.items()}
    if all(pos is None for pos in positions.values()):
        known = sorted({g for t in topics.values() for g in t.state(refresh=False).positions})
        where = (f"topic {next(iter(topics))!r}" if len(topics) == 1 else
                 f"topics {', '.join(repr(n) for n in topics)}")
        raise InvalidArgument(
            f"option 'startingOffsets' is 'group', but consumer group {group!r} has no "
            f"committed offsets on {where}; groups there: {', '.join(known) or '(none)'}. "
            "Check the 'consumerGroup' option, or record the group's position first "
            "(pafka groups ROOT TOPIC --group NAME --reset-to earliest|latest|OFFSET --execute)")
    out: Offsets = {}
    for name, t in topics.items():
        earliest = t.earliest_offsets()
        pos = positions[name] or {}
        missing = [p for p in range(t.partitions) if p not in pos]
        if missing:
            log.info("consumer group %s has no committed offset for topic %s partition(s) "
                     "%s: starting them at their earliest offset", group, name,
                     ", ".join(map(str, missing)))
        out[name] = {str(p): pos.get(p, earliest[p]) for p in range(t.partitions)}
    return out
