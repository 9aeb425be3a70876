"""A model artifact's identity: what "embedded with the same model" means to incremental runs.

    builtin:<name>@<BUILTIN_WEIGHTS>   the seeded builtin networks (their weights change only with it)
    s3etag:<ETag>[@<version id>]       an s3:// model object: S3's ETag, and its version id when the
                                       bucket is versioned (a re-upload of other bytes changes both)
    sha256:<hex>                       a local model file (local mode): the hash of its bytes

Resolved once, when the run is planned, and written into the plan (PlannedModel.model_id);
every output record carries it, and an incremental run skips a key only when an earlier record
has the model_id of this run's model. Torch-free: the manifest Lambda resolves it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sluice.aws.s3uri import parse_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Bump when a builtin network's construction or seed changes: its earlier embeddings are then stale.
BUILTIN_WEIGHTS = "1"


def static_id(uri: str) -> str:
    """The identity that needs no I/O: exact for builtins, a placeholder naming the uri otherwise."""
    if uri.startswith("builtin:"):
        return f"{uri}@{BUILTIN_WEIGHTS}"
    return f"uri:{uri}"


def file_id(path: str) -> str:
    """sha256:<hex> of a local model file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(2**20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def object_id(head: Mapping[str, Any]) -> str:
    """s3etag:<ETag>[@<version id>] from a HeadObject / GetObject response."""
    etag = str(head.get("ETag", "")).strip('"')
    version = head.get("VersionId")
    return f"s3etag:{etag}" + (f"@{version}" if version and version != "null" else "")


def resolve(uri: str, s3: S3Client | None = None) -> str:
    """The identity of the model at `uri`: HEADs an s3:// object (with `s3`), hashes a local file."""
    if uri.startswith("builtin:"):
        return static_id(uri)
    if uri.startswith("s3://"):
        if s3 is None:
            return static_id(uri)
        bucket, key = parse_s3_uri(uri)
        return object_id(s3.head_object(Bucket=bucket, Key=key))
    return file_id(uri) if os.path.isfile(uri) else static_id(uri)
