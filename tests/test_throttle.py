"""The tier write throttle hook (``tier_store.throttle_tier_writes``): a charge set on tier N
is called with the bytes of every write to tier N, and only those."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tier_store import Store, throttle_tier_writes

from .conftest import SCHEMA, make_batch

TIERS = (None, 1, 2, 3)


@pytest.fixture(autouse=True)
def no_throttles():
    """Each test starts and ends with no throttle set (they are process-wide)."""
    for n in TIERS:
        throttle_tier_writes(None, n)
    yield
    for n in TIERS:
        throttle_tier_writes(None, n)


class Meter:
    """A charge that records what it is charged."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, nbytes: int) -> None:
        self.calls.append(nbytes)

    @property
    def total(self) -> int:
        return sum(self.calls)


def _metered_appends(store, appends: int):
    """A new topic ``t`` given ``appends`` appends of 200 rows, with a meter on tiers 1 and
    2 each: (topic, meter of tier 1, meter of tier 2)."""
    one, two = Meter(), Meter()
    throttle_tier_writes(one, 1)
    throttle_tier_writes(two, 2)
    t = store.create_topic("t", SCHEMA)
    for i in range(appends):
        t.append(make_batch(i * 200, 200))
    return t, one, two


def _bytes_on(topic, tier: int) -> int:
    """Chunk bytes of the topic's segments on ``tier``."""
    return sum(s.bytes for s in topic.segments() if s.tier == tier)


def test_appends_are_charged_to_their_own_file_tier(tmp_path):
    # Tier 1 holds two segments; later ones go to tier 2.
    s = Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,HDD",
        "storage.tiers.first.sizes": "128k", "log.segment.bytes": "64k"})
    t, one, two = _metered_appends(s, 40)
    assert _bytes_on(t, 1) > 0 and _bytes_on(t, 2) > 0
    assert one.total == _bytes_on(t, 1) and two.total == _bytes_on(t, 2)
    assert len(one.calls) + len(two.calls) == 40  # one charge per chunk
    s.close()


def test_pmem_appends_are_charged_to_the_pmem_tier_only(tiered_store):
    t, pmem, hdd = _metered_appends(tiered_store, 10)
    assert {s.tier for s in t.segments()} == {1}
    assert pmem.total == _bytes_on(t, 1) > 0 and len(pmem.calls) == 10
    assert hdd.calls == []


def test_a_throttle_for_every_tier_and_its_removal(tiered_store):
    every = Meter()
    throttle_tier_writes(every)
    t = tiered_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 200))
    assert every.total == _bytes_on(t, 1) > 0
    # A throttle of the tier itself takes precedence over the one of every tier.
    own = Meter()
    throttle_tier_writes(own, 1)
    t.append(make_batch(200, 200))
    assert len(every.calls) == 1 and len(own.calls) == 1
    throttle_tier_writes(None, 1)
    throttle_tier_writes(None)
    t.append(make_batch(400, 200))
    assert len(every.calls) == 1 and len(own.calls) == 1
    assert t.latest_offsets()[0] == 600


def test_removing_a_throttle_stops_its_charges(file_store):
    meter = Meter()
    throttle_tier_writes(meter, 1)
    t = file_store.create_topic("t", SCHEMA)
    t.append(make_batch(0, 100))
    charged = meter.total
    assert charged == _bytes_on(t, 1) > 0
    throttle_tier_writes(None, 1)
    t.append(make_batch(100, 100))
    assert meter.total == charged
    # The tier's writers look the throttle up at each write: set again, it applies to the
    # segment already open.
    before = _bytes_on(t, 1)
    throttle_tier_writes(meter, 1)
    t.append(make_batch(200, 100))
    assert len({s.id for s in t.segments()}) == 1
    assert meter.total - charged == _bytes_on(t, 1) - before > 0
    assert len(meter.calls) == 2


def test_a_remote_tier_charges_each_whole_write(tmp_path):
    s = Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,REMOTE",
        "storage.tiers.second.paths": f"file://{tmp_path}/remote", "log.segment.bytes": "64k"})
    local, remote = Meter(), Meter()
    throttle_tier_writes(local, 1)
    throttle_tier_writes(remote, 2)
    tier = s.tier(2)
    assert tier.is_remote
    tier.write_whole(tier.segment_path("t", 0, 7), pa.py_buffer(b"x" * 12_345))
    assert remote.calls == [12_345] and local.calls == []
    s.close()
