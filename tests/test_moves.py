import fcntl
import logging
import os
import signal
import subprocess
import textwrap
import time

import pytest

from tier_store import (
    CommitConflict,
    OldCopyInGrace,
    PafkaError,
    Store,
    check_topic,
    execute,
    seal_idle,
)

from .conftest import PYTHON, ROOT, SCHEMA, make_batch, read_all
from .support import fill, open_pmem_hdd


def _tiered(tmp_path, shm_dir, **extra):
    return open_pmem_hdd(tmp_path, shm_dir, **{
        "storage.tiers.first.sizes": "2m", "log.cleanup.grace.ms": 0, **extra})


def _fill(store, n=40, per=200):
    return fill(store, n, per)


def test_moving_a_sealed_segment_down_keeps_offsets_and_content(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s)
    before = read_all(t, 0)
    seg = t.segments()[0]
    assert seg.tier == 1 and seg.sealed
    free = s.tier(1).free_pool_files()
    r = s.move_segment(f"t/{seg.id}", 2)
    assert (r.segment, r.to_tier, r.records) == (seg.id, 2, seg.records)
    after = {x.id: x for x in t.segments()}
    assert after[seg.id].tier == 2 and os.path.exists(after[seg.id].path)
    assert read_all(Store.open(s.root).topic("t"), 0) == before
    assert s.collect_garbage(t) == 1
    assert not os.path.exists(seg.path)
    assert s.tier(1).free_pool_files() == free + 1  # the pool file went back to the pool


def test_demotion_merges_adjacent_segments_and_drops_holes(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = s.create_topic("t", SCHEMA)
    for i in range(50):
        t.append(make_batch(i * 200, 200))
        if i % 5 == 0:
            t.write_chunks(make_batch(10**6, 100))  # never committed: a hole
    segs = [x for x in t.segments() if x.sealed][:4]
    assert len(segs) == 4
    r = s.move_segment(segs[0].id, 2, merge_with=[x.id for x in segs[1:]], topic="t")
    assert r.sources == tuple(x.id for x in segs)
    merged = next(x for x in t.segments() if x.id == segs[0].id)
    assert (merged.base_offset, merged.end_offset) == (segs[0].base_offset, segs[-1].end_offset)
    assert merged.records == sum(x.records for x in segs)
    assert os.path.getsize(merged.path) < sum(os.path.getsize(x.path) for x in segs)
    assert read_all(t, 0) == list(range(10000))
    from tier_store import check_topic
    assert check_topic(Store.open(s.root).topic("t")).ok


def test_active_segment_never_moves(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s, n=3)
    active = [x for x in t.segments() if not x.sealed][0]
    with pytest.raises(PafkaError, match="active segment"):
        s.move_segment(active.id, 2, topic="t")


def test_idle_active_segment_is_sealed_and_then_moves(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s, n=3)
    active = [x for x in t.segments() if not x.sealed][0]
    assert seal_idle(t, idle_ms=0, now_ms=t.state().last_ts + 1) == [active.id]
    s.move_segment(active.id, 2, topic="t")
    t.append(make_batch(600, 10))  # the next append starts a new segment
    assert read_all(t, 0) == list(range(610))


def test_a_reader_that_planned_before_a_move_still_finishes(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s)
    plan = t.plan_read(0, 0)
    for seg in [x for x in t.segments() if x.sealed]:
        s.move_segment(seg.id, 2, topic="t")
    got = [k for pb in execute(plan) for k in pb.batch.column("key").to_pylist()]
    assert got == list(range(8000))
    s.collect_garbage(t)  # old files gone: the plan re-resolves from the log once
    got = [k for pb in execute(plan) for k in pb.batch.column("key").to_pylist()]
    assert got == list(range(8000))


def test_a_late_commit_of_a_chunk_whose_segment_moved_fails_clearly(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s, n=2)
    late = t.write_chunks(make_batch(10**6, 10))
    active = t.active_segment(0)
    assert seal_idle(t, 0, now_ms=t.state().last_ts + 1)
    s.move_segment(f"0-{active[0]}", 2, topic="t")
    with pytest.raises(CommitConflict, match="moved or deleted"):
        t.commit(late)
    assert read_all(t, 0) == list(range(400))


def test_promotion_moves_a_segment_back_up(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s)
    seg = t.segments()[1]
    s.move_segment(seg.id, 2, topic="t")
    time.sleep(0.01)  # past the (zero) grace period of the old tier-1 copy
    s.move_segment(seg.id, 1, topic="t")
    assert next(x for x in t.segments() if x.id == seg.id).tier == 1
    assert read_all(t, 0) == list(range(8000))


def test_a_move_onto_a_full_tier_fails_and_changes_nothing(tmp_path, shm_dir):
    s = _tiered(tmp_path, shm_dir, **{"storage.tiers.first.sizes": "256k"})
    t = _fill(s, n=60)  # tier 1 fills, later segments go to tier 2
    low = [x for x in t.segments() if x.tier == 2 and x.sealed][0]
    from tier_store import StoreFull
    with pytest.raises(StoreFull, match="no free pool file"):
        s.move_segment(low.id, 1, topic="t")
    assert read_all(t, 0) == list(range(12000))


# -- moves racing commits, garbage collection and other services --------------------------------

def test_a_chunk_committed_while_its_segment_is_copied_is_not_dropped_by_the_move(
        tmp_path, shm_dir):
    # The chunk is written before its segment is sealed and committed only while the move
    # copies: older than the (zero) grace period, the segment counts as settled and moves.
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s, n=3)
    late = t.write_chunks(make_batch(10**6, 100))
    assert seal_idle(t, 0, now_ms=t.state().last_ts + 1) == ["0-0"]
    mover = Store.open(s.root)  # the migration service's own handle
    acked = []

    def commit_meanwhile(nbytes):
        if not acked:
            acked.extend(t.commit(late))

    r = mover.move_segment("t/0-0", 2, throttle=commit_meanwhile)
    assert acked and (r.records, r.to_tier) == (700, 2)
    after = Store.open(s.root).topic("t")
    assert read_all(after, 0) == list(range(600)) + list(range(10**6, 10**6 + 100))
    assert check_topic(after).ok


