"""Compact binary shard codec: S3 keys in checksummed, independently compressed blocks.

Layout (all integers little-endian; full description in docs/shard-format.md)::

    header  16 B   magic b"SLUICESH" | version u16 | codec u8 | flags u8 | reserved u32
    blocks         each block: the keys of ONE bucket, compressed on its own
    index          buckets table, then one 28-byte entry per block, then total keys
    footer  24 B   index offset u64 | index length u32 | index crc32 u32 | b"SLSHEND1"

A reader fetches the footer, then the index, then only the blocks that overlap the
slice [start, stop) it wants: a rank never decompresses another rank's keys.
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import BinaryIO, Protocol

from sluice.errors import ShardFormatError

MAGIC = b"SLUICESH"
END_MAGIC = b"SLSHEND1"
VERSION = 1
HEADER = struct.Struct("<8sHBBI")  # magic, version, codec, flags, reserved
FOOTER = struct.Struct("<QII8s")  # index offset, index length, index crc32, end magic
BLOCK = struct.Struct("<QIIIIBxxx")  # offset, compressed len, n_keys, bucket id, crc32, kind
FLAG_SORTED = 1

CODEC_NONE, CODEC_ZLIB, CODEC_ZSTD = 0, 1, 2
CODEC_NAMES = {"none": CODEC_NONE, "zlib": CODEC_ZLIB, "zstd": CODEC_ZSTD}
KIND_NEWLINE = 0  # keys joined by "\n" (fast path: no key contains a newline)
KIND_LENGTHS = 1  # u32 byte lengths, then the concatenated UTF-8 bytes (any key)

DEFAULT_BLOCK_KEYS = 1024
MAX_BUCKET_NAME = 255


def _zstd():  # type: ignore[no-untyped-def]
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - exercised only without the wheel
        raise ShardFormatError("this shard uses zstd: install the 'zstandard' package (pip install zstandard)") from exc
    return zstandard


def default_codec() -> str:
    """zstd when the wheel is importable (smaller and ~5x faster), else stdlib zlib."""
    try:
        import zstandard  # noqa: F401
    except ImportError:  # pragma: no cover
        return "zlib"
    return "zstd"


def _compressor(codec: int, level: int | None) -> Callable[[bytes], bytes]:
    if codec == CODEC_NONE:
        return bytes
    if codec == CODEC_ZLIB:
        lvl = 6 if level is None else level
        return lambda b: zlib.compress(b, lvl)
    return _zstd().ZstdCompressor(level=3 if level is None else level).compress


def _decompressor(codec: int) -> Callable[[bytes], bytes]:
    if codec == CODEC_NONE:
        return bytes
    if codec == CODEC_ZLIB:
        return zlib.decompress
    if codec == CODEC_ZSTD:
        dctx = _zstd().ZstdDecompressor()
        # Block payloads carry their size in the zstd frame header.
        return dctx.decompress
    raise ShardFormatError(f"unknown block codec id {codec}: written by a newer Sluice?")


def encode_block(keys: Sequence[str]) -> tuple[int, bytes]:
    """Serialize keys to (kind, payload) before compression."""
    text = "\n".join(keys)
    if text.count("\n") == len(keys) - 1 or not keys:
        return KIND_NEWLINE, text.encode("utf-8")
    encoded = [k.encode("utf-8") for k in keys]
    lengths = array("I", map(len, encoded))
    if lengths.itemsize != 4:  # pragma: no cover - every CPython we support has 4-byte I
        raise ShardFormatError("platform 'I' array is not 32-bit")
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big endian
        lengths.byteswap()
    return KIND_LENGTHS, lengths.tobytes() + b"".join(encoded)


def decode_block(kind: int, payload: bytes, n_keys: int) -> list[str]:
    """Inverse of encode_block; raises ShardFormatError on any inconsistency."""
    if kind == KIND_NEWLINE:
        if n_keys == 0:
            return []
        keys = payload.decode("utf-8").split("\n")
    elif kind == KIND_LENGTHS:
        lengths = array("I")
        lengths.frombytes(payload[: 4 * n_keys])
        if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover
            lengths.byteswap()
        ends = list(accumulate(lengths, initial=4 * n_keys))
        if ends[-1] != len(payload):
            raise ShardFormatError("block lengths do not match its payload")
        keys = [payload[a:b].decode("utf-8") for a, b in pairwise(ends)]
    else:
        raise ShardFormatError(f"unknown block kind {kind}")
    if len(keys) != n_keys:
        raise ShardFormatError(f"block holds {len(keys)} keys, index says {n_keys}")
    return keys


@dataclass(frozen=True)
class ShardStats:
    """What a writer produced."""

    n_keys: int
    n_blocks: int
    n_bytes: int


class ShardWriter:
    """Streams (bucket, keys) groups into a shard file.

    sort=True buffers the shard and writes each bucket's keys sorted (smaller: sorted
    neighbours share prefixes); sort=False keeps the order given and streams blocks.
    """

    def __init__(
        self,
        sink: BinaryIO,
        *,
        codec: str | None = None,
        level: int | None = None,
        block_keys: int = DEFAULT_BLOCK_KEYS,
        sort: bool = True,
    ) -> None:
        name = codec or default_codec()
        if name not in CODEC_NAMES:
            raise ValueError(f"codec must be one of {sorted(CODEC_NAMES)}, not {name!r}")
        if block_keys < 1:
            raise ValueError("block_keys must be >= 1")
        self._sink = sink
        self._codec = CODEC_NAMES[name]
        self._compress = _compressor(self._codec, level)
        self._block_keys = block_keys
        self._sort = sort
        self._buckets: dict[str, int] = {}
        self._entries: list[bytes] = []
        self._pending_bucket: str | None = None
        self._pending: list[str] = []
        self._by_bucket: dict[str, list[str]] = {}
        self._n_keys = 0
        self._closed = False
        self._pos = HEADER.size
        sink.write(HEADER.pack(MAGIC, VERSION, self._codec, FLAG_SORTED if sort else 0, 0))

    def add(self, bucket: str, keys: Iterable[str]) -> None:
        """Append keys that all live in `bucket`."""
        if self._closed:
            raise ValueError("writer is closed")
        if self._sort:
            self._by_bucket.setdefault(bucket, []).extend(keys)
            return
        if bucket != self._pending_bucket:
            self._flush_pending()
            self._pending_bucket = bucket
        pending = self._pending
        pending.extend(keys)
        while len(pending) >= self._block_keys:
            self._write_block(bucket, pending[: self._block_keys])
            del pending[: self._block_keys]

    def _flush_pending(self) -> None:
        if self._pending and self._pending_bucket is not None:
            self._write_block(self._pending_bucket, self._pending)
        self._pending = []

    def _bucket_id(self, bucket: str) -> int:
        bid = self._buckets.get(bucket)
        if bid is None:
            if len(bucket.encode("utf-8")) > MAX_BUCKET_NAME:
                raise ValueError(f"bucket name too long: {bucket[:64]!r}...")
            bid = self._buckets[bucket] = len(self._buckets)
        return bid

    def _write_block(self, bucket: str, keys: Sequence[str]) -> None:
        kind, payload = encode_block(keys)
        data = self._compress(payload)
        self._entries.append(
            BLOCK.pack(self._pos, len(data), len(keys), self._bucket_id(bucket), zlib.crc32(data), kind)
        )
        self._sink.write(data)
        self._pos += len(data)
        self._n_keys += len(keys)

    def close(self) -> ShardStats:
        """Write remaining blocks, the index and the footer."""
        if self._closed:
            raise ValueError("writer is closed")
        if self._sort:
            step = self._block_keys
            for bucket in sorted(self._by_bucket):
                keys = self._by_bucket.pop(bucket)
                keys.sort()
                for i in range(0, len(keys), step):
                    self._write_block(bucket, keys[i : i + step])
        else:
            self._flush_pending()
        self._closed = True
        index = io.BytesIO()
        index.write(struct.pack("<I", len(self._buckets)))
        for name in self._buckets:  # dicts keep insertion order == bucket id order
            raw = name.encode("utf-8")
            index.write(struct.pack("<H", len(raw)) + raw)
        index.write(struct.pack("<I", len(self._entries)))
        index.write(b"".join(self._entries))
        index.write(struct.pack("<Q", self._n_keys))
        body = index.getvalue()
        self._sink.write(body)
        self._sink.write(FOOTER.pack(self._pos, len(body), zlib.crc32(body), END_MAGIC))
        total = self._pos + len(body) + FOOTER.size
        return ShardStats(self._n_keys, len(self._entries), total)


def encode_shard(groups: Iterable[tuple[str, Sequence[str]]], **kwargs: object) -> bytes:
    """Encode (bucket, keys) groups to shard bytes in memory."""
    buf = io.BytesIO()
    writer = ShardWriter(buf, **kwargs)  # type: ignore[arg-type]
    for bucket, keys in groups:
        writer.add(bucket, keys)
    writer.close()
    return buf.getvalue()


class RangeSource(Protocol):
    """Random-access bytes: a local file, an in-memory buffer, or an S3 object."""

    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


class BytesSource:
    """A shard already in memory."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def size(self) -> int:
        return len(self._data)

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self._data[offset : offset + length])


