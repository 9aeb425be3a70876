"""A rank's fence: it starts a key only below its reservation, and stops where the sweep split its slice.

The contract is sluice.contracts.tail. The rank reserves ahead of the keys it starts (at
most `ahead` past the key that asked), with a PutItem on its slice's fence conditional on the
split it knows (none, or the one it learned). When the sweep has split the slice, the put
fails and DynamoDB returns the stored item (ReturnValuesOnConditionCheckFailure ALL_OLD): the
rank learns `split_at` and never starts a key at or past it. PutItem is the worker role's only
action on the beats table, and it is enough.

A reservation that cannot be written (throttled, the table unreachable) is retried with
backoff: the rank waits rather than start an unreserved key, and if the wait outlasts the
stall limit its watchdog ends the attempt (exit 75, retried) as for any other stall. With no
beats table (SLUICE_BEATS_TABLE empty, or a table that does not exist) no fence can exist, so
no sweep can split: the fence admits everything.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_worker.log import logger
from gpu_worker.watchdog import BEAT_TTL_S, BeatTarget
from sluice.contracts.tail import fence_key

RETRY_MAX_S = 5.0  # the longest backoff between two tries of a reservation


@dataclass(frozen=True)
class SliceSpec:
    """A rank's slice [lo, hi), the floor its reservations start from and how far ahead each reaches."""

    lo: int
    hi: int
    # Below `floor` every position is claimed by earlier attempts' markers (the ones in the
    # rank's remaining work are gaps in them): no split can start there.
    floor: int
    ahead: int


class RankFence:
    """Admits one rank's main-pass positions (thread-safe); `split_at`/`split_to` once a split is learned."""

    def __init__(
        self,
        target: BeatTarget,
        spec: SliceSpec,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
        on_split: Callable[[int], None] = lambda keys: None,
    ) -> None:
        self._t = target
        self.lo, self.hi = spec.lo, spec.hi
        self.reserved = spec.floor
        self._ahead = max(1, spec.ahead)
        self._client = client
        self._sleep = sleep
        self._lock = threading.Lock()
        self.split_at: int | None = None
        self.split_to: int | None = None
        self.writes = 0
        self._on = bool(target.table)
        self._on_split = on_split  # told how many keys left the rank (its beats' todo shrinks)

    def admit(self, pos: int) -> bool:
        """Whether the rank may start the key at `pos` (False: at or past the split; the main pass ends there)."""
        if not self._on:
            return True
        with self._lock:
            while True:
                if self.split_at is not None and pos >= self.split_at:
                    return False
                if pos < self.reserved:
                    return True
                want = min(self.hi, pos + self._ahead)
                if self.split_at is not None:
                    want = min(want, self.split_at)
                self._reserve(want)

    def _reserve(self, to: int) -> None:
        """Write the reservation `to` (learning a split instead when the sweep has made one); retried until known."""
        delay = 0.2
        while True:
            try:
                self._put(to)
                self.reserved = to
                self.writes += 1
                return
            except Exception as exc:
                if _code(exc) == "ConditionalCheckFailedException":
                    self._learn(getattr(exc, "response", {}).get("Item") or {})
                    return
                if _code(exc) == "ResourceNotFoundException":
                    # No beats table: no fence can exist, so no sweep can split this slice.
                    logger.warning("no beats table: the tail cannot split this rank", extra={"table": self._t.table})
                    self._on, self.reserved = False, self.hi
                    return
                logger.warning(
                    "fence reservation not written; retrying",
                    extra={"error": f"{type(exc).__name__}: {exc}"[:300], "reserve_to": to},
                )
                self._sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)

    def _put(self, to: int) -> None:
        if self._client is None:
            from sluice.aws.clients import client

            self._client = client("dynamodb", name="worker-beats")
        t = self._t
        item: dict[str, Any] = {
            "pk": {"S": t.run_id},
            "sk": {"S": fence_key(t.shard, self.lo, self.hi)},
            "shard": {"N": str(t.shard)},
            "lo": {"N": str(self.lo)},
            "hi": {"N": str(self.hi)},
            "reserved_to": {"N": str(to)},
            "attempt": {"N": str(t.attempt)},
            "rank": {"N": str(t.rank)},
            "job_id": {"S": t.job_id},
            "expires_at": {"N": str(int(time.time()) + BEAT_TTL_S)},
        }
        cond: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(split_at)"}
        if self.split_at is not None:  # keep the split on the item, and write only while it is the one we know
            item["split_at"] = {"N": str(self.split_at)}
            item["split_to"] = {"N": str(self.split_to)}
            cond = {
                "ConditionExpression": "split_at = :s",
                "ExpressionAttributeValues": {":s": {"N": str(self.split_at)}},
            }
        self._client.put_item(TableName=t.table, Item=item, ReturnValuesOnConditionCheckFailure="ALL_OLD", **cond)

    def _learn(self, old: dict[str, Any]) -> None:
        """The split the sweep wrote (the item the failed put returned)."""
        if "split_at" not in old:
            raise RuntimeError("fence write refused without a split on the item")  # not our protocol: fail loudly
        self.split_at = int(old["split_at"]["N"])
        self.split_to = int(old["split_to"]["N"])
        self._on_split(self.hi - self.split_at)
        logger.info(
            "slice split: stopping there",
            extra={"split_at": self.split_at, "split_to": self.split_to, "lo": self.lo, "hi": self.hi},
        )

    def handoff(self) -> tuple[tuple[int, int], int] | None:
        """The span split off to the child and the child's shard, once learned."""
        if self.split_at is None or self.split_to is None or self.split_at >= self.hi:
            return None
        return (self.split_at, self.hi), self.split_to


def ahead_keys(batch: int, lo: int, hi: int) -> int:
    """How far past the key that asks a reservation reaches: two batches, or 1/32 of the slice when more.

    One fence write per 1/32 of a slice (a few dozen a shard, next to beats every 30 s) keeps
    DynamoDB out of the rank's way; the sweep can split no nearer than that to the rank's keys.
    """
    return max(2 * batch, (hi - lo) // 32)


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))


__all__ = ["RankFence", "SliceSpec", "ahead_keys"]
