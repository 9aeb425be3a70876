"""The prepare stage: shard a big input on CPU workers (map: validate and route; reduce: dedup and shard).

Modules: split (runs in the manifest Lambda: tasks and cheap size estimates); mapper (with
keylist and sink) and reducer (run in the AWS Batch prepare jobs, `python -m sluice.prepare
map|reduce`); collect (read by the completion path); offline (the same map and reduce on this
machine); store (S3 or a local directory). Nothing here imports torch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TypeVar


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)  # macOS reports bytes, Linux KiB


T = TypeVar("T")


R = TypeVar("R")


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
