"""Bounded-memory duplicate detection: 128-bit digests in 256 partitions, then a bitmap.

Pass 1 records, per key, a 20-byte record (16-byte BLAKE2b digest of "bucket/key" plus
its u32 position) in one of 256 bytearrays chosen by the digest's first byte: 10M keys
cost 200 MB, not the ~1 GB a Python set of strings would. `duplicates()` then walks one
partition at a time with a small set and marks every later occurrence in a bitmap.

A silent collision (two different keys with the same digest, so one is dropped) needs
a 128-bit collision: for n keys its probability is below n**2 / 2**129, i.e. 1.5e-23
for 10**8 keys -- far below the odds of undetected hardware memory errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b

RECORD = 20  # 16-byte digest + u32 position
MAX_POSITIONS = 2**32


class DuplicateFinder:
    """Feeds keys in stream order; afterwards tells which positions repeat an earlier key."""

    def __init__(self) -> None:
        self._parts = [bytearray() for _ in range(256)]
        self.count = 0

    def add(self, bucket: str, keys: Sequence[str]) -> None:
        """Record keys at the next positions."""
        if self.count + len(keys) > MAX_POSITIONS:
            raise OverflowError("more than 2**32 keys in one run")
        parts, pos = self._parts, self.count
        prefix = bucket.encode("utf-8") + b"/"  # bucket names never contain "/": unambiguous
        for key in keys:
            d = blake2b(prefix + key.encode("utf-8"), digest_size=16).digest()
            parts[d[0]] += d + pos.to_bytes(4, "little")
            pos += 1
        self.count = pos

    def memory_bytes(self) -> int:
        """Bytes held by the digest partitions."""
        return sum(len(p) for p in self._parts)

    def duplicates(self) -> tuple[bytearray, int]:
        """(bitmap with bit i set when position i repeats an earlier key, number of such keys)."""
        bitmap = bytearray((self.count + 7) // 8)
        dups = 0
        for i, part in enumerate(self._parts):
            seen: set[bytes] = set()
            view = memoryview(part)
            for off in range(0, len(part), RECORD):
                digest = bytes(view[off : off + 16])
                if digest in seen:
                    pos = int.from_bytes(view[off + 16 : off + RECORD], "little")
                    bitmap[pos >> 3] |= 1 << (pos & 7)
                    dups += 1
                else:
                    seen.add(digest)
            view.release()
            self._parts[i] = bytearray()  # free as we go
        return bitmap, dups
