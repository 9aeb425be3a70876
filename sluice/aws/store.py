"""Objects by URI: `s3://bucket/key` on S3, anything else a path on the local disk, behind one small API.

Every role reads and writes its objects here: the Lambdas (plan, shards, results), the prepare
stage (inputs, parts, results), the GPU worker (plan, shard, markers, output). S3 calls go through
a client created on first use (`connect`; sluice.aws.clients's default client unless given). A
failed call is translated once (sluice.aws.errors): AwsRetriableError when transient,
AwsFatalError otherwise; a store made with `retries` first retries a transient failure that many
times more, with exponential backoff. Local writes are atomic (a temporary file renamed into
place), so a killed writer never leaves half a file under its final name; listings skip such
temporary files (names starting with ".").
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import AwsFatalError, Kind, classify, translate
from sluice.aws.s3uri import parse_s3_uri, s3_uri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")
CHUNK = 8 * 2**20  # one read of stream(): big enough that request overhead is small, small enough to retry


@dataclass(frozen=True)
class Page:
    """One ListObjectsV2 page: its keys, and whether more pages follow (and each key's ETag and size)."""

    keys: list[str]
    truncated: bool
    token: str | None
    etags: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


def default_client() -> S3Client:
    """The process's shared S3 client (sluice.aws.clients)."""
    from sluice.aws.clients import client

    return cast("S3Client", client("s3"))


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


class ObjectStore:
    """Bytes by URI: `s3://bucket/key` on S3, anything else a local path."""

    def __init__(
        self,
        s3: S3Client | None = None,
        *,
        connect: Callable[[], S3Client] = default_client,
        retries: int = 0,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._s3, self._connect = s3, connect
        self._retries, self._backoff_s, self._sleep = retries, backoff_s, sleep

    @property
    def s3(self) -> S3Client:
        if self._s3 is None:
            self._s3 = self._connect()
        return self._s3

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """fn(), a transient S3 failure retried `retries` times; what still fails is translated once."""
        for attempt in range(self._retries + 1):
            try:
                return fn()
            except (ClientError, BotoCoreError) as exc:
                if not classify(exc).retriable or attempt == self._retries:
                    raise translate(exc, what) from exc
                self._sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, uri: str) -> bytes:
        """The whole object."""
        if not is_s3(uri):
            with open(uri, "rb") as fh:
                return fh.read()
        bucket, key = parse_s3_uri(uri)
        return self._call(f"reading {uri}", lambda: bytes(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()))

    def get_if_exists(self, uri: str) -> bytes | None:
        """The whole object, or None when it does not exist."""
        try:
            return self.get(uri)
        except FileNotFoundError:
            return None
        except AwsFatalError as exc:
            if exc.kind is Kind.NOT_FOUND:
                return None
            raise

    def get_range(self, uri: str, start: int, end: int) -> bytes:
        """Bytes [start, end) (fewer at the end of the object)."""
        if end <= start:
            return b""
        if not is_s3(uri):
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

    def get_tail(self, uri: str, n: int) -> tuple[bytes, int]:
        """(the object's last `n` bytes, its size): one suffix-range GET on S3."""
        if not is_s3(uri):
            size = os.path.getsize(uri)
            return self.get_range(uri, max(0, size - n), size), size
        bucket, key = parse_s3_uri(uri)

        def get() -> tuple[bytes, int]:
            try:
                resp = self.s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{n}")
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":  # an empty object
                    return b"", 0
                raise
            body = bytes(resp["Body"].read())
            total = str(resp.get("ContentRange", "")).rpartition("/")[2]  # "bytes 10-19/20"
            return body, int(total) if total.isdigit() else len(body)

        return self._call(f"reading {uri} bytes -{n}", get)

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

    def head(self, uri: str) -> dict[str, Any]:
        """HeadObject (S3 only): ETag, VersionId, ContentLength ..."""
        bucket, key = parse_s3_uri(uri)
        return dict(self._call(f"HEAD {uri}", lambda: self.s3.head_object(Bucket=bucket, Key=key)))

    def size(self, uri: str) -> int:
        """The object's size in bytes."""
        if not is_s3(uri):
            return os.path.getsize(uri)
        bucket, key = parse_s3_uri(uri)
        return int(self._call(f"reading {uri}", lambda: self.s3.head_object(Bucket=bucket, Key=key))["ContentLength"])

    def exists(self, uri: str) -> bool:
        if not is_s3(uri):
            return os.path.exists(uri)
        try:
            self.size(uri)
        except AwsFatalError as exc:
            if exc.kind is Kind.NOT_FOUND:
                return False
            raise
        return True

    def put(self, uri: str, data: bytes, content_type: str = "application/octet-stream", *, tagging: str = "") -> None:
        """Write the object whole; `tagging` ("k=v&..."; S3 only) tags it, e.g. for a lifecycle rule."""
        if not is_s3(uri):
            _atomic_write(uri, data)
            return
        bucket, key = parse_s3_uri(uri)
        extra: dict[str, Any] = {"Tagging": tagging} if tagging else {}
        self._call(
            f"writing {uri}",
            lambda: self.s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type, **extra),
        )

    def copy(self, src: str, dst: str, *, tagging: str = "") -> None:
        """Copy an object (server-side on S3, within one bucket or across); `tagging` replaces the copy's tags."""
        if not is_s3(src):
            with open(src, "rb") as fh:
                _atomic_write(dst, fh.read())
            return
        sb, sk = parse_s3_uri(src)
        db, dk = parse_s3_uri(dst)
        extra: dict[str, Any] = {"TaggingDirective": "REPLACE", "Tagging": tagging} if tagging else {}
        self._call(
            f"copying {src} to {dst}",
            lambda: self.s3.copy_object(Bucket=db, Key=dk, CopySource={"Bucket": sb, "Key": sk}, **extra),
        )

    def delete(self, uri: str) -> None:
        """Delete the object (gone already: nothing to do)."""
        if not is_s3(uri):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(uri)
            return
        bucket, key = parse_s3_uri(uri)
        self._call(f"deleting {uri}", lambda: self.s3.delete_object(Bucket=bucket, Key=key))

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
        resp = self._call(f"listing {s3_uri(bucket, prefix)}", lambda: self.s3.list_objects_v2(**kw))
        contents = resp.get("Contents", ())
        keys = [o["Key"] for o in contents]
        prefixes = [p["Prefix"] for p in resp.get("CommonPrefixes", ())]
        etags = [str(o.get("ETag", "")).strip('"') for o in contents]
        sizes = [int(o.get("Size", 0)) for o in contents]
        page = Page(keys, bool(resp.get("IsTruncated")), resp.get("NextContinuationToken"), etags, sizes)
        return page, prefixes

    def list(self, prefix: str) -> dict[str, int]:
        """URI -> size of every object under `prefix`, in URI order (S3: a key prefix; local: a folder's files)."""
        if not is_s3(prefix):
            found = {}
            for folder, _, files in os.walk(prefix.rstrip("/")):
                for name in files:
                    if not name.startswith("."):  # _atomic_write's temporary files are no objects
                        path = os.path.join(folder, name)
                        found[path] = os.path.getsize(path)
            return dict(sorted(found.items()))
        bucket, key = parse_s3_uri(prefix, allow_empty_key=True)
        out: dict[str, int] = {}
        token = None
        while True:  # S3 lists in key order
            page, _ = self.list_page(bucket, key, token=token)
            out.update(zip((s3_uri(bucket, k) for k in page.keys), page.sizes, strict=True))
            if not page.truncated:
                return out
            token = page.token


def _atomic_write(path: str, data: bytes) -> None:
    """Write `path` whole or not at all (a killed writer leaves only a temporary file, named ".<name>.*")."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
