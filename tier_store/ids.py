"""Identifiers with one spelling: a segment's id, parsed once and validated.

A segment is named within its topic by its partition and its sequence number in that
partition: ``<partition>-<seq>`` in entries, tombstones and messages. The text form is
written and read only here, so an id that grows a part (the writing host, say) changes
one class.
"""

from __future__ import annotations

import os
import re
import socket
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


# On a store shared by many hosts, host ``k`` (numbered by the store's root) numbers its
# segments in [k * SEQ_SPAN, (k + 1) * SEQ_SPAN): two hosts writing one partition never pick
# the same number, without asking each other. A single-host store is host 0: numbers as ever.
SEQ_SPAN = 2**40
MAX_HOSTS = 2**22  # keeps every number below 2**62

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_BUNDLE = re.compile(r"[0-9a-f]{32}")


def host_seqs(number: int) -> range:
    """The segment numbers host ``number`` gives its segments."""
    return range(number * SEQ_SPAN, (number + 1) * SEQ_SPAN)


def check_host(text: object, what: str = "a host id") -> str:
    """``text`` if it may name a host (letters, digits, ``.``, ``_``, ``-``; up to 63);
    ``ValueError`` naming ``what`` otherwise."""
    if not isinstance(text, str) or not _HOST.fullmatch(text):
        raise ValueError(f"{what} is {text!r}, not 1 to 63 letters, digits, '.', '_' or '-'")
    return text


def host_id() -> str:
    """This host's id: ``PAFKA_HOST_ID`` if set, else the host name (read at each call, so
    a process that sets it before opening a store is seen as that host)."""
    given = os.environ.get("PAFKA_HOST_ID")
    name = given or socket.gethostname() or "localhost"
    try:
        return check_host(name)
    except ValueError as e:
        raise InvalidArgument(f"{'PAFKA_HOST_ID' if given else 'the host name'}: {e}; set "
                              "PAFKA_HOST_ID to name this host, uniquely") from None


def check_bundle(text: object) -> str:
    """``text`` if it names a shared object of chunks (32 lowercase hex digits);
    ``ValueError`` otherwise."""
    if not isinstance(text, str) or not _BUNDLE.fullmatch(text):
        raise ValueError(f"obj is {text!r}, not 32 lowercase hex digits")
    return text


def bundle_halves(text: str) -> tuple[int, int]:
    """A bundle id as two unsigned 64-bit integers (how chunk rows hold it)."""
    return int(text[:16], 16), int(text[16:], 16)


def bundle_text(hi: int, lo: int) -> str:
    """The bundle id two integers of :func:`bundle_halves` hold."""
    return f"{hi:016x}{lo:016x}"


__all__ = ["MAX_HOSTS", "SEQ_SPAN", "SegmentId", "bundle_halves", "bundle_text", "check_bundle",
           "check_host", "host_id", "host_seqs"]
