"""Eviction of a host's own tier 1 on a store shared by many hosts, on a real radosgw.

Host ``hb`` (a subprocess with its own tier 1 bind-mounted at the shared path, see
tests/test_compaction.py) evicts: local copies of committed segments beyond the threshold,
oldest first, never the active segment; files of segments compacted to the shared tier once
the grace period is over. Reads on that host stay exact and go to the shared tier.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from .test_compaction import GRACE_MS, ROWS, expected, needs_hosts, open_two_hosts, tally, write


@pytest.fixture
def two_hosts(s3_root, tmp_path, monkeypatch):
    store, hb = open_two_hosts(s3_root, tmp_path, monkeypatch)
    yield store, hb
    store.close()


def _seq(path: str) -> int:
    return int(os.path.basename(path).split(".")[0])


@needs_hosts
def test_eviction_keeps_the_active_segment_and_frees_the_oldest_copies(two_hosts):
    store, hb = two_hosts
    t = store.topic("t")
    hb.run("write", start=0, batches=20)
    want = expected([(0, 20 * ROWS)])
    st = t.state()
    # tier 1 is 2 MiB and storage.migrate.threshold 0.5 by default: nothing to evict.
    r = hb.run("evict")
    assert r["evicted"]["copies"] == 0 and r["after"] == r["before"]
    # A threshold of 5% (about 105 KB) forces copies out, oldest first.
    hb_conf = {"storage.migrate.threshold": 0.05}
    r = hb.run_with(hb_conf, "evict")
    ev = r["evicted"]
    before, after = set(r["before"]), set(r["after"])
    gone = before - after
    print(f"eviction on hb: {len(before)} files before, {len(after)} after, "
          f"{ev['copies']} copies ({ev['copy_bytes']} bytes) released; used {ev['used']} of "
          f"{ev['limit']}")
    assert ev["copies"] == len(gone) > 0
    assert ev["used"] <= ev["limit"] or all(
        _seq(f) == r["actives"][f.split("/")[1]][0] for f in after)
    # Never the active segment of a partition.
    for p, (seq, tier) in r["actives"].items():
        assert tier == 1 and any(f"t/{p}/" in f and _seq(f) == seq for f in after)
    # Oldest first: every copy released is older than every copy kept (but the actives).
    actives = {seq for seq, _ in r["actives"].values()}
    last = {s.seq: s.last_ts for s in st.segments.values()}
    kept = [last[_seq(f)] for f in after if _seq(f) not in actives]
    if kept:
        assert max(last[_seq(f)] for f in gone) <= min(kept)
    # Reads on hb stay exact: the evicted chunks come from their bundles.
    on_b = hb.run("read")
    assert (on_b["rows"], on_b["sum"]) == want
    assert on_b["counts"]["remote_chunks"] > 0 and on_b["counts"]["local_chunks"] > 0
    assert tally(t) == want


@needs_hosts
def test_compacted_copies_go_after_the_grace_period_by_pafka_migrate_local(two_hosts):
    from migration import MigrationService
    from tier_store import Store
    store, hb = two_hosts
    t = store.topic("t")
    end = write(t, 0, 1)
    hb.run("write", start=end, batches=12)
    want = expected([(0, end + 12 * ROWS)])
    files = hb.run("read-files")["files"]
    aged = Store.open(store.root, {"log.segment.ms": 1}, create=False)
    try:
        time.sleep(0.4)
        done = MigrationService(aged).run_once()
    finally:
        aged.close()
    assert len(done) == len(t.state().segments) and all(
        s.tier == 2 for s in t.state().segments.values())
    time.sleep(GRACE_MS / 1000 + 0.2)
    cli = hb.cli("migrate", store.root, "--local")
    assert cli.returncode == 0, cli.stderr
    assert "released" in cli.stdout and "unreferenced files" in cli.stdout
    released = int(cli.stdout.split("released ")[1].split()[0])
    # All but the files hb's pointers still name (its next append rolls past them).
    left = hb.run("read-files")
    named = {f"t/{p}/{seq:020d}.seg" for p, (seq, _) in left["actives"].items()}
    assert set(left["files"]) == named and released == len(files) - len(named) > 0, \
        (cli.stdout, files, left)
    on_b = hb.run("read")
    assert (on_b["rows"], on_b["sum"]) == want
    assert on_b["counts"]["local_chunks"] == 0
    assert tally(t) == want


def test_evict_local_is_nothing_on_a_local_root(tmp_path):
    from tier_store import Store
    with Store.open(str(tmp_path / "store")) as store:
        assert store.evict_local() is None


def test_pafka_migrate_local_refuses_a_store_that_is_not_shared(tmp_path, capsys):
    from pafka_source.cli.main import main
    from tier_store import Store
    Store.open(str(tmp_path / "store")).close()
    assert main(["migrate", str(tmp_path / "store"), "--local"]) == 1
    assert "not shared by many hosts" in capsys.readouterr().err



@needs_hosts
def test_eviction_while_a_reader_reads_never_changes_a_row(two_hosts, tmp_path):
    from tier_store import Store, read_counts

    from .test_compaction import shared_conf
    store, _ = two_hosts
    t = store.topic("t")
    write(t, 0, 30)
    want = expected([(0, 30 * ROWS)])
    part0 = t.latest_offsets()[0]
    stop, seen, errors = threading.Event(), [], []

    def reader() -> None:
        # Partition 0 read again and again: its copies stay mapped (pinned), so they stay;
        # partition 1's copies are free to go.
        while not stop.is_set():
            try:
                seen.append(sum(b.num_rows for b in t.read(0, 0)))
            except Exception as e:  # noqa: BLE001 (collected, asserted below)
                errors.append(e)

    before = read_counts()
    th = threading.Thread(target=reader)
    th.start()
    try:
        # The same host evicting from another handle, at a threshold of 5%, while reads map
        # its copies: a pinned copy stays until the reader lets go, the rest goes.
        root = store.root
        with Store.open(root, shared_conf(root, str(tmp_path / "t1"),
                                          **{"storage.migrate.threshold": 0.05})) as s:
            freed = 0
            for _ in range(6):
                r = s.evict_local()
                freed += r.copies if r is not None else 0
                time.sleep(0.2)
    finally:
        stop.set()
        th.join(60)
    assert not errors, errors[:3]
    assert seen and all(got == part0 for got in seen), [g for g in seen if g != part0][:3]
    assert freed > 0
    # Reads of what was evicted go to the shared tier, and stay exact.
    assert tally(t) == want
    assert read_counts()["remote_chunks"] > before["remote_chunks"]
