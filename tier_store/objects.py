"""Keys under one ``s3://bucket/prefix``, with an atomic put-if-absent: the primitive that the
commit log and the root's state use on an object store.

:meth:`ObjectStore.put_if_absent` is a ``PUT`` with ``If-None-Match: *``; the server makes
the key at most once. The HTTP status decides, never the error body (s3fs turns a 412 into
``OSError(EINVAL)``, so the client here is botocore's, called directly):

* 200: created. 412: the key was taken. 409: a concurrent conditional write was in
  progress: the same key is tried again after a backoff.
* Connection errors, timeouts, 5xx and throttling: tried again with exponential backoff and
  jitter, within a budget of attempts and seconds (the options ``retry_attempts``, default
  8, and ``retry_max_seconds``, default 20); then :class:`~tier_store.errors.StoreUnavailable`
  naming the bucket, the key and the last failure.
* An attempt whose outcome is unknown (the request was sent, the answer lost) followed by a
  412: the object is read back; the same bytes mean the lost attempt created it (True). The
  callers' bytes are unique to one writer (entries carry a checksum over their content and a
  timestamp), so another writer's object never matches by chance.
* A quota exceeded is :class:`~tier_store.errors.StoreFull`; access denied, no such bucket
  and other refusals are :class:`~tier_store.errors.StoreUnavailable` at once (no retry).

Options (the store key ``storage.root.options``) follow s3fs's names (:data:`OPTIONS`).
Credentials are refused there: botocore reads them from the standard AWS environment
variables and config files (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``...).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from .awsenv import aws_environment
from .errors import ConfigError, InvalidArgument, StoreFull, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

OPTIONS = frozenset({"endpoint_url", "client_kwargs", "config_kwargs", "use_ssl", "anon",
                     "profile", "s3_additional_kwargs", "retry_attempts",
                     "retry_max_seconds"})
_CREDENTIAL = re.compile(r"secret|token|passw|credential|access_?key|customer_?key|^key$"
                         r"|^username$|^user$", re.IGNORECASE)
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_THROTTLED = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                        "RequestTimeTooSkewed", "ServiceUnavailable", "InternalError"})
_QUOTA = frozenset({"QuotaExceeded", "UserQuotaExceeded", "BucketQuotaExceeded"})
_BACKOFF_FIRST, _BACKOFF_CAP = 0.05, 2.0


class ObjectInfo(NamedTuple):
    """A listed object."""

    key: str  # relative to the store's prefix
    size: int
    mtime: float  # last modified, by the server's clock (seconds since the epoch)


def check_options(where: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` as a dict, or :class:`ConfigError` naming ``where`` and the bad option:
    unknown names, and anything that looks like a credential (at any depth)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{where}: the object store options must be a JSON object, not "
                          f"{type(options).__name__}")

    def walk(d: Mapping[str, Any], path: str) -> None:
        for name, value in d.items():
            if _CREDENTIAL.search(str(name)):
                raise ConfigError(
                    f"{where}: option {path}{name!r} looks like a credential; credentials "
                    "are never taken from options (they would show in configurations and "
                    "logs): set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
                    "~/.aws/credentials instead")
            if isinstance(value, Mapping):
                walk(value, f"{path}{name}.")
    walk(options, "")
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ConfigError(f"{where}: unknown object store option(s) {unknown}; supported: "
                          f"{sorted(OPTIONS)}")
    for name in ("retry_attempts", "retry_max_seconds"):
        value = options.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{where}: option {name!r} must be a positive number, not "
                              f"{value!r}")
    for name in ("client_kwargs", "config_kwargs", "s3_additional_kwargs"):
        if not isinstance(options.get(name, {}), Mapping):
            raise ConfigError(f"{where}: option {name!r} must be a JSON object")
    return dict(options)


def _check_key(where: str, key: object, what: str = "key") -> str:
    if not isinstance(key, str) or any(p in ("", ".", "..") for p in key.split("/")) \
            or any(ord(c) < 32 for c in key):
        raise InvalidArgument(f"{where}: {what} {key!r} is not a relative object key "
                              "(non-empty names separated by '/', no '.' or '..')")
    return key


# One botocore client per process, options and AWS environment: cheap to open many stores,
# never a connection pool inherited through fork, and never a server the environment no
# longer names.
_clients: dict[tuple[int, str, str], Any] = {}
_clients_lock = threading.Lock()
def _client(options: Mapping[str, Any]) -> Any:
    ident = (os.getpid(), json.dumps(options, sort_keys=True, default=str), aws_environment())
    with _clients_lock:
        if ident not in _clients:
            _clients[ident] = _make_client(options)
        return _clients[ident]


def _make_client(options: Mapping[str, Any]) -> Any:
    import botocore.session
    from botocore import UNSIGNED
    from botocore.config import Config

    budget = float(options.get("retry_max_seconds", 20))
    config = {"connect_timeout": min(5.0, budget), "read_timeout": min(15.0, budget),
              "max_pool_connections": 32,
              # Retries are ours (they must see each status); checksums only where the
              # API requires them (entries and checkpoints carry their own).
              "retries": {"total_max_attempts": 1},
              "request_checksum_calculation": "when_required",
              "response_checksum_validation": "when_required"}
    config.update(options.get("config_kwargs", {}))
    if options.get("anon"):
        config["signature_version"] = UNSIGNED
    kwargs = dict(options.get("client_kwargs", {}))
    if "endpoint_url" in options:
        kwargs["endpoint_url"] = options["endpoint_url"]
    if "use_ssl" in options:
        kwargs.setdefault("use_ssl", bool(options["use_ssl"]))
    session = botocore.session.Session(profile=options.get("profile"))
    client = session.create_client("s3", config=Config(**config), **kwargs)
    client.meta.events.register("before-call.s3.PutObject", _small_puts_send_at_once)
    return client


def _small_puts_send_at_once(params: dict[str, Any], **_: Any) -> None:
    """No ``Expect: 100-continue`` on puts under 1 MiB: it costs a round trip (a fifth of
    a commit's latency on loopback); a large checkpoint still waits for the go-ahead."""
    from botocore.utils import determine_content_length
    size = determine_content_length(params.get("body"))
    if size is not None and size < 2**20:
        params["headers"].pop("Expect", None)


class _Budget:
    """Attempts of one request: backoff between them, StoreUnavailable when spent."""

    def __init__(self, store: ObjectStore, verb: str, key: str):
        self.store, self.verb, self.key = store, verb, key
        self.attempts, self.start = 0, time.monotonic()

    def retry(self, error: Exception) -> None:
        """Sleep before the next attempt, or raise StoreUnavailable if none is left."""
        self.attempts += 1
        delay = min(_BACKOFF_CAP, _BACKOFF_FIRST * 2 ** (self.attempts - 1))
        delay *= random.uniform(0.5, 1.0)  # jitter: racing writers do not retry in step
        spent = time.monotonic() - self.start
        if self.attempts >= self.store.retry_attempts \
                or spent + delay > self.store.retry_max_seconds:
            raise StoreUnavailable(
                f"the object store did not answer: {self.store.where(self.key)}: "
                f"{self.verb} failed after {self.attempts} attempt(s) over {spent:.1f} s: "
                f"{_describe(error)}") from error
        log.info("%s %s: %s; attempt %d again in %.2f s", self.verb,
                 self.store.where(self.key), _describe(error), self.attempts + 1, delay)
        time.sleep(delay)


def _status(e: Exception) -> tuple[int, str]:
    response = getattr(e, "response", None) or {}
    return (int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0),
            str(response.get("Error", {}).get("Code", "")))


