"""gpu_worker.fence: keys start only below the reservation; a refused reservation teaches the split."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpu_worker.fence import RankFence, SliceSpec, ahead_keys
from gpu_worker.watchdog import BeatTarget

TARGET = BeatTarget("beats", "run-1", "job:0", shard=0, attempt=1, rank=0)


class Table:
    """DynamoDB's conditional PutItem on one fence item, with ALL_OLD on a refusal (what the worker role may call)."""

    def __init__(self, fail: list[str] | None = None) -> None:
        self.item: dict[str, Any] | None = None
        self.puts: list[dict[str, Any]] = []
        self.fail = list(fail or [])

    def put_item(self, **kw: Any) -> None:
        if self.fail:
            code = self.fail.pop(0)
            raise ClientError({"Error": {"Code": code, "Message": code}}, "PutItem")
        cond = kw["ConditionExpression"]
        split = (self.item or {}).get("split_at")
        ok = (
            split is None
            if cond == "attribute_not_exists(split_at)"
            else split == kw["ExpressionAttributeValues"][":s"]
        )
        if not ok:
            err = {"Error": {"Code": "ConditionalCheckFailedException", "Message": "refused"}, "Item": self.item}
            raise ClientError(err, "PutItem")  # type: ignore[arg-type]
        self.item = dict(kw["Item"])
        self.puts.append(self.item)

    def split(self, at: int, to: int) -> None:
        """What the sweep's transaction does to the item."""
        assert self.item is not None and int(self.item["reserved_to"]["N"]) <= at
        self.item |= {"split_at": {"N": str(at)}, "split_to": {"N": str(to)}}


def test_a_rank_reserves_ahead_and_stops_at_a_split_it_learns_from_the_refused_put() -> None:
    table, shrunk = Table(), []
    fence = RankFence(TARGET, SliceSpec(0, 100, 0, 10), client=table, on_split=shrunk.append)
    assert all(fence.admit(p) for p in range(10)) and len(table.puts) == 1  # one write for ten keys
    assert int(table.puts[0]["reserved_to"]["N"]) == 10
    table.split(40, 7)
    assert all(fence.admit(p) for p in range(10, 40))  # up to the split, reserving under it
    assert fence.split_at == 40 and fence.split_to == 7 and shrunk == [60]
    assert not fence.admit(40) and not fence.admit(99)
    assert fence.handoff() == ((40, 100), 7)
    assert all(int(p["reserved_to"]["N"]) <= 40 for p in table.puts)  # never reserved past it
    assert table.puts[-1]["split_at"] == {"N": "40"}  # later puts keep the split on the item


def test_a_throttled_reservation_waits_and_a_missing_table_opens_the_fence() -> None:
    waits: list[float] = []
    table = Table(fail=["ProvisionedThroughputExceededException", "InternalServerError"])
    fence = RankFence(TARGET, SliceSpec(0, 100, 0, 10), client=table, sleep=waits.append)
    assert fence.admit(0) and waits == [0.2, 0.4] and len(table.puts) == 1
    gone = RankFence(TARGET, SliceSpec(0, 100, 0, 10), client=Table(fail=["ResourceNotFoundException"]))
    assert all(gone.admit(p) for p in range(100)) and gone.handoff() is None
    off = RankFence(BeatTarget("", "run-1", "j", 0, 1, 0), SliceSpec(0, 100, 0, 10), client=Table(fail=["X"]))
    assert off.admit(50)  # no beats table configured: nothing written, nothing to split


def test_the_floor_needs_no_reservation_and_ahead_is_two_batches_or_a_32nd() -> None:
    table = Table()
    fence = RankFence(TARGET, SliceSpec(0, 100, 30, 10), client=table)
    assert fence.admit(5) and table.puts == []  # below the claimed floor: a gap an earlier attempt left
    assert ahead_keys(32, 0, 1000) == 64 and ahead_keys(32, 0, 64_000) == 2000
