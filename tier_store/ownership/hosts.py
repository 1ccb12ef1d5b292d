"""Host numbers of a store shared by many hosts: each host that writes gets a small number
once, recorded in the store's root, and numbers its segments in its own range
(:func:`tier_store.ids.host_seqs`).

Two objects per host, both created if absent: ``_hosts/number/<k>`` holds the host's id
and decides who has number ``k`` (of two hosts racing for it, the server lets one win);
``_hosts/id/<host>`` holds ``k`` and finds it again in one request. A host whose id is
already recorded under another number (two of its processes raced) takes the recorded one;
the number it won in the race stays unused.
"""

from __future__ import annotations

import json
import re
import threading
from typing import TYPE_CHECKING

from ..errors import CorruptState, PafkaError
from ..ids import MAX_HOSTS, check_host

if TYPE_CHECKING:
    from ..objects import ObjectStore

_BY_NUMBER = "_hosts/number"
_BY_ID = "_hosts/id"
_NUMBER = re.compile(r"[1-9][0-9]{0,6}")

_guard = threading.Lock()
_known: dict[tuple[str, str], int] = {}  # (root URL, host id) -> its number


def host_number(objects: ObjectStore, host: str) -> int:
    """The number of host ``host`` in the store at ``objects`` (1 and up), registered on
    first use."""
    check_host(host)
    with _guard:
        known = _known.get((objects.url, host))
    if known is not None:
        return known
    number = _recorded(objects, host)
    for _ in range(100):
        if number is not None:
            break
        taken = [int(k) for k in _numbers(objects)]
        candidate = max(taken, default=0) + 1
        if candidate >= MAX_HOSTS:
            raise PafkaError(f"{objects.where(_BY_NUMBER)}/: {MAX_HOSTS - 1} hosts have "
                             "written to this store; no host number is left")
        if objects.put_if_absent(f"{_BY_NUMBER}/{candidate}", host.encode()):
            if objects.put_if_absent(f"{_BY_ID}/{host}", str(candidate).encode()):
                number = candidate
            else:
                number = _recorded(objects, host)
    if number is None:
        raise PafkaError(f"{objects.where(_BY_NUMBER)}/: 100 hosts in a row took the next "
                         f"host number before {host}; giving up")
    with _guard:
        _known[(objects.url, host)] = number
    return number


def _numbers(objects: ObjectStore) -> list[str]:
    out = []
    for info in objects.list(_BY_NUMBER):
        name = info.key.rsplit("/", 1)[-1]
        if not _NUMBER.fullmatch(name):
            raise CorruptState(f"{objects.where(info.key)} is not a host number's record "
                               "(those are positive integers): it was not written by a "
                               "pafka store; delete it")
        out.append(name)
    return out


def _recorded(objects: ObjectStore, host: str) -> int | None:
    """The number recorded for ``host``, checked against the record of that number."""
    raw = objects.get(f"{_BY_ID}/{host}")
    if raw is None:
        return None
    where = objects.where(f"{_BY_ID}/{host}")
    try:
        text = raw.decode("ascii")
        if not _NUMBER.fullmatch(text):
            raise ValueError(f"{raw[:40]!r} is not a host number")
        number = int(text)
    except (UnicodeDecodeError, ValueError) as e:
        raise CorruptState(f"{where} is damaged: {e}") from None
    owner = objects.get(f"{_BY_NUMBER}/{number}")
    if owner != host.encode():
        raise CorruptState(f"{where} gives host {host} number {number}, but "
                           f"{objects.where(f'{_BY_NUMBER}/{number}')} names "
                           f"{json.dumps(owner.decode('utf-8', 'replace')) if owner else 'no host'}"
                           "; delete the first if the second is right")
    return number


__all__ = ["host_number"]