def _segment_moved_away_and_reclaimed(tmp_path, shm_dir, grace_ms):
    """A store whose segment 0-0 lived on tier 1, moved to tier 2, and whose tier-1 copy was
    reclaimed: moving it back up reuses its old name on tier 1."""
    s = _tiered(tmp_path, shm_dir, **{"log.cleanup.grace.ms": grace_ms})
    t = _fill(s, n=3)
    assert seal_idle(t, 0, now_ms=t.state().last_ts + 1) == ["0-0"]
    t.append(make_batch(600, 200))  # the next segment is the active one
    s.move_segment("t/0-0", 2)
    time.sleep(grace_ms / 1000 + 0.1)
    assert s.collect_garbage(t) == 1
    return s, t, s.tier(1).segment_path("t", 0, 0)


def _move_killed_after_linking(root, segment, tier):
    """Another service moving ``segment`` to ``tier``, killed after claiming the segment's name
    on the target tier with its copy, before publishing its move entry."""
    code = textwrap.dedent(f"""
        from tier_store import Store
        Store.open({str(root)!r}).move_segment({segment!r}, {tier})
    """)
    env = dict(os.environ, PAFKA_CRASH_POINT="move.linked")
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]


def test_garbage_collection_leaves_the_copy_a_move_has_just_linked(tmp_path, shm_dir):
    # The old tier-1 file's tombstone is past the grace period, but the file now under that
    # name is a fresh copy that a move's entry references a moment later.
    s, t, final = _segment_moved_away_and_reclaimed(tmp_path, shm_dir, grace_ms=2000)
    _move_killed_after_linking(s.root, "t/0-0", 1)
    assert os.path.exists(final)
    # A live mover holds its copy's lock until its entry is published.
    fd = os.open(final, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert s.collect_garbage(t) == 0
        assert os.path.exists(final)
    finally:
        os.close(fd)
    # Its mover is gone: on a pool tier the segment's name goes at once (no reader can pin
    # an unpublished copy), the temporary name once untouched for the grace period; the
    # pool file goes back to the pool exactly once.
    assert s.collect_garbage(t) == 1 and not os.path.exists(final)
    time.sleep(2.1)
    assert s.collect_garbage(t) == 1
    usage = {u["tier"]: u for u in s.tier_usage()}
    assert usage[1]["pool_free"] + usage[1]["segments"] == usage[1]["pool_files"]
    s.move_segment("t/0-0", 1)
    assert read_all(Store.open(s.root).topic("t"), 0) == list(range(800))


def test_a_second_service_never_releases_the_copy_another_one_just_linked(tmp_path, shm_dir):
    s, t, final = _segment_moved_away_and_reclaimed(tmp_path, shm_dir, grace_ms=2000)
    _move_killed_after_linking(s.root, "t/0-0", 1)
    linked = os.stat(final).st_ino
    fd = os.open(final, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as the live service holds it until it publishes
    try:
        with pytest.raises(CommitConflict, match="still exists"):
            Store.open(s.root).move_segment("t/0-0", 1)
        assert os.stat(final).st_ino == linked
    finally:
        os.close(fd)
    # The service is dead (no lock): on a pool tier its copy is released at once and the
    # move goes through.
    r = Store.open(s.root).move_segment("t/0-0", 1)
    assert r.to_tier == 1 and os.stat(final).st_ino != linked
    after = Store.open(s.root).topic("t")
    assert read_all(after, 0) == list(range(800)) and check_topic(after).ok


def test_garbage_collection_never_reclaims_the_copy_of_a_move_in_progress(tmp_path, shm_dir):
    s, t, final = _segment_moved_away_and_reclaimed(tmp_path, shm_dir, grace_ms=300)
    gc = Store.open(s.root)
    reclaimed = []

    def stall_then_collect(nbytes):
        if not reclaimed:
            time.sleep(0.5)  # the copy (a pool file) is now untouched for the grace period
            reclaimed.append(gc.collect_garbage(gc.topic("t")))

    r = Store.open(s.root).move_segment("t/0-0", 1, throttle=stall_then_collect)
    assert reclaimed == [0] and r.to_tier == 1
    after = Store.open(s.root).topic("t")
    assert read_all(after, 0) == list(range(800)) and check_topic(after).ok
    usage = {u["tier"]: u for u in s.tier_usage()}
    assert usage[1]["pool_free"] + usage[1]["segments"] == usage[1]["pool_files"]


def test_a_move_makes_the_directories_it_creates_durable(tmp_path, shm_dir, monkeypatch):
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s)
    tier2 = s.tier(2).path
    assert not os.path.exists(os.path.join(tier2, "t"))
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    s.move_segment(t.segments()[0].id, 2, topic="t")
    monkeypatch.undo()
    # <tier>/t and <tier>/t/0 are new: their entries in their parents must be durable too.
    for d in (tier2, os.path.join(tier2, "t"), os.path.join(tier2, "t", "0")):
        assert os.path.realpath(d) in synced, (d, synced)



# -- a segment moved back to a tier whose old copy is in its grace period -------------------------

def _default_grace(tmp_path, shm_dir, **extra):
    """A tiered store with the default grace period (10 minutes): no old file ages out here."""
    return Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "PMEM,HDD",
        "storage.tiers.first.paths": shm_dir, "storage.tiers.first.sizes": "2m",
        "log.segment.bytes": "64k", "log.pmem.pool.ratio": 1.0, **extra})