class FileSource:
    """A shard on the local disk, read with seek + read."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = os.fspath(path)
        self._size = os.path.getsize(self._path)

    def size(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        with open(self._path, "rb") as fh:
            fh.seek(offset)
            return fh.read(length)


@dataclass(frozen=True)
class BlockEntry:
    """One block's index entry; `first` is the position of its first key in the shard."""

    offset: int
    length: int
    n_keys: int
    bucket: int
    crc: int
    kind: int
    first: int


class ShardReader:
    """Reads a shard's index once, then decodes any contiguous slice of its keys."""

    def __init__(self, source: RangeSource | bytes) -> None:
        self._src: RangeSource = BytesSource(source) if isinstance(source, bytes | bytearray) else source
        size = self._src.size()
        if size < HEADER.size + FOOTER.size:
            raise ShardFormatError(f"shard is {size} bytes: too short to be a shard (truncated?)")
        magic, version, codec, flags, _ = HEADER.unpack(self._src.read(0, HEADER.size))
        if magic != MAGIC:
            raise ShardFormatError("not a Sluice shard (bad magic)")
        if version != VERSION:
            raise ShardFormatError(f"shard format version {version}; this Sluice reads version {VERSION}")
        idx_off, idx_len, idx_crc, end = FOOTER.unpack(self._src.read(size - FOOTER.size, FOOTER.size))
        if end != END_MAGIC or idx_off + idx_len + FOOTER.size != size:
            raise ShardFormatError("shard footer is damaged (truncated or appended to?)")
        body = self._src.read(idx_off, idx_len)
        if zlib.crc32(body) != idx_crc:
            raise ShardFormatError("shard index checksum mismatch")
        self.version, self.codec, self.sorted = version, codec, bool(flags & FLAG_SORTED)
        self._decompress = _decompressor(codec)
        self.buckets, self.blocks, self.n_keys = self._parse_index(body, idx_off)

    @staticmethod
    def _parse_index(body: bytes, data_end: int) -> tuple[list[str], list[BlockEntry], int]:
        try:
            (n_buckets,) = struct.unpack_from("<I", body, 0)
            pos, buckets = 4, []
            for _ in range(n_buckets):
                (ln,) = struct.unpack_from("<H", body, pos)
                buckets.append(body[pos + 2 : pos + 2 + ln].decode("utf-8"))
                pos += 2 + ln
            (n_blocks,) = struct.unpack_from("<I", body, pos)
            pos += 4
            blocks, first = [], 0
            for off, ln, nk, bid, crc, kind in BLOCK.iter_unpack(body[pos : pos + n_blocks * BLOCK.size]):
                if bid >= n_buckets or off + ln > data_end:
                    raise ShardFormatError("shard index points outside the file")
                blocks.append(BlockEntry(off, ln, nk, bid, crc, kind, first))
                first += nk
            pos += n_blocks * BLOCK.size
            (n_keys,) = struct.unpack_from("<Q", body, pos)
        except (struct.error, UnicodeDecodeError) as exc:
            raise ShardFormatError(f"shard index is malformed: {exc}") from exc
        if n_keys != first or len(blocks) != n_blocks:
            raise ShardFormatError("shard index key count mismatch")
        return buckets, blocks, n_keys

    def __len__(self) -> int:
        return self.n_keys

    def _block_keys(self, b: BlockEntry) -> list[str]:
        data = self._src.read(b.offset, b.length)
        if zlib.crc32(data) != b.crc:
            raise ShardFormatError(f"block at byte {b.offset} fails its checksum (corrupt shard)")
        try:
            payload = self._decompress(data)
        except Exception as exc:  # zlib.error / zstd.ZstdError: both mean a bad block
            raise ShardFormatError(f"block at byte {b.offset} does not decompress: {exc}") from exc
        return decode_block(b.kind, payload, b.n_keys)

    def groups(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, list[str]]]:
        """Yield (bucket, keys) for positions [start, stop), decoding only overlapping blocks."""
        stop = self.n_keys if stop is None else min(stop, self.n_keys)
        start = max(0, start)
        if start >= stop:
            return
        firsts = [b.first for b in self.blocks]
        i = bisect_right(firsts, start) - 1
        while i < len(self.blocks) and self.blocks[i].first < stop:
            b = self.blocks[i]
            keys = self._block_keys(b)
            lo, hi = max(start - b.first, 0), min(stop - b.first, b.n_keys)
            yield self.buckets[b.bucket], keys[lo:hi] if (lo, hi) != (0, b.n_keys) else keys
            i += 1

    def uris(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """Yield 's3://bucket/key' for positions [start, stop)."""
        for bucket, keys in self.groups(start, stop):
            prefix = f"s3://{bucket}/"
            yield from (prefix + k for k in keys)

    def pairs(self, start: int = 0, stop: int | None = None) -> list[tuple[str, str]]:
        """(bucket, key) pairs for positions [start, stop)."""
        return [(bucket, k) for bucket, keys in self.groups(start, stop) for k in keys]


def rank_slice(n_keys: int, world_size: int, rank: int) -> tuple[int, int]:
    """Contiguous [start, stop) of rank `rank` out of `world_size`; sizes differ by <= 1."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world of size {world_size}")
    return n_keys * rank // world_size, n_keys * (rank + 1) // world_size
