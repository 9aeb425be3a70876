"""The run's own files (plan, shards, commit markers, output) by URI: s3://bucket/key or a local path.

Writes are atomic: S3 PUTs are all-or-nothing, and a local write goes to a temporary file
that is renamed into place.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_worker.sources.ranged import S3RangeSource
from sluice.aws.s3uri import parse_s3_uri
from sluice.shards import FileSource, RangeSource

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


class RunStore:
    """Object storage by URI; the S3 client is created lazily (control client)."""

    def __init__(self, client: S3Client | None = None) -> None:
        self._client = client

    @property
    def client(self) -> S3Client:
        if self._client is None:
            from gpu_worker.sources.clients import control_client

            self._client = control_client()
        return self._client

    def get(self, uri: str) -> bytes:
        if uri.startswith("s3://"):
            b, k = parse_s3_uri(uri)
            return bytes(self.client.get_object(Bucket=b, Key=k)["Body"].read())
        return Path(uri).read_bytes()

    def put(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        if uri.startswith("s3://"):
            b, k = parse_s3_uri(uri)
            self.client.put_object(Bucket=b, Key=k, Body=data, ContentType=content_type)
            return
        path = Path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def list(self, prefix: str) -> list[str]:
        """URIs of every object under `prefix` (sorted)."""
        if prefix.startswith("s3://"):
            b, k = parse_s3_uri(prefix, allow_empty_key=True)
            out: list[str] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=k):
                out.extend(f"s3://{b}/{o['Key']}" for o in page.get("Contents", []))
            return sorted(out)
        root = Path(prefix)
        if not root.is_dir():
            return []
        return sorted(str(p) for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))

    def delete(self, uri: str) -> None:
        if uri.startswith("s3://"):
            b, k = parse_s3_uri(uri)
            self.client.delete_object(Bucket=b, Key=k)
        else:
            Path(uri).unlink(missing_ok=True)

    def range_source(self, uri: str) -> RangeSource:
        if uri.startswith("s3://"):
            b, k = parse_s3_uri(uri)
            return S3RangeSource(self.client, b, k)
        return FileSource(uri)
