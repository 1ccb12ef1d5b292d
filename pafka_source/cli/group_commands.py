"""``pafka groups``: list, reset and delete consumer groups' committed offsets; each function
returns data that :mod:`.output` renders."""

from __future__ import annotations

from typing import Any

from tier_store import InvalidArgument, Store

RESET_NOTE = ("a running query of the group records its own position at its next commit, "
              "overwriting a reset (as in Kafka): stop the group's queries first. A query "
              "restarted from its checkpoint continues from the checkpoint; one started "
              "with a fresh checkpoint and startingOffsets=group starts from the reset")


def groups_report(store: Store, topic: str | None = None, group: str | None = None
                  ) -> dict[str, Any]:
    """Every consumer group of ``topic`` (all topics if None), or only ``group``: per
    partition its committed offset, the log's earliest and latest offsets, and the lag (None
    where the group has committed nothing; a reader starting from the group starts there at
    the earliest offset). Naming a group no topic has is an error listing the groups."""
    names = [topic] if topic is not None else store.topics()
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for name in names:
        t = store.topic(name)
        positions = t.positions()
        seen.update(positions)
        earliest, latest = t.earliest_offsets(), t.latest_offsets()
        for g in sorted(positions):
            if group is not None and g != group:
                continue
            parts = []
            for p in range(t.partitions):
                committed = positions[g].get(p)
                parts.append({"partition": p, "committed": committed,
                              "earliest": earliest[p], "latest": latest[p],
                              "lag": None if committed is None else latest[p] - committed})
            out.append({"topic": name, "group": g, "partitions": parts,
                        "lag": sum(x["lag"] for x in parts if x["lag"] is not None)})
    if group is not None and not out:
        where = f"topic {topic!r}" if topic is not None else f"the store {store.root}"
        raise InvalidArgument(f"consumer group {group!r} has no committed offsets on {where}; "
                              f"groups: {', '.join(sorted(seen)) or '(none)'}")
    return {"root": store.root, "topic": topic, "groups": out}


def reset_group(store: Store, topic: str, group: str, to: str | int | None = None,
                timestamp_ms: int | None = None, partitions: list[int] | None = None,
                dry_run: bool = False, shift_by: int | None = None) -> dict[str, Any]:
    """Set consumer group ``group``'s committed offsets on ``topic``: ``to`` is "earliest",
    "latest" or an offset within each partition's range, ``timestamp_ms`` picks the first
    offset committed at or after it, or ``shift_by`` moves each committed offset (kept
    within the partition's range, as Kafka's). Only ``partitions`` when given (the group's
    other partitions keep theirs), else every partition (the whole position is replaced). A
    group with no position yet is created. ``dry_run`` computes without recording."""
    if sum(x is not None for x in (to, timestamp_ms, shift_by)) != 1:
        raise InvalidArgument("give one of --reset-to, --reset-to-timestamp, --to-datetime "
                              "and --shift-by")
    t = store.topic(topic)
    before = t.positions().get(group)
    earliest, latest = t.earliest_offsets(), t.latest_offsets()
    chosen = sorted(set(partitions)) if partitions else list(range(t.partitions))
    for p in chosen:
        if not 0 <= p < t.partitions:
            raise InvalidArgument(f"--partition {p}: topic {topic!r} has partitions "
                                  f"0..{t.partitions - 1}")
    new: dict[int, int] = {}
    for p in chosen:
        if shift_by is not None:
            had = (before or {}).get(p)
            if had is None:
                raise InvalidArgument(
                    f"--shift-by: consumer group {group!r} has no committed offset on "
                    f"partition {p} of topic {topic!r} to shift; use --reset-to, or "
                    "--partition for the partitions it has")
            new[p] = min(max(had + shift_by, earliest[p]), latest[p])
        elif timestamp_ms is not None:
            new[p] = t.offset_for_time(p, timestamp_ms)
        elif to == "earliest":
            new[p] = earliest[p]
        elif to == "latest":
            new[p] = latest[p]
        else:
            assert isinstance(to, int)
            if not earliest[p] <= to <= latest[p]:
                raise InvalidArgument(
                    f"--reset-to {to} is outside partition {p} of topic {topic!r}: it allows "
                    f"{earliest[p]} (earliest) to {latest[p]} (latest: nothing left to read); "
                    "use earliest, latest, or --partition to reset only some partitions")
            new[p] = to
    if not dry_run:
        if partitions:
            t.set_position(group, new)
        else:
            t.reset_position(group, new)
    was = before or {}
    return {"topic": topic, "group": group,
            "to": {"timestamp_ms": timestamp_ms} if timestamp_ms is not None else
            {"shift_by": shift_by} if shift_by is not None else to,
            "created": before is None, "dry_run": dry_run,
            "partitions": [{"partition": p, "before": was.get(p), "after": new[p],
                            "latest": latest[p], "lag": latest[p] - new[p]} for p in chosen],
            "note": RESET_NOTE}


def delete_group(store: Store, topic: str, group: str) -> dict[str, Any]:
    """Forget consumer group ``group``'s position on ``topic``."""
    t = store.topic(topic)
    before = t.positions().get(group)
    t.delete_group(group)
    return {"topic": topic, "group": group, "deleted": before}
