"""A model's identity: what "embedded with the same model" means to incremental runs and indexes.

The artifact's identity, then the preprocessing that changes its vectors, `;name=value` each:

    builtin:<name>@<BUILTIN_WEIGHTS>   the seeded builtin networks (their weights change only with it)
    s3etag:<ETag>[@<version id>]       an s3:// model object: S3's ETag, and its version id when the
                                       bucket is versioned (a re-upload of other bytes changes both)
    sha256:<hex>                       a local model file (local mode): the hash of its bytes

    ;image_size=<n>                    image and video: the input side the worker resizes to (a file's
                                       sidecar spec fixes it when it has one, else the model's image_size)
    ;chunk_tokens=<n|default>;overlap_tokens=<n|default>
                                       text: the window (default: the model's own, which its artifact fixes)
    ;frames_per_second=<f|default> or ;frames_per_video=<n>
                                       video: the frame sampling
    ;window_s=<f|default>;hop_s=<f|default>
                                       audio: the windows (default: the model's own, which its artifact fixes)
    ;pipeline=<digest>                 image and video: the sidecar's image pipeline (`preprocess`, written by
                                       `sluice model export`), when it has one

e.g. builtin:reference-cnn@1;image_size=128. Resolved once, when the run is planned, and written
into the plan (PlannedModel.model_id); every output record carries it, an incremental run skips
a key only when an earlier record has this run's model_id, and an index table holds one model_id.
Ids written before the preprocessing was part of them (no `;`) match no new one: such keys are
embedded again. Torch-free: the manifest Lambda resolves it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import classify, translate
from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.identity import preprocessing, static_id
from sluice.contracts.sections import ContentSpec, ModelSpec

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


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


def identity(spec: ModelSpec, content: ContentSpec, s3: S3Client | None = None) -> str:
    """The model_id a run records for `spec`: its artifact (`resolve`) and the preprocessing the worker uses."""
    if content.kind in ("text", "audio"):  # the artifact fixes the rest (its tokenizer, its sample rate)
        return resolve(spec.uri, s3) + preprocessing(content.kind, spec.image_size, content)
    sidecar = read_sidecar(spec.uri, s3)
    size = _image_size(sidecar) or spec.image_size
    return resolve(spec.uri, s3) + preprocessing(content.kind, size, content) + pipeline(sidecar)


def pipeline(sidecar: Mapping[str, Any] | None) -> str:
    """`;pipeline=<digest>` of a sidecar's image pipeline (`preprocess`): a sidecar edited beside the
    same file changes the vectors, so it changes the id; "" without one (legacy ids unchanged)."""
    prep = (sidecar or {}).get("preprocess")
    if not isinstance(prep, dict):
        return ""
    return ";pipeline=" + hashlib.sha256(json.dumps(prep, sort_keys=True).encode()).hexdigest()[:12]


def read_sidecar(uri: str, s3: S3Client | None) -> dict[str, Any] | None:
    """A model file's sidecar spec (`<file>.json`, written by `sluice model export`); None when there is none.

    A transient S3 failure raises RetriableError (the caller decides: the coordinator retries the upload).
    """
    if uri.startswith("builtin:"):
        return None
    try:
        if uri.startswith("s3://"):
            if s3 is None:
                return None
            bucket, key = parse_s3_uri(uri + ".json")
            raw = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        else:
            with open(uri + ".json", "rb") as fh:
                raw = fh.read()
        spec = json.loads(raw)
    except (ClientError, BotoCoreError) as exc:
        if classify(exc).retriable:
            raise translate(exc, f"GET {uri}.json") from exc
        return None  # no sidecar, or none this role may read
    except (OSError, ValueError):
        return None
    return spec if isinstance(spec, dict) else None


def _image_size(spec: Mapping[str, Any] | None) -> int | None:
    size = spec.get("image_size") if spec else None
    return size if isinstance(size, int) and not isinstance(size, bool) else None
