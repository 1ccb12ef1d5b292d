"""The driver-side group tracker records a position only when it knows whose offsets they are."""

import json

from pafka_source.groups import GroupTracker, TrackedSource
from tier_store import Store

from .conftest import SCHEMA, make_batch


def _topic(tmp_path):
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=2)
    t.append(make_batch(0, 10), partition=0)
    t.append(make_batch(10, 5), partition=1)
    return s, t


def _end(t, ids=True):
    body = {"t": {"0": 10, "1": 5}}
    if ids:
        body["_ids"] = {"t": t.id}
    return json.dumps(body)


def test_a_pafka_offset_with_its_topics_id_is_recorded_as_the_groups_position(tmp_path):
    s, t = _topic(tmp_path)
    tracker = GroupTracker(spark=None)
    tracker._record([TrackedSource(s.root, "g", ("t",), None)], _end(t), pafka_only=False)
    assert Store.open(s.root).topic("t").positions() == {"g": {0: 10, 1: 5}}


def test_offsets_that_may_be_another_sources_are_not_recorded(tmp_path):
    s, t = _topic(tmp_path)
    tracker = GroupTracker(spark=None)
    mine = TrackedSource(s.root, "g", ("t",), None)
    # Beside a source of another kind, offsets without pafka's ids could be that source's.
    tracker._record([mine], _end(t, ids=False), pafka_only=False)
    # Two pafka sources read a topic of that name: whose offsets these are is unknown.
    tracker._record([mine, TrackedSource(s.root + "-other", None, ("t",), None)], _end(t),
                    pafka_only=True)
    # The ids name another incarnation of the topic.
    tracker._record([mine], json.dumps({"t": {"0": 10}, "_ids": {"t": "gone"}}),
                    pafka_only=True)
    assert Store.open(s.root).topic("t").positions() == {}
    # In a query of pafka sources only, offsets without ids (a topic made before ids) count.
    tracker._record([mine], _end(t, ids=False), pafka_only=True)
    assert Store.open(s.root).topic("t").positions() == {"g": {0: 10, 1: 5}}
