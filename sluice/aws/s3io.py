"""The run's own objects on S3 (plan, shards, results) by URI: writes and read_if_exists translate AWS errors."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import Kind, classify, translate
from sluice.aws.s3uri import parse_s3_uri


def read_uri(s3: Any, uri: str) -> bytes:
    """The bytes of an s3:// object or a local file; botocore's errors propagate as raised (the caller classifies)."""
    if uri.startswith("s3://"):
        bucket, key = parse_s3_uri(uri)
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    with open(uri, "rb") as fh:
        return fh.read()


def read_if_exists(s3: Any, uri: str) -> bytes | None:
    """The object's bytes, or None when it does not exist; other failures are translated."""
    bucket, key = parse_s3_uri(uri)
    try:
        return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except (ClientError, BotoCoreError) as exc:
        if classify(exc).kind is Kind.NOT_FOUND:
            return None
        raise translate(exc, f"reading {uri}") from exc


def put_object(
    s3: Any, uri: str, data: bytes, content_type: str = "application/octet-stream", tagging: str = ""
) -> None:
    """PUT one of the run's objects; an S3 failure is translated once (sluice.aws.errors)."""
    bucket, key = parse_s3_uri(uri)
    try:
        extra = {"Tagging": tagging} if tagging else {}
        s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type, **extra)
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, f"writing {uri}") from exc
