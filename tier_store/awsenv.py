"""The AWS environment a process's S3 clients are made from, as one digest: clients and
filesystems are cached per digest, so a process whose AWS variables change (another
endpoint, other keys) never reaches the server they named before."""

from __future__ import annotations

import hashlib
import os

_AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                  "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION",
                  "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")


def aws_environment() -> str:
    """A digest of the AWS variables a client is made from (no secret is kept in clear)."""
    text = "\0".join(os.environ.get(k, "") for k in _AWS_VARIABLES)
    return hashlib.sha256(text.encode()).hexdigest()


def delta_storage_options() -> dict[str, str]:
    """delta-rs's options for an S3 lake: its keys and endpoint from the same variables, and
    commits by conditional put (an object store without it could lose a commit to a race)."""
    opts = {"conditional_put": "etag"}
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        opts["region"] = region
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["endpoint"] = endpoint
        if endpoint.startswith("http://"):
            opts["allow_http"] = "true"
    return opts


__all__ = ["aws_environment", "delta_storage_options"]
