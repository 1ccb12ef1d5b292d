"""The object-store primitive (tier_store/objects.py) on a real radosgw.

Faults the server does not make on demand (a 409, a lost answer, a hang) come from a real TCP
front in this file that sits between the client and radosgw and misbehaves on the first
connections as planned, then forwards bytes unchanged: the client is botocore over real
sockets, and every object is written and read on the real server.
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue
import re
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

from tier_store.errors import ConfigError, InvalidArgument, StoreUnavailable, TopicDeleted
from tier_store.logstore import ObjectLogStore
from tier_store.objects import ObjectStore

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def objects(s3_root) -> ObjectStore:
    return ObjectStore.open(s3_root)


class FaultyFront:
    """A TCP front for ``upstream`` (http://host:port). Each new connection takes the next
    step of ``plan``; once the plan is spent, connections are forwarded unchanged. Steps:
    ``"lose"`` (forward the request, wait for the server's answer, close without passing it
    on), ``"hang"`` (read the request, never answer), or ``(status, code)`` (answer with that
    HTTP status and error code, never forwarding)."""

    def __init__(self, upstream: str, plan: list):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.plan = list(plan)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.server.close()
        for s in self.held:
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            step = self.plan.pop(0) if self.plan else "forward"
            threading.Thread(target=self._serve, args=(conn, step), daemon=True).start()

    def _serve(self, conn: socket.socket, step) -> None:
        if step == "forward":
            up = socket.create_connection(self.upstream)
            threading.Thread(target=_pump, args=(up, conn), daemon=True).start()
            _pump(conn, up)
            return
        head, body, expect = _read_head(conn)
        if step == "hang":
            self.held.append(conn)
            return
        if step == "lose":
            if expect:
                conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = _read_body(conn, head, body)
            with socket.create_connection(self.upstream) as up:
                # Expect is not signed: the server gets the request exactly as sent, whole.
                up.sendall(re.sub(rb"(?im)^expect:[^\r]*\r\n", b"", head) + body)
                answer = b""
                while b"\r\n\r\n" not in answer:  # the server has answered: it is done
                    answer += up.recv(65536)
            conn.close()
            return
        if not expect:
            _read_body(conn, head, body)
        status, code = step  # answered before any body, as a server may
        text = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                "<Message>from the faulty front</Message></Error>").encode()
        conn.sendall(f"HTTP/1.1 {status} Whatever\r\nContent-Type: application/xml\r\n"
                     f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n".encode()
                     + text)
        conn.close()


def _read_head(conn: socket.socket) -> tuple[bytes, bytes, bool]:
    """A request's head (through the blank line), the body bytes read with it, and whether
    it expects a 100 Continue before sending its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    head += b"\r\n\r\n"
    return head, body, re.search(rb"(?im)^expect:\s*100-continue", head) is not None


def _read_body(conn: socket.socket, head: bytes, body: bytes) -> bytes:
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while len(body) < (int(m.group(1)) if m else 0):
        body += conn.recv(65536)
    return body


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def front(s3_root):
    """Make a FaultyFront before the gateway: ``front(plan, **options)`` returns an
    ObjectStore on the same prefix that talks through it."""
    made: list[FaultyFront] = []

    def make(plan: list, **options) -> ObjectStore:
        import os
        f = FaultyFront(os.environ["AWS_ENDPOINT_URL"], plan)
        made.append(f)
        return ObjectStore.open(s3_root, {"endpoint_url": f.url, **options})
    yield make
    for f in made:
        f.close()


# -- conditional puts ----------------------------------------------------------------------------

def test_put_if_absent_creates_once(objects):
    assert objects.put_if_absent("a/0", b"first")
    assert not objects.put_if_absent("a/0", b"second")  # radosgw's own 412
    assert objects.get("a/0") == b"first" and objects.exists("a/0")
    assert objects.get("a/1") is None and not objects.exists("a/1")


def test_a_412_means_taken_whatever_its_body_says(front):
    through = front([(412, "InvalidArgument")])
    assert through.put_if_absent("k", b"mine") is False
    assert through.get("k") is None  # the front answered; nothing was written


def test_a_409_is_retried_for_the_same_key(front, objects):
    through = front([(409, "ConditionalRequestConflict")] * 2)
    assert through.put_if_absent("k", b"mine")
    assert objects.get("k") == b"mine"
    stuck = front([(409, "ConditionalRequestConflict")] * 10, retry_attempts=3)
    with pytest.raises(StoreUnavailable, match=r"/other: PUT failed after 3 attempt\(s\).*409"):
        stuck.put_if_absent("other", b"x")


def test_a_lost_answer_to_our_put_is_recognised_on_retry(front, objects):
    through = front(["lose"])
    assert through.put_if_absent("mine", b"entry 7, written at 12:00:00.123, crc 99")
    assert objects.get("mine") == b"entry 7, written at 12:00:00.123, crc 99"
    # Taken by someone else before our lost attempt: their bytes differ, the key is theirs.
    assert objects.put_if_absent("theirs", b"their entry")
    through = front(["lose"])
    assert through.put_if_absent("theirs", b"our entry") is False
    assert objects.get("theirs") == b"their entry"


def test_sixteen_processes_racing_have_one_winner_per_round(s3_root):
    n, rounds = 16, 50
    barrier, results = FORK.Barrier(n), FORK.Queue()

    def race(i: int) -> None:
        store = ObjectStore.open(s3_root)
        for r in range(rounds):
            barrier.wait(60)
            results.put((r, i, store.put_if_absent(f"race/{r:04d}", f"writer {i}".encode())))
    procs = [FORK.Process(target=race, args=(i,)) for i in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range(n * rounds)]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    store = ObjectStore.open(s3_root)
    for r in range(rounds):
        winners = [i for rr, i, won in got if rr == r and won]
        assert len(winners) == 1, (r, winners)
        assert store.get(f"race/{r:04d}") == f"writer {winners[0]}".encode()
    assert len(store.list("race")) == rounds


# -- outages -------------------------------------------------------------------------------------

def test_an_unreachable_store_fails_in_bounded_time_naming_bucket_and_key(s3_root):
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = closed.getsockname()[1]
    store = ObjectStore.open(s3_root, {"endpoint_url": f"http://127.0.0.1:{port}",
                                       "retry_attempts": 4, "retry_max_seconds": 5})
    for call, verb in ((lambda: store.put_if_absent("log/00.json", b"x"), "PUT"),
                       (lambda: store.get("log/00.json"), "GET"),
                       (lambda: store.list("log"), "LIST")):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as e:
            call()
        assert time.monotonic() - started < 5
        said = str(e.value)
        assert store.bucket in said and "log" in said and verb in said, said
        assert "after 4 attempt(s)" in said and "EndpointConnectionError" in said, said
    closed.close()


def test_a_server_that_never_answers_fails_within_the_budget(front):
    through = front(["hang"] * 5, retry_attempts=8, retry_max_seconds=2)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"k: PUT failed .*ReadTimeoutError"):
        through.put_if_absent("k", b"x")
    assert time.monotonic() - started < 6


