"""Keys -> shards -> job layout, in two streaming passes with bounded memory.

Pass 1 (`scan`): validate every key, record its digest (sluice.plan.dedup) and spill it, in
manifest order, to a local temporary shard file. Nothing is written to S3 until the
whole input has been validated, so a rejected manifest leaves no trace under runs/.
Pass 2 (`write_shards`): re-read the spill, drop later duplicates, cut the unique keys
into contiguous shards of `keys_per_shard` (sorted inside each shard, which makes them
~23% smaller), and hand each finished shard to a `put` callback.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from sluice.errors import Rejection, TooBigForLambda
from sluice.plan.dedup import DuplicateFinder
from sluice.plan.layout import Layout
from sluice.shards import FileSource, ShardReader, ShardWriter, encode_shard

KeyBatch = tuple[str, list[str]]
SORT_LIMIT = 2_000_000  # shards bigger than this keep manifest order (sorting needs them in memory)


@dataclass
class Scan:
    """Result of pass 1: counts plus the spill file holding the keys in manifest order."""

    total_keys: int
    duplicates: int
    spill_path: str
    bitmap: bytearray = field(repr=False)
    buckets: set[str] = field(default_factory=set)

    @property
    def unique_keys(self) -> int:
        return self.total_keys - self.duplicates

    def close(self) -> None:
        """Delete the spill file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spill_path)

    def __enter__(self) -> Scan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan(
    batches: Iterable[KeyBatch], *, max_keys: int, spill_dir: str | None = None, lambda_cap: int | None = None
) -> Scan:
    """Pass 1: spill and digest every key; reject zero keys or too many (TooBigForLambda past `lambda_cap`)."""
    finder = DuplicateFinder()
    fd, path = tempfile.mkstemp(prefix="sluice-spill-", suffix=".shard", dir=spill_dir)
    buckets: set[str] = set()
    try:
        with os.fdopen(fd, "wb") as fh:
            writer = ShardWriter(fh, sort=False, level=1, block_keys=4096)
            for bucket, keys in batches:
                if lambda_cap is not None and finder.count + len(keys) > lambda_cap:
                    raise TooBigForLambda(finder.count + len(keys))
                if finder.count + len(keys) > max_keys:
                    raise Rejection(
                        f"more than {max_keys} keys (SLUICE_MAX_KEYS): split the input into several manifests"
                    )
                buckets.add(bucket)
                finder.add(bucket, keys)
                writer.add(bucket, keys)
            writer.close()
        if finder.count == 0:
            raise Rejection("the manifest names zero keys: nothing to run")
        bitmap, dups = finder.duplicates()
    except BaseException:
        os.unlink(path)
        raise
    return Scan(finder.count, dups, path, bitmap, buckets)


def iter_unique(sc: Scan) -> Iterator[KeyBatch]:
    """Pass 2 input: the spilled keys in manifest order, later duplicates dropped."""
    reader = ShardReader(FileSource(sc.spill_path))
    bitmap, pos = sc.bitmap, 0
    for bucket, keys in reader.groups():
        n = len(keys)
        lo, hi = pos >> 3, (pos + n + 7) >> 3
        if any(bitmap[lo:hi]):
            keys = [k for i, k in enumerate(keys, pos) if not bitmap[i >> 3] >> (i & 7) & 1]
        pos += n
        if keys:
            yield bucket, keys


def write_shards(sc: Scan, lay: Layout, put: Callable[[int, bytes], None], *, sort: bool | None = None) -> list[int]:
    """Pass 2: encode each shard and call put(index, data). Returns keys per shard."""
    do_sort = lay.keys_per_shard <= SORT_LIMIT if sort is None else sort
    sizes: list[int] = []
    groups: list[KeyBatch] = []
    filled = 0

    def flush() -> None:
        nonlocal groups, filled
        put(len(sizes), encode_shard(groups, sort=do_sort))
        sizes.append(filled)
        groups, filled = [], 0

    for bucket, keys in iter_unique(sc):
        while keys:
            take = min(len(keys), lay.keys_per_shard - filled)
            groups.append((bucket, keys[:take]))
            filled += take
            keys = keys[take:]
            if filled == lay.keys_per_shard:
                flush()
    if filled or not sizes:
        flush()
    while len(sizes) < lay.n_shards:  # MNP with fewer keys than nodes: empty shards
        flush()
    return sizes
