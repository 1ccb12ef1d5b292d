"""An executor's read of a planned range that retention cut meanwhile (no Spark session)."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from pafka_source.planning import read_plan
from tier_store import DataLoss, Store

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("s", pa.string())])


def _batch(a: int, b: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array(range(a, b), pa.int64()), pa.array(["x" * 100] * (b - a))],
                           schema=SCHEMA)


@pytest.fixture
def cut_plan(tmp_path):
    """A plan of [0, 4100) whose first 4,000 offsets retention deleted before the read."""
    s = Store.open(str(tmp_path), {"log.segment.bytes": "64k", "log.retention.ms": 1000,
                                   "log.cleanup.grace.ms": 0,
                                   "storage.tiers.first.sizes": "64m"}, create=True)
    t = s.create_topic("t", SCHEMA, partitions=1)
    for a, b in ((0, 2000), (2000, 4000), (4000, 4100)):
        t.append(_batch(a, b))
    plan = t.plan_read(0, 0)
    time.sleep(1.2)
    assert t.apply_retention()
    s.collect_garbage(t)
    assert t.earliest_offsets() == {0: 4000}
    yield plan
    s.close()


def test_a_lenient_read_goes_on_from_the_earliest_offset_to_the_plans_end(cut_plan):
    got = [r for b in read_plan(cut_plan, SCHEMA, False, True, False)
           for r in b.column("id").to_pylist()]
    assert got == list(range(4000, 4100))  # what is left of the range, once each


def test_a_strict_read_of_a_cut_range_fails_naming_it(cut_plan):
    with pytest.raises(DataLoss, match="deleted by retention"):
        list(read_plan(cut_plan, SCHEMA, False, True, True))
