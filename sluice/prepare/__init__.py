"""The prepare stage: shard a big input on CPU workers (map: validate and route; reduce: dedup and shard).

Modules: split (runs in the manifest Lambda: tasks and cheap size estimates); mapper (with
keylist and sink) and reducer (run in the AWS Batch prepare jobs, `python -m sluice.prepare
map|reduce`); collect (read by the completion path); offline (the same map and reduce on this
machine). Their objects, on S3 or in a local directory, go through prepare_store(). Nothing here
imports torch.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TYPE_CHECKING, TypeVar, cast

from botocore.config import Config

from sluice.aws.store import ObjectStore

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

S3_CONFIG = Config(retries={"max_attempts": 10, "mode": "standard"}, max_pool_connections=32, user_agent_extra="sluice")
RETRIES = 5  # on top of boto3's: an S3 prefix ramping up answers SlowDown for tens of seconds


def _prepare_client() -> S3Client:
    from sluice.aws.clients import client

    return cast("S3Client", client("s3", config=S3_CONFIG, name="prepare"))


def prepare_store(s3: S3Client | None = None, *, sleep: Callable[[float], None] = time.sleep) -> ObjectStore:
    """The stage's objects: boto3's standard retries, then a throttled or 5xx call retried RETRIES more times
    with backoff before it is raised as RetriableError (the Batch job exits 1 and Batch retries it)."""
    return ObjectStore(s3, connect=_prepare_client, retries=RETRIES, sleep=sleep)


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