def _down_up(s, t, sid):
    """Move ``sid`` from tier 1 to tier 2 and back up: its tier-2 copy stays, tombstoned, in
    its grace period. Returns that copy's path."""
    assert s.move_segment(f"t/{sid}", 2).to_tier == 2
    old = next(x for x in t.segments() if x.id == sid).path
    s.collect_garbage(t)  # the tier-1 pool file goes back to the pool (no reader pins it)
    assert s.move_segment(f"t/{sid}", 1).to_tier == 1
    assert os.path.exists(old) and s.collect_garbage(t) == 0  # in its grace period
    return old


def _chunk_positions(t, sid):
    st = t.state()
    seg = st.segments[sid]
    rows = st.chunks[seg.partition].rows()
    return [(int(r["pos"]), int(r["length"])) for r in rows[rows["seq"] == seg.seq]]


def test_a_segment_demoted_again_in_the_grace_period_re_adopts_its_old_copy(tmp_path, shm_dir):
    s = _default_grace(tmp_path, shm_dir)
    assert s.config["log.cleanup.grace.ms"] == 600_000
    t = _fill(s)
    want = read_all(t, 0)
    sid = t.segments()[1].id
    old = _down_up(s, t, sid)
    ino, size = os.stat(old).st_ino, os.path.getsize(old)
    plan = t.plan_read(0, 0)  # names the segment's tier-1 file
    r = s.move_segment(f"t/{sid}", 2)
    assert r.adopted and (r.to_tier, r.from_tiers, r.sources) == (2, (1,), (sid,))
    seg = next(x for x in t.segments() if x.id == sid)
    assert seg.tier == 2 and seg.path == old
    assert (os.stat(old).st_ino, os.path.getsize(old)) == (ino, size)  # nothing copied
    assert [k for pb in execute(plan) for k in pb.batch.column("key").to_pylist()] == want
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == want and check_topic(fresh).ok
    # Referenced again: garbage collection keeps it; the tier-1 file goes to the pool.
    assert s.collect_garbage(t) == 1 and os.stat(old).st_ino == ino
    usage = {u["tier"]: u for u in s.tier_usage()}
    assert usage[1]["pool_free"] + usage[1]["segments"] == usage[1]["pool_files"]
    # And round again: the tier-1 pool file is free to take, the tier-2 file adopted again.
    s.move_segment(f"t/{sid}", 1)
    assert s.move_segment(f"t/{sid}", 2).adopted and os.stat(old).st_ino == ino
    assert read_all(Store.open(s.root).topic("t"), 0) == want


