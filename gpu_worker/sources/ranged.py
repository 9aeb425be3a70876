"""Random-access reads of one S3 object with ranged GETs (a `sluice.shards.RangeSource`).

The first request is a suffix range of `tail_bytes`: it returns the object's size (in
Content-Range) and, for shards, the footer and index in one round trip. Reads inside that
tail are served from memory; any other read is one ranged GET. A rank therefore fetches the
tail, the 16-byte header, and only the blocks its slice overlaps.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from sluice.errors import ShardFormatError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DEFAULT_TAIL = 64 * 1024


class S3RangeSource:
    """Ranged GETs against s3://bucket/key; `requests` records every (offset, length) fetched."""

    def __init__(self, client: S3Client, bucket: str, key: str, *, tail_bytes: int = DEFAULT_TAIL) -> None:
        self._client, self.bucket, self.key = client, bucket, key
        self._lock = threading.Lock()
        self.requests: list[tuple[int, int]] = []
        self._size = -1
        self._tail_off = 0
        self._tail = b""
        self._tail_bytes = tail_bytes

    def _get(self, range_header: str) -> tuple[bytes, str]:
        resp = self._client.get_object(Bucket=self.bucket, Key=self.key, Range=range_header)
        return resp["Body"].read(), resp.get("ContentRange", "")

    def _load_tail(self) -> None:
        body, content_range = self._get(f"bytes=-{self._tail_bytes}")
        total = content_range.rpartition("/")[2]
        size = int(total) if total.isdigit() else len(body)
        self._size, self._tail_off, self._tail = size, size - len(body), body
        self.requests.append((self._tail_off, len(body)))

    def size(self) -> int:
        with self._lock:
            if self._size < 0:
                self._load_tail()
            return self._size

    def read(self, offset: int, length: int) -> bytes:
        size = self.size()
        if length <= 0:
            return b""
        if offset < 0 or offset + length > size:
            raise ShardFormatError(f"read of {length} bytes at {offset} is outside s3://{self.bucket}/{self.key}")
        if offset >= self._tail_off:
            lo = offset - self._tail_off
            return self._tail[lo : lo + length]
        body, _ = self._get(f"bytes={offset}-{offset + length - 1}")
        with self._lock:
            self.requests.append((offset, len(body)))
        if len(body) != length:
            raise ShardFormatError(f"short read from s3://{self.bucket}/{self.key}: {len(body)} of {length} bytes")
        return body
