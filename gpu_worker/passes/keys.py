"""One key's way through a pass: GET its bytes, convert them (decode, split), or fail it; the final pass's backoff.

Shared by the image pass's loaders (gpu_worker.passes.loader_loop, which may be processes of their
own: this module imports neither torch nor the output writers) and the parts pass.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

from gpu_worker.errors import ObjectFailure
from gpu_worker.output.commits import RETRY
from gpu_worker.sources.fetch import Fetcher, ObjMeta
from gpu_worker.telemetry.stats import Observer
from sluice.aws.s3uri import s3_uri
from sluice.contracts.status import FailureReason

T = TypeVar("T")


class Item(NamedTuple):
    """One key of a rank's work; pickled to a loader process in a task (microseconds a key, beside a GET's ms)."""

    pos: int  # its position in the shard
    bucket: str
    key: str
    phase: int  # MAIN or RETRY

    @property
    def uri(self) -> str:
        return s3_uri(self.bucket, self.key)


class KeyFailure(NamedTuple):
    """A key that produced nothing: `deferred` ones go to the final pass and are not final yet (picklable)."""

    item: Item
    reason: str
    detail: str
    deferred: bool
    obj: tuple[str, str | None] | None = None  # (etag, version id) of bytes that failed to decode or split

    @property
    def uri(self) -> str:
        return self.item.uri


@dataclass(frozen=True)
class Got(Generic[T]):
    """A key fetched and converted (decoded, split): its item, the object version read, and the result."""

    item: Item
    obj: ObjMeta
    value: T


def take(
    fetcher: Fetcher, item: Item, final: bool, convert: Callable[[bytes], T], stats: Observer
) -> Got[T] | KeyFailure:
    """GET one key and convert its bytes; a failure of either is the key's (a converter's bug fails it as corrupt)."""
    if final:
        item = Item(item.pos, item.bucket, item.key, RETRY)
    try:
        data, etag, version = fetcher.get(item.bucket, item.key, final=final)
    except ObjectFailure as f:
        deferred = f.transient and not final
        if deferred:
            stats.incr("s3_deferred")
        return KeyFailure(item, str(f.reason), f.detail, deferred)
    if final:
        stats.incr("s3_recovered")
    started = time.perf_counter()
    try:
        return Got(item, (etag, version, len(data)), convert(data))
    except ObjectFailure as f:
        return KeyFailure(item, str(f.reason), f.detail, False, (etag, version))
    except Exception as exc:  # a decoder bug must not take the rank down: the key fails
        return KeyFailure(
            item, str(FailureReason.CORRUPT), f"{type(exc).__name__}: {exc}"[:300], False, (etag, version)
        )
    finally:
        stats.incr("decode_seconds", time.perf_counter() - started)


def final_backoff(base_s: float) -> None:
    """Before the final pass: by now far fewer requests go out, so let S3 recover first (jittered)."""
    time.sleep(base_s * random.uniform(0.5, 1.0))