def test_a_segment_that_spilled_to_tier_two_re_adopts_the_file_its_writer_wrote(tmp_path,
                                                                                shm_dir):
    # Written straight to tier 2 in a burst (tier 1 full), promoted, then demoted again.
    s = _default_grace(tmp_path, shm_dir, **{"storage.tiers.first.sizes": "256k"})
    t = _fill(s, n=60)
    want = read_all(t, 0)
    spilled = [x for x in t.segments() if x.tier == 2 and x.sealed][0]
    ino = os.stat(spilled.path).st_ino
    s.move_segment(f"t/{t.segments()[0].id}", 2)  # frees a pool file for the promotion
    s.collect_garbage(t)
    assert s.move_segment(f"t/{spilled.id}", 1).to_tier == 1
    r = s.move_segment(f"t/{spilled.id}", 2)
    assert r.adopted and os.stat(spilled.path).st_ino == ino
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == want and check_topic(fresh).ok


def _not_adopted_because(caplog):
    return [r.getMessage() for r in caplog.records if "adopted" in r.getMessage()]


def test_an_old_copy_with_a_damaged_byte_is_not_re_adopted(tmp_path, shm_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="tier_store.maintenance.adopt")
    s = _default_grace(tmp_path, shm_dir)
    t = _fill(s)
    want = read_all(t, 0)
    sid = t.segments()[1].id
    old = _down_up(s, t, sid)
    pos, length = _chunk_positions(t, sid)[2]  # the layout is the same on both tiers
    with open(old, "r+b") as f:
        f.seek(pos + length // 2)
        byte = f.read(1)
        f.seek(pos + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    before = os.stat(old)
    with pytest.raises(CommitConflict, match="grace period") as e:
        s.move_segment(f"t/{sid}", 2)
    assert isinstance(e.value, OldCopyInGrace)
    assert "does not match its checksum" in " ".join(_not_adopted_because(caplog))
    # Nothing changed: the segment stays on tier 1, the old file as it was (not touched).
    after = os.stat(old)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == \
        (before.st_ino, before.st_mtime_ns, before.st_size)
    assert next(x for x in t.segments() if x.id == sid).tier == 1
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == want and check_topic(fresh).ok


def test_an_old_copy_laid_out_otherwise_or_locked_is_not_re_adopted(tmp_path, shm_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="tier_store.maintenance.adopt")
    s = _default_grace(tmp_path, shm_dir)
    t = _fill(s)
    want = read_all(t, 0)
    sid = t.segments()[1].id
    old = _down_up(s, t, sid)
    ino = os.stat(old).st_ino
    # Held by a live move (or a release): left alone.
    fd = os.open(old, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(CommitConflict, match="still exists"):
            s.move_segment(f"t/{sid}", 2)
    finally:
        os.close(fd)
    assert "is locked" in " ".join(_not_adopted_because(caplog))
    # A block more than a copy holds past its end: not the copy's layout.
    with open(old, "ab") as f:
        f.write(b"\0" * 4096)
    with pytest.raises(CommitConflict, match="grace period"):
        s.move_segment(f"t/{sid}", 2)
    assert "a copy would end at byte" in " ".join(_not_adopted_because(caplog))
    assert os.stat(old).st_ino == ino
    assert next(x for x in t.segments() if x.id == sid).tier == 1
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == want and check_topic(fresh).ok


def test_a_merge_onto_an_old_copy_in_its_grace_period_waits_and_others_merge(tmp_path,
                                                                             shm_dir):
    s = _default_grace(tmp_path, shm_dir)
    t = _fill(s)
    want = read_all(t, 0)
    segs = [x for x in t.segments() if x.sealed]
    old = _down_up(s, t, segs[0].id)
    # A merge writes a new segment under the first one's name: never an adoption.
    with pytest.raises(OldCopyInGrace):
        s.move_segment(segs[0].id, 2, merge_with=[segs[1].id], topic="t")
    assert {x.id: x.tier for x in t.segments()}[segs[1].id] == 1
    r = s.move_segment(segs[2].id, 2, merge_with=[x.id for x in segs[3:5]], topic="t")
    assert not r.adopted and r.sources == tuple(x.id for x in segs[2:5])
    merged = next(x for x in t.segments() if x.id == segs[2].id)
    assert merged.tier == 2 and merged.records == sum(x.records for x in segs[2:5])
    assert os.path.exists(old)
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == want and check_topic(fresh).ok


@pytest.mark.parametrize("point", ["move.verified", "move.linked", "move.committed"])
def test_a_re_adopting_move_killed_at_any_step_loses_nothing(tmp_path, shm_dir, point):
    s = _default_grace(tmp_path, shm_dir)
    t = _fill(s)
    want = read_all(t, 0)
    sid = t.segments()[1].id
    old = _down_up(s, t, sid)
    ino = os.stat(old).st_ino
    code = textwrap.dedent(f"""
        from tier_store import Store
        Store.open({str(s.root)!r}).move_segment("t/{sid}", 2)
    """)
    env = dict(os.environ, PAFKA_CRASH_POINT=point)
    r = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    after = Store.open(s.root).topic("t")
    assert read_all(after, 0) == want and check_topic(after).ok
    assert os.stat(old).st_ino == ino
    tier = next(x for x in after.segments() if x.id == sid).tier
    assert tier == (2 if point == "move.committed" else 1)
    if tier == 1:  # the mover died holding the old file's lock: the kernel dropped it
        assert s.move_segment(f"t/{sid}", 2).adopted and os.stat(old).st_ino == ino
    s2 = Store.open(s.root)
    s2.collect_garbage(s2.topic("t"))
    t2 = s2.topic("t")
    assert read_all(t2, 0) == want and check_topic(t2).ok
    usage = {u["tier"]: u for u in s2.tier_usage()}
    assert usage[1]["pool_free"] + usage[1]["segments"] == usage[1]["pool_files"]


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_segment_going_back_to_a_remote_tier_re_adopts_its_old_copy(tmp_path, kind):
    import uuid
    url = f"file://{tmp_path}/remote" if kind == "file" else \
        f"memory://pafka-{uuid.uuid4().hex[:8]}"
    s = Store.open(tmp_path / "store", {
        "log.channel.type": "tiered", "storage.tiers.types": "NVME,REMOTE",
        "storage.tiers.first.sizes": "1m", "storage.tiers.second.paths": url,
        "log.segment.bytes": "64k"})
    t = _fill(s)
    want = read_all(t, 0)
    sid = t.segments()[1].id
    assert not s.move_segment(f"t/{sid}", 2).adopted  # uploaded
    # Back up: the segment's old file on tier 1 (its writer's) is in its grace period.
    assert s.move_segment(f"t/{sid}", 1).adopted
    r = s.move_segment(f"t/{sid}", 2)
    assert r.adopted and r.to_tier == 2
    fresh = Store.open(s.root).topic("t")
    assert read_all(fresh, 0) == want and check_topic(fresh).ok


def test_the_service_logs_a_move_waiting_for_an_old_copy_s_grace_period_once(tmp_path, shm_dir,
                                                                              caplog):
    from migration import MigrationService
    from migration.policy import Move
    from migration.service import Throttle
    s = _default_grace(tmp_path, shm_dir)
    t = _fill(s)
    sid = t.segments()[1].id
    old = _down_up(s, t, sid)
    with open(old, "ab") as f:  # not laid out as a copy: not adopted, the move waits
        f.write(b"\0" * 4096)
    svc = MigrationService(s)
    move = Move("t", (sid,), 1, 2, 0)
    caplog.set_level(logging.DEBUG, logger="migration.service")
    for _ in range(3):
        assert svc._move(move, Throttle(0)) == (None, False)
    logged = [(r.levelno, r.getMessage()) for r in caplog.records
              if r.name == "migration.service"]
    assert [lvl for lvl, _ in logged] == [logging.INFO, logging.DEBUG, logging.DEBUG], logged
    assert "grace period" in logged[0][1]


def test_a_segments_file_bytes_are_what_a_move_lays_out(tmp_path, shm_dir):
    # The policy plans with file_bytes and the mover needs the layout's end: the same
    # number, so a segment its writer filled fits a pool file again.
    s = _tiered(tmp_path, shm_dir)
    t = _fill(s, n=300, per=77)  # chunks of lengths no multiple of the alignment
    sealed = [x for x in t.segments() if x.sealed]
    assert len(sealed) >= 3
    for seg in sealed[:3]:
        s.move_segment(f"t/{seg.id}", 2)
        moved = t.refresh().state().part(0).segments[int(seg.id.split("-")[1])]
        assert moved.tier == 2 and moved.extent == seg.file_bytes
        s.move_segment(f"t/{seg.id}", 1)
        assert {x.id: x.tier for x in t.refresh().segments()}[seg.id] == 1