def _describe(e: Exception) -> str:
    status, code = _status(e)
    if status:
        return f"HTTP {status} {code}".rstrip()
    return f"{type(e).__name__}: {e}"


class ObjectStore:
    """Keys under one s3:// prefix, with atomic put-if-absent. Safe to share between
    threads; picklable (a child process opens its own connections)."""

    url: str  # "s3://bucket/prefix", no trailing slash
    bucket: str

    def __init__(self, bucket: str, prefix: str, options: dict[str, Any]):
        """Use :meth:`open`."""
        self.bucket, self.prefix, self.options = bucket, prefix, options
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._base = prefix + "/" if prefix else ""
        self.retry_attempts = int(options.get("retry_attempts", 8))
        self.retry_max_seconds = float(options.get("retry_max_seconds", 20))
        self._extra = dict(options.get("s3_additional_kwargs", {}))
        self._client_options = {k: v for k, v in options.items()
                                if k not in ("retry_attempts", "s3_additional_kwargs")}

    @classmethod
    def open(cls, url: str, options: Mapping[str, Any] | None = None) -> ObjectStore:
        """The store at ``url`` (``s3://bucket`` or ``s3://bucket/prefix``). ``options``:
        see the module. Nothing is contacted until the first request."""
        if not isinstance(url, str) or not url.startswith("s3://"):
            scheme = url.split("://", 1)[0] + "://" if isinstance(url, str) and "://" in url \
                else "a path"
            raise ConfigError(f"object store {url!r}: {scheme} is not supported; only "
                              "s3://bucket/prefix URLs are (an object store with atomic "
                              "conditional writes)")
        bucket, _, prefix = url[len("s3://"):].partition("/")
        if not _BUCKET.match(bucket):
            raise ConfigError(f"object store {url!r}: {bucket!r} is not a bucket name")
        prefix = prefix.rstrip("/")
        if prefix and any(p in ("", ".", "..") or not p.isprintable() for p in prefix.split("/")):
            raise ConfigError(f"object store {url!r}: prefix {prefix!r} is not a relative key")
        return cls(bucket, prefix, check_options(f"object store {url!r}", options))

    def __reduce__(self) -> tuple[Callable[..., ObjectStore], tuple[str, dict[str, Any]]]:
        return ObjectStore.open, (self.url, self.options)

    def __repr__(self) -> str:
        return f"ObjectStore({self.url!r})"

    def child(self, sub: str) -> ObjectStore:
        """The store under ``prefix/sub``, with the same options and connections."""
        _check_key(self.url, sub, "sub-prefix")
        return ObjectStore(self.bucket, self._base + sub, self.options)

    def where(self, key: str) -> str:
        """``s3://bucket/prefix/key``, for messages."""
        return f"{self.url}/{key}" if key else self.url

    @property
    def _s3(self) -> Any:
        return _client(self._client_options)

    def _full_key(self, key: str) -> str:
        return self._base + _check_key(self.url, key)

    # -- writes -----------------------------------------------------------------------------
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` iff it does not exist: True if this call created it,
        False if it was taken (see the module for retries and lost answers)."""
        full, body = self._full_key(key), bytes(data)
        budget = _Budget(self, "PUT", key)
        unknown = False  # an earlier attempt may have created it
        while True:
            try:
                self._s3.put_object(Bucket=self.bucket, Key=full, Body=body, IfNoneMatch="*",
                                    **self._extra)
                return True
            except Exception as e:
                status, _ = _status(e)
                if status == 412:
                    return unknown and self.get(key) == body
                unknown = self._retry_or_raise(e, budget) or unknown

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` unconditionally (last writer wins; for hints only)."""
        full, body = self._full_key(key), bytes(data)
        self._retrying("PUT", key, lambda: self._s3.put_object(
            Bucket=self.bucket, Key=full, Body=body, **self._extra))

    def delete(self, keys: Iterable[str], ordered: bool = True) -> int:
        """Delete ``keys`` (missing ones are fine); returns how many were asked for. In the
        order given, one request each, unless not ``ordered`` (then in batches of 1000)."""
        fulls = [self._full_key(k) for k in keys]
        if ordered:
            for full in fulls:
                self._retrying("DELETE", full[len(self._base):], lambda f=full:
                               self._s3.delete_object(Bucket=self.bucket, Key=f))
            return len(fulls)
        for i in range(0, len(fulls), 1000):
            batch = {"Objects": [{"Key": f} for f in fulls[i:i + 1000]], "Quiet": True}
            out = self._retrying("DELETE", fulls[i][len(self._base):], lambda b=batch:
                                 self._s3.delete_objects(Bucket=self.bucket, Delete=b))
            for err in out.get("Errors", ())[:1]:
                raise StoreUnavailable(f"the object store refused to delete s3://{self.bucket}"
                                       f"/{err.get('Key')}: {err.get('Code')} "
                                       f"({len(out['Errors'])} key(s) in all)")
        return len(fulls)

    # -- reads ------------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The bytes of ``key``; None if there is no such key."""
        full = self._full_key(key)

        def once() -> bytes | None:
            try:
                out = self._s3.get_object(Bucket=self.bucket, Key=full)
            except Exception as e:
                if _status(e) == (404, "NoSuchKey"):
                    return None
                raise
            return out["Body"].read()  # a cut-off body raises: retried with the request
        return self._retrying("GET", key, once)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists (a HEAD request)."""
        full = self._full_key(key)

        def once() -> bool:
            try:
                self._s3.head_object(Bucket=self.bucket, Key=full)
                return True
            except Exception as e:
                if _status(e)[0] == 404:
                    return False
                raise
        return self._retrying("HEAD", key, once)

    def list(self, sub: str = "", start_after: str | None = None) -> list[ObjectInfo]:
        """Every key under ``sub`` (all if empty), at any depth, sorted, keys relative to
        this store's prefix; only those after ``start_after`` (a relative key) if given."""
        prefix = self._base + (_check_key(self.url, sub, "sub-prefix") + "/" if sub else "")
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix}
        if start_after:
            kwargs["StartAfter"] = self._base + start_after
        found: list[ObjectInfo] = []
        for page in self._pages(sub, kwargs):
            for o in page.get("Contents", ()):
                found.append(ObjectInfo(o["Key"][len(self._base):], int(o["Size"]),
                                        o["LastModified"].timestamp()))
        return found

    def prefixes(self, sub: str = "") -> list[str]:
        """The names of the immediate "directories" under ``sub`` (under this store's prefix
        if empty): the next path component of the keys there, sorted, without '/'."""
        prefix = self._base + (_check_key(self.url, sub, "sub-prefix") + "/" if sub else "")
        kwargs = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
        return [p["Prefix"][len(prefix):].rstrip("/")
                for page in self._pages(sub, kwargs) for p in page.get("CommonPrefixes", ())]

    def _pages(self, sub: str, kwargs: dict[str, Any]) -> Iterable[dict[str, Any]]:
        while True:
            page = self._retrying("LIST", sub, lambda k=kwargs: self._s3.list_objects_v2(**k))
            yield page
            if not page.get("IsTruncated"):
                return
            kwargs = {**kwargs, "ContinuationToken": page["NextContinuationToken"]}

    # -- failures ---------------------------------------------------------------------------
    def _retrying(self, verb: str, key: str, once: Callable[[], T]) -> T:
        """``once()``, tried again on transient failures within the budget."""
        budget = _Budget(self, verb, key)
        while True:
            try:
                return once()
            except Exception as e:
                self._retry_or_raise(e, budget)

    def _retry_or_raise(self, e: Exception, budget: _Budget) -> bool:
        """After a failed attempt: back off and return whether the request may have taken
        effect (the answer was lost), or raise what the caller sees."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            NoCredentialsError,
        )
        if isinstance(e, ClientError):
            status, code = _status(e)
            if code in _QUOTA:
                raise StoreFull(f"the object store is full: {self.where(budget.key)}: "
                                f"{budget.verb} refused with {code} (a quota of bucket "
                                f"{self.bucket!r} or its owner): nothing was written; free "
                                "space or raise the quota and try again") from None
            if status == 409 or status >= 500 or code in _THROTTLED or status == 429:
                budget.retry(e)
                return status >= 500 and code not in ("SlowDown", "ServiceUnavailable")
            hint = " (check the bucket name and the AWS credentials in the environment)" \
                if status in (301, 400, 403, 404) else ""
            raise StoreUnavailable(f"the object store refused {budget.verb} "
                                   f"{self.where(budget.key)}: HTTP {status} {code}: "
                                   f"{e.response.get('Error', {}).get('Message', '')}"
                                   f"{hint}") from None
        if isinstance(e, NoCredentialsError):
            raise StoreUnavailable(f"{budget.verb} {self.where(budget.key)}: no AWS "
                                   "credentials found: set AWS_ACCESS_KEY_ID and "
                                   "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE") from None
        if isinstance(e, ConnectionError):  # could not connect: nothing was sent
            budget.retry(e)
            return False
        if isinstance(e, BotoCoreError):  # sent, answer lost or cut off
            budget.retry(e)
            return True
        raise e
