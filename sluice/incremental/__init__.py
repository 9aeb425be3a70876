"""Incremental runs (`input.since_run`): embed only the keys the lineage's output does not already hold.

A key is skipped when, for every model of this run, the newest record of the lineage (the
earlier run named in input.since_run, then the runs it was itself incremental on, newest
first) for (key, that model's model_id) was read from the object version the input names
now (sluice.outputs.object_version on both sides). Keys that are new, changed or failed
earlier (no record) are embedded. The newest record decides, not any record: that is the row
the read recipe (docs/incremental.md, sluice.incremental.recipe) returns for the key, so a
skipped key's embedding in the union is always one of its current version.

Every since_run manifest goes through the prepare stage, whatever its size (the Lambdas have
no pyarrow, and the comparison is against up to hundreds of millions of earlier rows): a
map-side anti-join.

* lineage.py (the manifest Lambda): the earlier run must exist, be finished and have a
  readable plan; its lineage is capped (MAX_LINEAGE); the earlier output becomes map tasks.
* mapside.py (map workers): each current key's object version (a listing's or inventory's
  ETag, else a HEAD per key) and every committed row of the earlier output (VERSION_COLUMNS
  only, by Parquet column projection) become version records, routed by partitions_of to
  the same reduce partition as the key itself.
* compare.py (pure): the records' codec and the skip decision of one partition.
* reduceside.py (reduce workers and the submit step): the partition's skip, its shards, and
  the shard numbering that only the submit step can know.
* recipe.py: the duckdb query that reads a run and its lineage as one set.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Each run of a lineage adds its whole output to the reads of every later incremental run (map
# tasks) and to the read recipe's file list; past this many, a full run is cheaper to read.
MAX_LINEAGE = 16
# An incremental reducer holds, besides its keys, their current versions and the newest earlier
# record per key and model (~2x the memory a key takes otherwise): twice the partitions.
PARTITION_FACTOR = 2
SKIPPED_UNCHANGED = "unchanged"  # RunPlan.skipped's one reason


def prefetched(pool: ThreadPoolExecutor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """fn(item) for each item, in order, at most `ahead` running or waiting at once (bounded memory).

    ThreadPoolExecutor.map submits every item at once and holds every result until it is read.
    """
    rest = iter(items)
    pending = deque(pool.submit(fn, x) for x in islice(rest, ahead))
    while pending:
        got = pending.popleft().result()
        for x in islice(rest, 1):
            pending.append(pool.submit(fn, x))
        yield got
