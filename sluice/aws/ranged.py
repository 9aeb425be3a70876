"""Random access to one object by ranged reads: a shard's blocks for a rank, a Parquet file's columns.

The tail is fetched once, with the first request that needs it: a suffix range of `tail` bytes,
which also gives the object's size (a shard's footer and index, a Parquet file's footer, in one
round trip). Reads inside the tail are served from memory; any other read is one ranged GET. A
rank therefore fetches the tail, the 16-byte header and only the blocks its slice overlaps, and a
Parquet reader only the columns it reads.
"""

from __future__ import annotations

import io
import threading
from typing import Any, Protocol

from sluice.errors import ShardFormatError

TAIL = 64 * 2**10


class Ranges(Protocol):
    """Where the bytes come from (sluice.aws.store.ObjectStore)."""

    def get_range(self, uri: str, start: int, end: int) -> bytes: ...

    def get_tail(self, uri: str, n: int) -> tuple[bytes, int]: ...


class RangedObject:
    """One object's bytes by (offset, length) (a sluice.shards.RangeSource); `requests` records each fetch.

    A `size` given (a listing's) is taken as is: the tail is then fetched by the first read inside it.
    """

    def __init__(self, store: Ranges, uri: str, *, size: int | None = None, tail: int = TAIL) -> None:
        self._store, self.uri, self._tail_bytes = store, uri, tail
        self._lock = threading.Lock()
        self.requests: list[tuple[int, int]] = []
        self._size = -1 if size is None else size
        self._tail_off = -1  # -1: not fetched yet
        self._tail = b""

    def _load_tail(self) -> None:
        body, size = self._store.get_tail(self.uri, self._tail_bytes)
        self._size, self._tail_off, self._tail = size, size - len(body), body
        self.requests.append((self._tail_off, len(body)))

    def size(self) -> int:
        with self._lock:
            if self._size < 0:
                self._load_tail()
            return self._size

    def read(self, offset: int, length: int) -> bytes:
        """Exactly `length` bytes at `offset`; ShardFormatError when the object does not hold them."""
        size = self.size()
        if length <= 0:
            return b""
        if offset < 0 or offset + length > size:
            raise ShardFormatError(f"read of {length} bytes at {offset} is outside {self.uri}")
        with self._lock:
            if self._tail_off < 0 and offset >= size - self._tail_bytes:
                self._load_tail()
        if 0 <= self._tail_off <= offset:
            lo = offset - self._tail_off
            return self._tail[lo : lo + length]
        body = self._store.get_range(self.uri, offset, offset + length)
        with self._lock:
            self.requests.append((offset, len(body)))
        if len(body) != length:
            raise ShardFormatError(f"short read from {self.uri}: {len(body)} of {length} bytes")
        return body


class RangeFile(io.RawIOBase):
    """A RangedObject as a read-only, seekable file (what a Parquet reader takes); a read past the end is short."""

    def __init__(self, obj: RangedObject) -> None:
        super().__init__()
        self._obj, self._pos = obj, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._obj.size()}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._obj.size() - self._pos)
        if want <= 0:
            return 0
        data = self._obj.read(self._pos, want)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)
