"""Following a topic from plain Python: ``Topic.follow`` and ``Consumer``, on real stores,
with writers, the migration service and retention acting while the follower reads."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from migration import MigrationService
from tier_store import Consumer, DataLoss, FetchedBatch, InvalidArgument, PafkaError, Store

from .conftest import SCHEMA, make_batch
from .support import open_pmem_hdd

WAIT = 60.0  # seconds a test waits for what another thread does, on a loaded machine


def keys(batches: list[FetchedBatch]) -> list[int]:
    return [k for fb in batches for k in fb.batch.column("key").to_pylist()]


def contiguous(batches: list[FetchedBatch], start: int) -> bool:
    """Each batch starts where the one before ended: nothing skipped, nothing twice."""
    at = start
    for fb in batches:
        if fb.offset != at:
            return False
        at = fb.end
    return True


def test_follow_from_a_thread_yields_each_append_once_as_it_is_committed(tmp_path):
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=2)
    t.append(make_batch(0, 100), partition=0)
    got: list[FetchedBatch] = []
    # Its own handle, as another part of a program would have.
    follower = Store.open(s.root).topic("t").follow(0, "earliest", poll_interval=0.05,
                                                    timeout=WAIT)

    def run() -> None:
        for fb in follower:
            got.append(fb)
            if fb.end >= 100 + 40 * 50:
                return

    th = threading.Thread(target=run)
    th.start()
    for i in range(40):
        t.append(make_batch(100 + i * 50, 50), partition=0)
        t.append(make_batch(10**6 + i, 1), partition=1)  # another partition: not followed
        time.sleep(0.01)
    th.join(WAIT)
    assert not th.is_alive()
    assert keys(got) == list(range(100 + 40 * 50))
    assert contiguous(got, 0) and all(fb.partition == 0 for fb in got)
    # The offsets and commit times come with each batch.
    assert got[-1].offsets.to_pylist()[-1] == got[-1].end - 1
    assert all(fb.timestamp > 0 for fb in got)


def test_follow_starts_where_told_and_stops_after_the_timeout_without_data(tmp_path):
    s = Store.open(tmp_path / "store")
    t = s.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 30))
    assert keys(list(t.follow(0, 10, timeout=0))) == list(range(10, 30))
    assert list(t.follow(0, "latest", timeout=0)) == []
    began = time.monotonic()
    assert keys(list(t.follow(0, "earliest", poll_interval=0.05, timeout=0.5))) == \
        list(range(30))
    assert time.monotonic() - began >= 0.5  # it waited the timeout for more


def test_a_follower_started_at_latest_sees_only_later_appends(tmp_path):
    s = Store.open(tmp_path / "store")
    t = s.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 10))
    follower = t.follow(0, "latest", poll_interval=0.05, timeout=WAIT)
    t.append(make_batch(10, 5))
    assert keys([next(follower)]) == list(range(10, 15))
    follower.close()


def test_segments_migrating_under_a_follower_are_read_exactly_once(tmp_path, shm_dir):
    """The migration service moves segments down to tier 2 while a thread follows the
    partition: every record comes once, in order."""
    s = open_pmem_hdd(tmp_path, shm_dir, **{"log.cleanup.grace.ms": 0,
                                            "storage.migrate.threshold": 0.25})
    t = s.create_topic("t", SCHEMA, partitions=1)
    total = 150 * 200
    got: list[FetchedBatch] = []
    follower = Store.open(s.root).topic("t").follow(0, 0, poll_interval=0.02, timeout=WAIT)

    def run() -> None:
        for fb in follower:
            got.append(fb)
            time.sleep(0.002)  # a slow reader: the service moves what it has not read yet
            if fb.end >= total:
                return

    th = threading.Thread(target=run)
    th.start()
    svc = MigrationService(Store.open(s.root))
    for i in range(150):
        t.append(make_batch(i * 200, 200))
        if i % 10 == 9:
            svc.run_once()
    th.join(WAIT)
    assert not th.is_alive()
    assert svc.stats.segments_down > 0
    assert 2 in {x.tier for x in t.segments()}
    assert keys(got) == list(range(total)) and contiguous(got, 0)


def test_segments_moved_in_the_middle_of_a_read_are_planned_again(tmp_path, shm_dir):
    """The follower has planned the whole partition and yielded its first batch; then every
    sealed segment moves to tier 2 and its tier-1 file is freed. The rest still comes once."""
    s = open_pmem_hdd(tmp_path, shm_dir, **{"log.cleanup.grace.ms": 0})
    t = s.create_topic("t", SCHEMA, partitions=1)
    for i in range(60):
        t.append(make_batch(i * 200, 200))
    follower = Store.open(s.root).topic("t").follow(0, 0, timeout=0)
    got = [next(follower)]
    planned = {c.path for c in t.plan_read(0, 0).chunks}  # what the follower planned too
    sealed = [x for x in t.segments() if x.sealed]
    assert len(sealed) > 2 and {x.tier for x in sealed} == {1}
    for x in sealed[1:]:  # the first one's file is mapped by the reader: it stays pinned
        s.move_segment(x.id, 2, topic="t")
    assert {x.tier for x in t.segments() if x.sealed and x.id != sealed[0].id} == {2}
    s.collect_garbage(t)  # grace 0: the old files go now
    assert any(not os.path.exists(p) for p in planned)  # so the read is planned again
    got += list(follower)
    assert keys(got) == list(range(60 * 200)) and contiguous(got, 0)


def _deleted_start(tmp_path):
    """A topic whose first sealed segments retention has deleted (offsets 0..gone-1)."""
    s = Store.open(tmp_path / "store", {"log.segment.bytes": "64k"})
    t = s.create_topic("t", SCHEMA, partitions=1)
    for i in range(40):
        t.append(make_batch(i * 200, 200))
    return s, t


@pytest.mark.parametrize("reset", ["earliest", "latest", "none"])
def test_retention_deleting_the_unread_start_resets_as_kafka_would(tmp_path, reset, caplog):
    s, t = _deleted_start(tmp_path)
    follower = t.follow(0, 0, poll_interval=0.05, timeout=0, reset=reset)
    gone = [x for x in t.segments() if x.sealed][:3]
    t.delete_segments([x.id for x in gone])
    earliest = t.earliest_offsets()[0]
    assert earliest == gone[-1].end_offset > 0
    if reset == "none":
        with pytest.raises(DataLoss, match=rf"offsets \[0, {earliest}\) were deleted by "
                                           "retention.*reset='earliest'"):
            next(follower)
        return
    with caplog.at_level(logging.WARNING, logger="tier_store.follow"):
        got = list(follower)
    if reset == "earliest":
        assert keys(got) == list(range(earliest, 8000)) and contiguous(got, earliest)
    else:
        assert got == []
    assert f"offsets [0, {earliest}) were deleted by retention" in caplog.text


def test_follow_checks_its_arguments_on_the_call(tmp_path):
    s = Store.open(tmp_path / "store")
    t = s.create_topic("t", SCHEMA, partitions=2)
    t.append(make_batch(0, 5), partition=0)
    for kwargs, message in [
            ({"partition": 2}, "has no partition 2: it has partitions 0..1"),
            ({"partition": "0"}, "partition must be an integer"),
            ({"start": 6}, "start offset 6 is outside partition 0 .* 0 \\(earliest\\) to 5"),
            ({"start": -1}, "start offset -1 is outside"),
            ({"start": "first"}, "start must be 'earliest', 'latest' or an offset"),
            ({"poll_interval": 0}, "poll_interval must be a number of seconds > 0"),
            ({"timeout": -1}, "timeout must be a number of seconds >= 0 or None"),
            ({"timeout": float("nan")}, "timeout must be"),
            ({"reset": "smallest"}, "reset must be one of earliest, latest, none")]:
        args = {"partition": 0, **kwargs}
        with pytest.raises(InvalidArgument, match=message):
            t.follow(args.pop("partition"), **args)


# -- Consumer ------------------------------------------------------------------------------
def test_a_consumer_starts_from_its_groups_offsets_and_commits_what_it_polled(tmp_path):
    s = Store.open(tmp_path / "store")
    t = s.create_topic("t", SCHEMA, partitions=2)
    t.append(make_batch(0, 10), partition=0)
    t.append(make_batch(100, 4), partition=1)
    c = Consumer(s, "t", "billing")
    got = c.poll(max_records=6)
    assert sum(fb.batch.num_rows for fb in got) == 6
    assert c.commit() == c.positions() and sum(c.positions().values()) == 6
    rest = c.poll(timeout=1.0)
    assert sorted(keys(got) + keys(rest)) == list(range(10)) + list(range(100, 104))
    c.commit()
    assert Store.open(s.root).topic("t").positions()["billing"] == {0: 10, 1: 4}
    # A new consumer of the group resumes there and waits for what comes next.
    again = Consumer(Store.open(s.root), "t", "billing", poll_interval=0.05)
    assert again.positions() == {0: 10, 1: 4} and again.poll(timeout=0.2) == []
    t.append(make_batch(10, 3), partition=0)
    assert keys(again.poll(timeout=WAIT)) == [10, 11, 12]
    # pafka groups lists it, with its lag.
    from pafka_source.cli.group_commands import groups_report
    report = groups_report(Store.open(s.root), "t", "billing")
    assert report["groups"][0]["lag"] == 3
    again.commit()
    assert groups_report(Store.open(s.root), "t", "billing")["groups"][0]["lag"] == 0


def test_a_consumer_of_some_partitions_commits_only_those_and_finds_new_ones(tmp_path):
    s = Store.open(tmp_path / "store")
    t = s.create_topic("t", SCHEMA, partitions=2)
    t.set_position("g", {0: 0, 1: 0})
    t.append(make_batch(0, 3), partition=1)
    one = Consumer(s, "t", "g", partitions=[1], reset="none")
    assert one.assignment() == [1] and keys(one.poll()) == [0, 1, 2]
    one.commit()
    assert t.positions()["g"] == {0: 0, 1: 3}
    every = Consumer(s, "t", "g")
    t.add_partitions(1)
    t.append(make_batch(50, 2), partition=2)
    assert keys(every.poll(timeout=WAIT)) == [50, 51] and every.assignment() == [0, 1, 2]
    # A partition added later starts at the group's offset when it has one.
    t.add_partitions(1)
    t.append(make_batch(60, 5), partition=3)
    t.set_position("g", {3: 2})
    assert keys(every.poll(timeout=WAIT)) == [62, 63, 64] and every.positions()[3] == 5


def test_a_consumer_without_a_group_reads_but_commits_nothing(tmp_path):
    s = Store.open(tmp_path / "store")
    t = s.create_topic("t", SCHEMA, partitions=1)
    t.append(make_batch(0, 5))
    c = Consumer(s, "t", None, reset="latest")
    assert c.poll() == []
    c.seek(0, 2)
    assert keys(c.poll()) == [2, 3, 4]
    with pytest.raises(InvalidArgument, match="without a group has no position to commit"):
        c.commit()
    assert t.positions() == {}


def test_a_consumer_refuses_bad_arguments(tmp_path):
    s = Store.open(tmp_path / "store")
    s.create_topic("t", SCHEMA, partitions=1)
    for args, kwargs, message in [
            (("nope", "g"), {}, "topic 'nope' does not exist"),
            (("t", ""), {}, "consumer group must be a non-empty string"),
            (("t", "g"), {"partitions": [3]}, "has no partition 3"),
            (("t", "g"), {"partitions": []}, "partitions names no partition"),
            (("t", "g"), {"partitions": "0"}, "partitions must be integers"),
            (("t", "g"), {"reset": "none"}, "has no committed offset for partition 0"),
            (("t", "g"), {"reset": "begin"}, "reset must be one of"),
            (("t", "g"), {"poll_interval": -1}, "poll_interval must be")]:
        with pytest.raises(PafkaError, match=message):
            Consumer(s, *args, **kwargs)
    c = Consumer(s, "t", "g")
    for kwargs, message in [({"timeout": -1}, "timeout must be"),
                            ({"max_records": 0}, "max_records must be a positive integer")]:
        with pytest.raises(InvalidArgument, match=message):
            c.poll(**kwargs)
    with pytest.raises(InvalidArgument, match="start offset 9 is outside"):
        c.seek(0, 9)
