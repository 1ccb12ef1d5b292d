"""A store whose root is an ``s3://`` prefix on a real S3 server (Ceph radosgw): topics, writes,
commits, reads, positions, checkpoints and deletions end to end, from several processes; the
root's own files as versions written with put-if-absent; damage and bad roots refused clearly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import boto3
import pyarrow as pa
import pytest

from tier_store import (
    ConfigError,
    CorruptState,
    Store,
    StoreNotFound,
    TopicDeleted,
    TopicExists,
    relocate_tier,
)
from tier_store.ownership.claims import claim_of

from .conftest import ROOT

SCHEMA = pa.schema([("v", pa.int64())])


def _config(tmp_path, **extra):
    return {"storage.tiers.first.paths": str(tmp_path / "tier-1"), **extra}


def _s3(root: str):
    """(boto3 client, bucket, prefix) of ``root``, for planting objects by hand."""
    bucket, _, prefix = root[len("s3://"):].partition("/")
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]), bucket, prefix


def _values(topic) -> list[int]:
    return sorted(v for p in range(topic.partitions)
                  for b in topic.read(p, 0) for v in b.column("v").to_pylist())


def test_store_on_s3_end_to_end(s3_root, tmp_path):
    options = json.dumps({"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    with Store.open(s3_root, _config(tmp_path, **{"storage.root.options": options})) as store:
        assert store.root == s3_root and store.topics() == []
        t = store.create_topic("events", SCHEMA, partitions=2)
        for i in range(6):
            t.append(pa.table({"v": [2 * i, 2 * i + 1]}), partition=i % 2)
        refs = t.write_chunks(pa.table({"v": [100]}), partition=1)
        assert _values(t) == list(range(12))  # written, not committed: invisible
        t.commit(refs)
        assert t.latest_offsets() == {0: 6, 1: 7}
        t.set_position("g", {0: 4, 1: 7})
        assert t.write_checkpoint() == t.version
        with pytest.raises(TopicExists, match="events"):
            store.create_topic("events", SCHEMA)
        assert store.topics() == ["events"]
        # This host's pointers live in tier 1's _host directory, per incarnation.
        assert os.listdir(tmp_path / "tier-1" / "_host" / f"events.{t.id}" / "_partitions")
    # Another open, without any setting: tiers from _store.json, endpoint from the environment.
    with Store.open(s3_root, create=False) as again:
        t2 = again.topic("events")
        assert _values(t2) == [*range(12), 100]
        assert t2.positions() == {"g": {0: 4, 1: 7}}
        assert t2.checkpointed_version == t2.version
        assert Store.exists(s3_root) and Store.identity(s3_root) == (s3_root, again.id)
        assert again.delete_topic("events") == 0
        assert again.topics() == []
        assert not (tmp_path / "tier-1" / "_host" / f"events.{t2.id}").exists()
        t3 = again.create_topic("events", SCHEMA)
        assert t3.id != t2.id and t3.latest_offsets() == {0: 0}
        t3.append(pa.table({"v": [7]}))
        assert _values(again.topic("events")) == [7]
    client, bucket, prefix = _s3(s3_root)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
            .get("Contents", [])]
    assert not [k for k in keys if f"/{t2.id}/" in k]  # the old incarnation's log is gone
    assert f"{prefix}/_store/{0:020d}.json" in keys


def test_missing_store_and_tier_paths(s3_root, tmp_path):
    with pytest.raises(StoreNotFound, match="no pafka store at s3://"):
        Store.open(s3_root, create=False)
    with pytest.raises(ConfigError, match=r"object store.*storage\.tiers\.1\.paths"):
        Store.open(s3_root, {})
    assert not Store.exists(s3_root)


@pytest.mark.parametrize("root", ["memory://x/y", "gcs://bucket/p", "file:///tmp/pafka-x",
                                  "hdfs://nn/p", "s3://"])
def test_unsupported_root_refused(root, tmp_path):
    with pytest.raises(ConfigError, match=r"s3://") as e:
        Store.open(root, _config(tmp_path))
    assert root.split("://")[0] in str(e.value) or "bucket" in str(e.value)
    assert not (tmp_path / "tier-1").exists()


def test_root_options_checked(tmp_path):
    with pytest.raises(ConfigError, match="aws_secret_access_key.*AWS_SECRET_ACCESS_KEY") as e:
        Store.open(str(tmp_path / "s"), {"storage.root.options":
                                         {"aws_secret_access_key": "hunter2"}})
    assert "hunter2" not in str(e.value)
    with pytest.raises(ConfigError, match="s3:// store roots only"):
        Store.open(str(tmp_path / "s"), {"storage.host.dir": str(tmp_path / "h")})


def _commit_worker(root: str, tier: str, start: int, n: int) -> str:
    return textwrap.dedent(f"""
        import pyarrow as pa
        from tier_store import Store
        with Store.open({root!r}, {{"storage.tiers.first.paths": {tier!r}}}) as s:
            t = s.topic("shared")
            for i in range({start}, {start + n}):
                t.append(pa.table({{"v": [i]}}))
    """)


def test_two_processes_commit_to_one_topic(s3_root, tmp_path):
    tier = str(tmp_path / "tier-1")
    with Store.open(s3_root, {"storage.tiers.first.paths": tier}) as store:
        store.create_topic("shared", SCHEMA, partitions=2)
    n = 25
    procs = [subprocess.Popen([sys.executable, "-c", _commit_worker(s3_root, tier, k * 1000, n)],
                              cwd=ROOT, stderr=subprocess.PIPE, text=True) for k in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    with Store.open(s3_root, create=False) as store:
        t = store.topic("shared")
        assert _values(t) == [*range(n), *range(1000, 1000 + n)]  # each once, none lost
        assert t.version == 2 * n  # entry 0 creates; one entry per commit, no gaps
        assert sum(t.latest_offsets().values()) == 2 * n


def test_handles_on_a_deleted_topic_fail(s3_root, tmp_path):
    config = _config(tmp_path)
    with Store.open(s3_root, config) as a, Store.open(s3_root, config) as b:
        old = a.create_topic("t", SCHEMA)
        old.append(pa.table({"v": [1]}))
        refs = old.write_chunks(pa.table({"v": [2]}))
        b.delete_topic("t")
        # A handle may trust its last look at _topic.json for a second (then its commit is
        # refused for its vanished segment instead): past it, the deletion is seen.
        time.sleep(1.2)
        with pytest.raises(TopicDeleted, match="'t'.*deleted"):
            old.commit(refs)
        with pytest.raises(TopicDeleted):
            old.refresh()
        b.create_topic("t", SCHEMA)
        with pytest.raises(TopicDeleted):
            old.append(pa.table({"v": [3]}))
        new = a.topic("t")  # the cached handle is replaced by one on the new incarnation
        assert new.id != old.id and _values(new) == []


def test_topic_created_once_and_a_half_made_one_finished(s3_root, tmp_path):
    config = _config(tmp_path)
    stores = [Store.open(s3_root, config) for _ in range(4)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(stores))

    def create(store: Store) -> None:
        barrier.wait()
        try:
            store.create_topic("once", SCHEMA)
            outcomes.append("created")
        except TopicExists:
            outcomes.append("exists")

    threads = [threading.Thread(target=create, args=(s,)) for s in stores]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(outcomes) == ["created", "exists", "exists", "exists"]
    # A creation that died between _topic.json and entry 0: not a topic, finished by the next.
    client, bucket, prefix = _s3(s3_root)
    half = "ab" * 16
    client.put_object(Bucket=bucket, Key=f"{prefix}/half/_topic.json",
                      Body=json.dumps({"incarnation": half}).encode())
    assert stores[0].topics() == ["once"]
    assert stores[1].create_topic("half", SCHEMA).id == half
    assert stores[0].topics() == ["half", "once"]
    for s in stores:
        s.close()


def test_damaged_topic_marker_is_named(s3_root, tmp_path):
    with Store.open(s3_root, _config(tmp_path)) as store:
        store.create_topic("good", SCHEMA)
        client, bucket, prefix = _s3(s3_root)
        client.put_object(Bucket=bucket, Key=f"{prefix}/bad/_topic.json", Body=b"{not json")
        with pytest.raises(CorruptState, match=rf"{s3_root}/bad/_topic.json is damaged"):
            store.topics()
        with pytest.raises(CorruptState, match="_topic.json is damaged"):
            store.topic("bad")
        client.put_object(Bucket=bucket, Key=f"{prefix}/bad/_topic.json",
                          Body=json.dumps({"incarnation": "../../etc"}).encode())
        with pytest.raises(CorruptState, match="not 32 lowercase hex"):
            store.topic("bad")
        client.delete_object(Bucket=bucket, Key=f"{prefix}/bad/_topic.json")
        assert store.topics() == ["good"]


def test_planted_store_versions_are_named(s3_root, tmp_path):
    Store.open(s3_root, _config(tmp_path)).close()
    client, bucket, prefix = _s3(s3_root)
    planted = f"{prefix}/_store/{7:020d}.json"
    client.put_object(Bucket=bucket, Key=planted, Body=b"[1, 2]")
    with pytest.raises(ConfigError, match=rf"s3://{bucket}/{planted} is damaged"):
        Store.open(s3_root, create=False)
    client.delete_object(Bucket=bucket, Key=planted)
    client.put_object(Bucket=bucket, Key=f"{prefix}/_store/latest", Body=b"{}")
    with pytest.raises(CorruptState, match=r"_store/latest is not a version of _store.json"):
        Store.open(s3_root, create=False)


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_migration_totals_merge_concurrent_writers(kind, request, tmp_path):
    root = str(tmp_path / "store") if kind == "local" else request.getfixturevalue("s3_root")
    store = Store.open(root, _config(tmp_path))
    errors: list[BaseException] = []

    def bump() -> None:
        try:
            for _ in range(8):
                store.update_migration_totals(lambda t: {**t, "runs": t.get("runs", 0) + 1})
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and store.migration_totals() == {"runs": 32}
    if kind == "s3":  # old versions are deleted behind the newest few
        client, bucket, prefix = _s3(root)
        listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/_migration/")
        assert 1 <= listed["KeyCount"] <= 5
    store.close()


def test_resize_and_relocate_on_s3(s3_root, tmp_path):
    store = Store.open(s3_root, _config(tmp_path))
    store.resize_tier(1, "2g")
    with Store.open(s3_root, create=False) as again:
        assert again.tier(1).capacity == 2 << 30
    with pytest.raises(ConfigError, match="cannot be relocated"):
        relocate_tier(s3_root, 1, str(tmp_path / "elsewhere"))
    store.close()


def test_remote_claim_create_is_exclusive_on_s3(s3_root):
    claim = claim_of(2, s3_root + "/tier-2")
    assert claim.create(b'{"store": "a"}') is True
    assert claim.create(b'{"store": "b"}') is False  # a 412, not OSError(EINVAL)
    assert claim.read() == b'{"store": "a"}'
