"""The tail's contract: a rank's fence item in the beats table, which the worker and the sweep share.

A rank starts no key at or past its fence's `reserved_to` until a later write of the fence has
raised it (gpu_worker.fence). The sweep splits a slow rank's slice at a point at or past
`reserved_to` with one transaction that sets `split_at` on the fence, conditional on
`reserved_to <= split_at` (sluice.control.sweep.tail): a split that loses the race with the
rank's own reservation is refused whole. The rank's next reservation is conditional on the
split it knows, so it fails, returns the item (ReturnValuesOnConditionCheckFailure ALL_OLD)
and the rank learns the split before it could start a key past it. Keys at [split_at, hi)
are then the split child's, shard `split_to`.

The fence is keyed by the rank's slice, not its attempt, so a retried attempt of the same
slice learns an earlier split with its first reservation. A slice is the job definition's
world (the GPUs Batch assigns it, the same for every attempt) cut by `sluice.shards.rank_slice`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

FENCE_PREFIX = "F#"


def fence_key(shard: int, lo: int, hi: int) -> str:
    """The beats table's sort key of one slice's fence (a beat's key never starts with F#)."""
    return f"{FENCE_PREFIX}{shard:06d}#{lo:09d}-{hi:09d}"


def is_fence(sk: str) -> bool:
    return sk.startswith(FENCE_PREFIX)


class Fence(BaseModel):
    """One slice's fence as stored (numbers as DynamoDB gives them back, already plain)."""

    model_config = ConfigDict(extra="ignore")  # pk, sk, expires_at are the table's

    shard: int
    lo: int  # the slice [lo, hi) of the shard's positions
    hi: int
    reserved_to: int  # no key at or past this position is started until a later write raises it
    attempt: int  # the attempt that wrote the reservation
    rank: int
    job_id: str = ""
    split_at: int | None = None  # set by the sweep only: [split_at, hi) is shard split_to's
    split_to: int | None = None

    @classmethod
    def of(cls, plain: Mapping[str, Any]) -> Fence:
        """From a DynamoDB item already turned into plain values."""
        return cls.model_validate({k: (int(v) if k != "job_id" else v) for k, v in plain.items() if k in FIELDS})


FIELDS = frozenset(Fence.model_fields)

__all__ = ["FENCE_PREFIX", "Fence", "fence_key", "is_fence"]