def test_the_gateway_stopping_mid_commit_lands_once_or_not_at_all(s3_own_server, s3_own_root):
    store = ObjectStore.open(s3_own_root, {"retry_attempts": 5, "retry_max_seconds": 3})
    done: list[str] = []
    failed: queue.Queue = queue.Queue()

    def write() -> None:
        for n in range(100_000):
            key = f"log/{n:08d}.json"
            try:
                assert store.put_if_absent(key, f"entry {n} {uuid.uuid4()}".encode() * 50)
            except StoreUnavailable as e:
                failed.put((key, e, time.monotonic()))
                return
            done.append(key)
    writer = threading.Thread(target=write)
    writer.start()
    while len(done) < 20:
        time.sleep(0.01)
    stopped = time.monotonic()
    s3_own_server.stop_gateway()
    key, error, when = failed.get(timeout=30)
    writer.join()
    assert when - stopped < 10
    assert store.bucket in str(error) and key in str(error), error
    s3_own_server.start_gateway()
    listed = [o.key for o in store.list("log")]
    assert listed[:len(done)] == done  # every put that returned is there
    assert listed[len(done):] in ([], [key])  # the one cut off: landed whole, or not at all
    for k in listed:
        assert store.get(k).startswith(f"entry {int(k[4:12])} ".encode())


# -- configuration -------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["memory://root", "gcs://b/p", "file:///tmp/x", "/tmp/x",
                                 "s3a://bkt/p", "s3://", "s3://b/p", "s3://bkt/../p",
                                 "s3://bkt//p"])
def test_unsupported_roots_are_refused(url):
    with pytest.raises(ConfigError, match=re.escape(repr(url))):
        ObjectStore.open(url)


@pytest.mark.parametrize("options", [
    {"key": "AKIA"}, {"secret": "s"}, {"token": "t"}, {"password": "p"},
    {"client_kwargs": {"aws_secret_access_key": "s"}},
    {"client_kwargs": {"aws_access_key_id": "a"}}, {"config_kwargs": {"session_token": "t"}},
])
def test_credentials_in_options_are_refused(options):
    with pytest.raises(ConfigError, match="looks like a credential.*AWS_ACCESS_KEY_ID"):
        ObjectStore.open("s3://bkt/p", options)


