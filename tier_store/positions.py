"""Consumer groups' positions: the offsets a group has committed, per partition.

A position entry carries a group's whole position (merged before publishing, so a race lost
to the group's own commit keeps it); an empty one deletes the group. Retention ignores
positions: they serve lag and ``startingOffsets=group``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from .entries import PositionEntry
from .errors import InvalidArgument
from .state import TopicState
from .topic_log import now_ms

if TYPE_CHECKING:
    from .topic_log import TopicLog


def check_group_name(group: Any) -> str:
    """``group`` if it is a non-empty string; :class:`InvalidArgument` otherwise."""
    if not isinstance(group, str) or not group:
        raise InvalidArgument(f"consumer group must be a non-empty string, got {group!r}")
    return group


def checked_offsets(topic: str, call: str, group: str, offsets: Any,
                    latest: Mapping[int, int], check_partition: Callable[[int], int]
                    ) -> dict[int, int]:
    """``offsets`` given to ``call`` checked: at least one partition, each of the topic,
    each offset in ``[0, latest]`` (a position past the log would show as negative lag)."""
    check_group_name(group)
    if not isinstance(offsets, Mapping):
        raise InvalidArgument("offsets must be a mapping of partition to offset, got "
                              f"{type(offsets).__name__}")
    clean: dict[int, int] = {}
    for k, v in offsets.items():
        try:
            number = int(k)
        except (TypeError, ValueError):
            raise InvalidArgument(f"partition must be an integer, got {k!r}") from None
        p = check_partition(number)
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise InvalidArgument(f"offset for partition {p} must be a non-negative integer, "
                                  f"got {v!r}")
        if v > latest[p]:
            raise InvalidArgument(f"offset {v} for partition {p} of topic {topic!r} is past "
                                  f"its latest offset {latest[p]}")
        clean[p] = int(v)
    if not clean:
        raise InvalidArgument(f"{call} of group {group!r} names no partition; "
                              "delete_group() removes a group")
    return clean


def position_entry(st: TopicState, group: str, offsets: Mapping[int, int]) -> PositionEntry:
    """The entry giving ``group`` the position ``offsets`` (partitions in ascending order,
    as in every offsets JSON of the project)."""
    ordered = {str(p): int(offsets[p]) for p in sorted(offsets)}
    return PositionEntry(max(st.last_ts, now_ms()), group, ordered)


def merged_entry(st: TopicState, group: str, offsets: Mapping[int, int]) -> PositionEntry:
    """``offsets`` merged into ``group``'s position as ``st`` has it: a commit of the group
    that won the race in between is kept."""
    merged = {int(p): o for p, o in st.positions.get(group, {}).items()}
    merged.update(offsets)
    return position_entry(st, group, merged)


def deletion_entry(topic: str, st: TopicState, group: str) -> PositionEntry:
    """The entry forgetting ``group`` (an empty position); an error naming the groups the
    topic has if it has no such group."""
    if group not in st.positions:
        raise InvalidArgument(f"topic {topic!r} has no consumer group {group!r}; its groups: "
                              f"{', '.join(sorted(st.positions)) or '(none)'}")
    return PositionEntry(max(st.last_ts, now_ms()), group, {})



class GroupPositions:
    """Consumer groups' committed offsets, as a topic handle records and reads them."""

    name: str
    log: TopicLog

    def latest_offsets(self) -> dict[int, int]: ...  # noqa: D102 (the handle's)

    def _check_partition(self, partition: Any) -> int: ...

    def state(self, refresh: bool = True) -> TopicState: ...

    def set_position(self, group: str, offsets: Mapping[int | str, int]) -> None:
        """Record consumer group ``group``'s committed offsets for the partitions named (for
        lag and ``startingOffsets=group``; retention ignores them), merged into its
        position: its other partitions keep theirs. An offset lies in ``[0, latest]``."""
        clean = checked_offsets(self.name, "set_position", group, offsets,
                                          self.latest_offsets(), self._check_partition)
        self.log.publish_retrying(lambda st: merged_entry(st, group, clean))

    def advance_position(self, group: str, offsets: Mapping[int | str, int]) -> None:
        """As :meth:`set_position`, but each partition's committed offset only moves forward:
        a later position another process recorded meanwhile stays. Compared with the log's
        state as the entry is published, so no race can undo it; nothing is published when
        no offset moves."""
        clean = checked_offsets(self.name, "advance_position", group, offsets,
                                self.latest_offsets(), self._check_partition)

        def make(st: TopicState) -> PositionEntry | None:
            have = {int(p): o for p, o in st.positions.get(group, {}).items()}
            ahead = {p: o for p, o in clean.items() if o > have.get(p, -1)}
            return merged_entry(st, group, ahead) if ahead else None
        self.log.publish_retrying(make)

    def reset_position(self, group: str, offsets: Mapping[int | str, int]) -> None:
        """Replace consumer group ``group``'s whole position by ``offsets``: partitions not
        named lose their committed offset. Creates the group if it has no position yet."""
        clean = checked_offsets(self.name, "reset_position", group, offsets,
                                          self.latest_offsets(), self._check_partition)
        self.log.publish_retrying(lambda st: position_entry(st, group, clean))

    def delete_group(self, group: str) -> None:
        """Forget consumer group ``group``'s position on this topic; a group it does not
        have is an error naming the groups it has."""
        check_group_name(group)
        self.log.publish_retrying(lambda st: deletion_entry(self.name, st, group))

    def positions(self) -> dict[str, dict[int, int]]:
        """Every consumer group's committed offsets."""
        return {g: {int(p): o for p, o in offs.items()}
                for g, offs in self.state().positions.items()}


__all__ = ["GroupPositions", "check_group_name", "checked_offsets", "deletion_entry",
           "merged_entry", "position_entry"]
