"""Where the prepare stage reads and writes: S3 (s3:// URIs) or a local directory, behind one small API.

S3 calls go through a lazily created client (sluice.aws.clients.client) with boto3's standard retries;
a throttled or 5xx call that outlives those is retried here a few more times with backoff, then
raised as RetriableError (the Batch job exits 1 and Batch retries it). Other S3 failures are
AwsFatalError (sluice.aws.errors). Local writes are atomic (write, then rename), so a killed
worker never leaves half a file under its final name.
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar, cast

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import AwsFatalError, Kind, classify, translate
from sluice.aws.s3uri import parse_s3_uri
from sluice.paths import SCRATCH_TAG

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")
S3_CONFIG = Config(retries={"max_attempts": 10, "mode": "standard"}, max_pool_connections=32, user_agent_extra="sluice")
RETRIES = 5  # on top of boto3's: an S3 prefix ramping up answers SlowDown for tens of seconds
CHUNK = 8 * 2**20  # one ranged GET: big enough that request overhead is small, small enough to retry


@dataclass(frozen=True)
class Page:
    """One ListObjectsV2 page: its keys, and whether more pages follow (and each key's ETag and size)."""

    keys: list[str]
    truncated: bool
    token: str | None
    etags: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


class PrepareStore:
    """Bytes by URI: `s3://bucket/key` on S3, anything else a local path."""

    def __init__(
        self, s3: S3Client | None = None, *, backoff_s: float = 0.5, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._s3 = s3
        self._backoff_s = backoff_s
        self._sleep = sleep

    @property
    def s3(self) -> S3Client:
        if self._s3 is None:
            from sluice.aws.clients import client

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
            if exc.kind is Kind.NOT_FOUND:
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
        extra: dict[str, Any] = {"Tagging": SCRATCH_TAG} if scratch else {}
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
        contents = resp.get("Contents", ())
        keys = [o["Key"] for o in contents]
        prefixes = [p["Prefix"] for p in resp.get("CommonPrefixes", ())]
        etags = [str(o.get("ETag", "")).strip('"') for o in contents]
        sizes = [int(o.get("Size", 0)) for o in contents]
        page = Page(keys, bool(resp.get("IsTruncated")), resp.get("NextContinuationToken"), etags, sizes)
        return page, prefixes

    def list_objects(self, prefix_uri: str) -> list[tuple[str, int]]:
        """(URI, size) of every object under `prefix_uri` (S3: every page; local: the files below the folder)."""
        if not prefix_uri.startswith("s3://"):
            folder = prefix_uri.rstrip("/")
            found = [
                (os.path.join(d, f), os.path.getsize(os.path.join(d, f)))
                for d, _, files in os.walk(folder)
                for f in files
                if not f.startswith(".tmp-")  # _atomic_write's temporary files are no objects
            ]
            return sorted(found)
        bucket, prefix = parse_s3_uri(prefix_uri, allow_empty_key=True)
        out: list[tuple[str, int]] = []
        token = None
        while True:
            page, _ = self.list_page(bucket, prefix, token=token)
            out += [(f"s3://{bucket}/{k}", n) for k, n in zip(page.keys, page.sizes, strict=True)]
            if not page.truncated:
                return out
            token = page.token

    def head(self, uri: str) -> dict[str, Any]:
        """HeadObject (S3 only): ETag, VersionId, ContentLength ...; transient failures retried, others raised."""
        bucket, key = parse_s3_uri(uri)
        return dict(self._call(f"HEAD {uri}", lambda: self.s3.head_object(Bucket=bucket, Key=key)))

    def copy(self, src: str, dst: str, *, scratch: bool = False) -> None:
        """Copy an object (server-side on S3, within one bucket or across); `scratch` tags the copy as put() does."""
        if not src.startswith("s3://"):
            with open(src, "rb") as fh:
                _atomic_write(dst, fh.read())
            return
        sb, sk = parse_s3_uri(src)
        db, dk = parse_s3_uri(dst)
        extra: dict[str, Any] = {"TaggingDirective": "REPLACE", "Tagging": SCRATCH_TAG} if scratch else {}
        self._call(
            f"copying {src} to {dst}",
            lambda: self.s3.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk}, **extra),
        )

    def open_ranges(self, uri: str, size: int) -> BinaryIO:
        """A read-only, seekable file over the object whose reads are ranged GETs (a local path: the file)."""
        if not uri.startswith("s3://"):
            return open(uri, "rb")
        return cast(BinaryIO, RangeFile(self, uri, size))


class RangeFile(io.RawIOBase):
    """An object as a seekable file: each read is one ranged GET, so a Parquet reader fetches only its columns.

    The last TAIL bytes are fetched once and served from memory: a Parquet reader reads the
    footer in several small reads there.
    """

    TAIL = 64 * 2**10

    def __init__(self, store: PrepareStore, uri: str, size: int) -> None:
        super().__init__()
        self._store, self._uri, self._size, self._pos = store, uri, size, 0
        self._tail_at = max(0, size - self.TAIL)
        self._tail: bytes | None = None
        self.gets = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._size - self._pos)
        if want <= 0:
            return 0
        start, end = self._pos, self._pos + want
        if start >= self._tail_at:
            if self._tail is None:
                self._tail = self._store.get_range(self._uri, self._tail_at, self._size)
                self.gets += 1
            data = self._tail[start - self._tail_at : end - self._tail_at]
        else:
            data = self._store.get_range(self._uri, start, end)
            self.gets += 1
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


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
