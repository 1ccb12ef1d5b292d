"""Identifiers with one spelling: a segment's id, parsed once and validated.

A segment is named within its topic by its partition and its sequence number in that
partition: ``<partition>-<seq>`` in entries, tombstones and messages. The text form is
written and read only here, so an id that grows a part (the writing host, say) changes
one class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidArgument

_TEXT = re.compile(r"(0|[1-9][0-9]{0,8})-(0|[1-9][0-9]{0,18})")


@dataclass(frozen=True, order=True)
class SegmentId:
    """One segment of a topic: its partition and its sequence number there."""

    partition: int
    seq: int

    def __str__(self) -> str:
        return f"{self.partition}-{self.seq}"

    @classmethod
    def parse(cls, text: object) -> SegmentId:
        """The id spelled ``text`` (``<partition>-<seq>``); :class:`InvalidArgument`
        otherwise."""
        m = _TEXT.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise InvalidArgument(f"invalid segment id {text!r}: expected <partition>-<sequence>"
                                  ", two non-negative integers such as 0-12")
        return cls(int(m.group(1)), int(m.group(2)))


__all__ = ["SegmentId"]