def test_unknown_or_malformed_options_are_refused():
    with pytest.raises(ConfigError, match="unknown object store option.*'regoin'"):
        ObjectStore.open("s3://bkt/p", {"regoin": "x"})
    with pytest.raises(ConfigError, match="'retry_attempts' must be a positive number"):
        ObjectStore.open("s3://bkt/p", {"retry_attempts": 0})
    with pytest.raises(ConfigError, match="must be a JSON object"):
        ObjectStore.open("s3://bkt/p", ["endpoint_url"])  # type: ignore[arg-type]


def test_keys_are_checked(objects):
    for bad in ("", "/a", "a/", "a//b", "a/../b", "."):
        with pytest.raises(InvalidArgument, match="not a relative object key"):
            objects.put_if_absent(bad, b"x")
    with pytest.raises(InvalidArgument):
        objects.child("..")


def test_access_refused_is_not_retried(s3_root, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    store = ObjectStore.open(s3_root, {"retry_attempts": 8, "retry_max_seconds": 20})
    started = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"refused PUT .*HTTP 403 .*credentials"):
        store.put_if_absent("k", b"x")
    assert time.monotonic() - started < 8  # retried, it would take the 20 s budget


# -- listing, deleting, handles ------------------------------------------------------------------

def test_list_prefixes_and_delete(objects):
    for key in ("t1/_log/02.json", "t1/_log/01.json", "t1/_topic.json", "t2/_topic.json",
                "_store/00.json"):
        objects.put(key, key.encode())
    assert [o.key for o in objects.list("t1")] == \
        ["t1/_log/01.json", "t1/_log/02.json", "t1/_topic.json"]
    assert [o.key for o in objects.list("t1/_log", start_after="t1/_log/01.json")] == \
        ["t1/_log/02.json"]
    assert objects.prefixes() == ["_store", "t1", "t2"]
    assert objects.prefixes("t1") == ["_log"]
    child = objects.child("t1/_log")
    assert child.url == objects.url + "/t1/_log" and child.get("01.json") == b"t1/_log/01.json"
    assert child.where("01.json") == objects.where("t1/_log/01.json")
    assert objects.delete(["t1/_log/01.json", "nope"]) == 2  # missing keys are fine
    assert objects.delete([o.key for o in objects.list()], ordered=False) == 4
    assert objects.list() == [] and objects.prefixes() == []


def test_a_store_is_picklable_and_reopens_in_a_child(objects):
    objects.put("k", b"v")
    copy = pickle.loads(pickle.dumps(objects))
    assert copy.url == objects.url and copy.get("k") == b"v"

    def child() -> None:
        import sys
        sys.exit(0 if copy.put_if_absent("from-child", b"c") else 1)
    p = FORK.Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 0 and objects.get("from-child") == b"c"


# -- the commit log on it ------------------------------------------------------------------------

def test_the_log_rechecks_its_incarnation_at_most_every_recheck_seconds(objects):
    alive = [True]

    def check() -> bool:
        calls.append(time.monotonic())
        if not alive[0]:
            raise TopicDeleted("topic 't' was deleted")
        return True
    calls: list[float] = []
    # A window of 3 s: a loaded machine's first requests to a fresh server can take 0.5 s.
    log = ObjectLogStore(objects.child("t/_log"), "t", check, recheck_seconds=3.0)
    log.check_incarnation()
    log.check_incarnation()
    assert len(calls) == 1  # reads reuse a recent pass
    assert log.put_if_absent(0, b"e0") and len(calls) == 1  # so do puts
    alive[0] = False
    log.check_incarnation()  # within the window: the pass is reused
    assert log.put_if_absent(1, b"e1")  # as if just before the deletion (nobody reads it)
    time.sleep(3.1)
    with pytest.raises(TopicDeleted):
        log.put_if_absent(2, b"e2")  # the window passed: asked again
    with pytest.raises(TopicDeleted):
        log.check_incarnation()  # deleted once, deleted for good
    assert log.read(2) is None


def test_the_hint_is_markers_and_old_ones_are_deleted(objects):
    log = ObjectLogStore(objects.child("t/_log"), "t")
    for v in (2, 4, 6, 8, 10):
        assert log.write_checkpoint(v, f"c{v}".encode())
        log.advance_checkpoint_hint(v)
    assert log.last_checkpoint_hint() == 10
    markers = [o.key for o in objects.list("t/_log/_last_checkpoint")]
    assert len(markers) <= 4 and markers[-1].endswith(f"{10:020d}")
    assert log.checkpoints() == [2, 4, 6, 8, 10] and log.versions() == []
    assert log.discard_temporaries(time.time() + 1) == 0
