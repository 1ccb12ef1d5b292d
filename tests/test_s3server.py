"""The S3 test server (Ceph radosgw) and the property the shared commit log rests on.

An object-store commit publishes entry N with ``PUT`` + ``If-None-Match: *``: among writers
racing for one key, exactly one gets 200 and every other one 412 — the server decides, with no
check-then-write window. Measured here on radosgw with real processes, through boto3 directly
(this tests the server, not the store).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

log = logging.getLogger(__name__)

WRITERS = 16
# Not from conftest: each spawned writer imports this module, and conftest imports pyarrow.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def race_writer(env: dict[str, str], bucket: str, prefix: str, writer: int, rounds: int,
                barrier, results) -> None:
    """One racing process: each round, wait for all writers, then PUT-if-absent the round's key
    with a body naming this writer; report (round, HTTP status, 409 retries)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          config=Config(retries={"max_attempts": 1}))
    out = []
    barrier.wait(timeout=120)  # every writer has started and imported boto3
    started = time.time()
    for r in range(rounds):
        barrier.wait(timeout=60)
        conflicts = 0
        while True:
            try:
                client.put_object(Bucket=bucket, Key=f"{prefix}/{r:05d}", IfNoneMatch="*",
                                  Body=f"writer {writer} round {r}".encode())
                status = 200
            except ClientError as e:
                status = e.response["ResponseMetadata"]["HTTPStatusCode"]
            if status != 409:  # a conditional write in progress: the same key again
                break
            conflicts += 1
            time.sleep(0.01)
        out.append((r, status, conflicts))
    results.put((writer, (out, started, time.time())))


def race(server, writers: int, rounds: int) -> dict[str, float]:
    """Run the race; assert exactly one winner per round whose body is the stored one."""
    bucket = server.new_bucket("race")
    prefix = uuid.uuid4().hex[:8]
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=race_writer, args=(server.env, bucket, prefix, w, rounds,
                                                   barrier, results)) for w in range(writers)]
    for p in procs:
        p.start()
    try:
        outcomes = dict(results.get(timeout=120 + rounds) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    elapsed = max(end for _, _, end in outcomes.values()) - min(
        start for _, start, _ in outcomes.values())
    client = server.client()
    winners: dict[int, list[int]] = {r: [] for r in range(rounds)}
    conflicts = 0
    for w, (out, _, _) in outcomes.items():
        assert [r for r, _, _ in out] == list(range(rounds))
        for r, status, retried in out:
            assert status in (200, 412), f"writer {w} round {r}: HTTP {status}"
            conflicts += retried
            if status == 200:
                winners[r].append(w)
    bad = {r: ws for r, ws in winners.items() if len(ws) != 1}
    assert not bad, f"rounds without exactly one winner (round: winners): {bad}"
    for r, (w,) in winners.items():
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{r:05d}")["Body"].read()
        assert body == f"writer {w} round {r}".encode(), f"round {r}: the winner's body is lost"
    figures = {"writers": writers, "rounds": rounds, "seconds": round(elapsed, 1),
               "puts_per_s": round(writers * rounds / elapsed), "409_retries": conflicts}
    log.info("If-None-Match race on radosgw: %s", figures)
    return figures


def test_racing_conditional_puts_have_exactly_one_winner_per_key(s3_server):
    race(s3_server, WRITERS, rounds=50)


@pytest.mark.s3_full
def test_racing_conditional_puts_have_exactly_one_winner_per_key_500_rounds(s3_server):
    race(s3_server, WRITERS, rounds=500)


def test_s3_root_is_a_fresh_prefix_reachable_through_the_aws_variables(s3_root):
    import s3fs
    assert s3_root.startswith("s3://")
    fs = s3fs.S3FileSystem(skip_instance_cache=True)  # endpoint and keys from the environment
    path = s3_root.removeprefix("s3://")
    assert fs.find(path) == []
    fs.pipe_file(f"{path}/a", b"1", mode="create")
    with pytest.raises(OSError):  # s3fs's rendering of the 412
        fs.pipe_file(f"{path}/a", b"2", mode="create")
    assert fs.cat_file(f"{path}/a") == b"1"


def test_a_stopped_gateway_refuses_connections_until_it_is_started_again(s3_own_server,
                                                                         s3_own_root):
    from botocore.exceptions import EndpointConnectionError
    client = s3_own_server.client(connect_timeout=1, retries={"max_attempts": 1})
    bucket, prefix = s3_own_root.removeprefix("s3://").split("/", 1)
    s3_own_server.stop_gateway()
    try:
        with pytest.raises(EndpointConnectionError):
            client.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"x")
    finally:
        t0 = time.monotonic()
        s3_own_server.start_gateway()
    log.info("radosgw restarted in %.1f s", time.monotonic() - t0)
    client.put_object(Bucket=bucket, Key=f"{prefix}/k", Body=b"x")  # the bucket outlived it
    assert client.get_object(Bucket=bucket, Key=f"{prefix}/k")["Body"].read() == b"x"


def daemons_of(base: str) -> list[int]:
    conf = os.path.join(base, "ceph.conf").encode()
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if conf in f.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


@pytest.mark.s3_full
def test_a_cluster_dies_with_the_process_that_started_it_even_on_sigkill(s3_server):
    """No daemon outlives a test run killed with SIGKILL (the watchdog's pipe closes)."""
    base = f"/tmp/pafka-ceph-{uuid.uuid4().hex[:8]}"
    code = ("import sys, time; from tests.s3server import S3Server\n"
            f"S3Server.start({base!r}); print('up', flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        assert len(daemons_of(base)) >= 3
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 10
        while daemons_of(base) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemons_of(base) == []
    finally:
        for pid in daemons_of(base):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", base], check=False)
