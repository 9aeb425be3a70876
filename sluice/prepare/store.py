"""Where the prepare stage reads and writes: S3 (s3:// URIs) or a local directory, behind one small API.

S3 calls go through a lazily created client (sluice.aws.client) with boto3's standard retries;
a throttled or 5xx call that outlives those is retried here a few more times with backoff, then
raised as RetriableError (the Batch job exits 1 and Batch retries it). Other S3 failures are
AwsFatalError (sluice.awserror). Local writes are atomic (write, then rename), so a killed
worker never leaves half a file under its final name.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sluice.awserror import AwsFailure, Kind, classify, translate
from sluice.errors import AwsFatalError
from sluice.plan import SCRATCH_TAG
from sluice.s3uri import parse_s3_uri

T = TypeVar("T")
S3_CONFIG = Config(retries={"max_attempts": 10, "mode": "standard"}, max_pool_connections=32, user_agent_extra="sluice")
RETRIES = 5  # on top of boto3's: an S3 prefix ramping up answers SlowDown for tens of seconds
CHUNK = 8 * 2**20  # one ranged GET: big enough that request overhead is small, small enough to retry


@dataclass(frozen=True)
class Page:
    """One ListObjectsV2 page: its keys, and whether more pages follow."""

    keys: list[str]
    truncated: bool
    token: str | None


class Store:
    """Bytes by URI: `s3://bucket/key` on S3, anything else a local path."""

    def __init__(self, s3: Any = None, *, backoff_s: float = 0.5, sleep: Callable[[float], None] = time.sleep) -> None:
        self._s3 = s3
        self._backoff_s = backoff_s
        self._sleep = sleep

    @property
    def s3(self) -> Any:
        if self._s3 is None:
            from sluice.aws import client

            self._s3 = client("s3", config=S3_CONFIG, name="prepare")
        return self._s3

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """fn(), retrying transient S3 failures; others are translated once."""
        for attempt in range(RETRIES + 1):
            try:
                return fn()
            except (ClientError, BotoCoreError) as exc:
                if not classify(exc).retriable or attempt == RETRIES:
                    raise translate(exc, what) from exc
                self._sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, uri: str) -> bytes:
        """The whole object."""
        if not uri.startswith("s3://"):
            with open(uri, "rb") as fh:
                return fh.read()
        bucket, key = parse_s3_uri(uri)
        return self._call(f"reading {uri}", lambda: bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()))

    def get_range(self, uri: str, start: int, end: int) -> bytes:
        """Bytes [start, end) (fewer at the end of the object)."""
        if end <= start:
            return b""
        if not uri.startswith("s3://"):
            with open(uri, "rb") as fh:
                fh.seek(start)
                return fh.read(end - start)
        bucket, key = parse_s3_uri(uri)

        def get() -> bytes:
            try:
                resp = self.s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":  # start past the end
                    return b""
                raise
            return bytes(resp["Body"].read())

        return self._call(f"reading {uri} bytes {start}-{end - 1}", get)

    def stream(self, uri: str, start: int, end: int | None = None, chunk: int = CHUNK) -> Iterator[bytes]:
        """Bytes from `start` up to `end` (None: the end of the object), one ranged read at a time."""
        pos = start
        while end is None or pos < end:
            want = chunk if end is None else min(chunk, end - pos)
            data = self.get_range(uri, pos, pos + want)
            if data:
                yield data
            if len(data) < want:  # a short read: the object ended
                return
            pos += want

    def size(self, uri: str) -> int:
        """The object's size in bytes."""
        if not uri.startswith("s3://"):
            return os.path.getsize(uri)
        bucket, key = parse_s3_uri(uri)
        return int(self._call(f"reading {uri}", lambda: self.s3.head_object(Bucket=bucket, Key=key))["ContentLength"])

    def exists(self, uri: str) -> bool:
        if not uri.startswith("s3://"):
            return os.path.exists(uri)
        try:
            self.size(uri)
        except AwsFatalError as exc:
            if isinstance(exc.failure, AwsFailure) and exc.failure.kind is Kind.NOT_FOUND:
                return False
            raise
        return True

    def put(
        self, uri: str, data: bytes, *, scratch: bool = False, content_type: str = "application/octet-stream"
    ) -> None:
        """Write the object; `scratch` tags it for the bucket's expiry rule (shards and parts)."""
        if not uri.startswith("s3://"):
            _atomic_write(uri, data)
            return
        bucket, key = parse_s3_uri(uri)
        extra = {"Tagging": SCRATCH_TAG} if scratch else {}
        self._call(
            f"writing {uri}",
            lambda: self.s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type, **extra),
        )

    def list_page(
        self,
        bucket: str,
        prefix: str,
        *,
        start_after: str | None = None,
        token: str | None = None,
        delimiter: str | None = None,
    ) -> tuple[Page, list[str]]:
        """One ListObjectsV2 page (S3 only): (keys, common prefixes)."""
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        elif start_after:
            kw["StartAfter"] = start_after
        if delimiter:
            kw["Delimiter"] = delimiter
        resp = self._call(f"listing s3://{bucket}/{prefix}", lambda: self.s3.list_objects_v2(**kw))
        keys = [o["Key"] for o in resp.get("Contents", ())]
        prefixes = [p["Prefix"] for p in resp.get("CommonPrefixes", ())]
        page = Page(keys, bool(resp.get("IsTruncated")), resp.get("NextContinuationToken"))
        return page, prefixes


def _atomic_write(path: str, data: bytes) -> None:
    """Write `path` whole or not at all (a killed writer leaves only a temporary file)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
