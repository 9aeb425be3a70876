"""The tail's decision, pure: each running rank's rate and expected finish, the run's median, the splits to make.

sluice.control.sweep.tail reads the beats and fences, calls `decide`, and commits and applies
what it returns.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.contracts.events import SplitShard
from sluice.contracts.tail import Fence, is_fence
from sluice.control.table.ddb import values
from sluice.settings import Settings


@dataclass(frozen=True)
class RankView:
    """One rank of a shard's newest attempt, from its beat and its slice's fence."""

    shard: int
    attempt: int
    rank: int
    processed: int
    todo: int
    started_at: float
    ready_at: float | None
    moved_at: float
    fence: Fence | None

    @property
    def done(self) -> bool:
        return self.todo > 0 and self.processed >= self.todo

    @property
    def rate(self) -> float | None:
        """Keys a second since its models were ready; None before a key is done."""
        if self.ready_at is None or self.processed <= 0 or self.moved_at <= self.ready_at:
            return None
        return self.processed / (self.moved_at - self.ready_at)

    def total_s(self) -> float | None:
        """Expected seconds from its start to its end (the actual ones, once done)."""
        rate = self.rate
        if rate is None or self.ready_at is None:
            return None
        return (self.ready_at - self.started_at) + self.todo / rate

    def left_s(self, now: float) -> float | None:
        """Expected seconds until it ends."""
        total = self.total_s()
        return None if total is None else max(0.0, self.started_at + total - now)


def views(raw: Iterable[Mapping[str, Any]]) -> list[RankView]:
    """Each shard's newest attempt's ranks (beats with `todo`: workers that report it), with their fences (pure)."""
    beats, fences = [], {}
    for r in raw:
        v = values(dict(r))
        if is_fence(str(v["sk"])):
            f = Fence.of(v)
            fences[(f.shard, f.rank)] = f
        elif "todo" in v:
            beats.append(v)
    newest: dict[int, int] = {}
    for b in beats:
        newest[int(b["shard"])] = max(newest.get(int(b["shard"]), 0), int(b["attempt"]))
    return [
        RankView(
            shard=int(b["shard"]),
            attempt=int(b["attempt"]),
            rank=int(b["rank"]),
            processed=int(b["processed"]),
            todo=int(b["todo"]),
            started_at=float(b["started_at"]),
            ready_at=float(b["ready_at"]) if "ready_at" in b else None,
            moved_at=float(b["moved_at"]),
            fence=fences.get((int(b["shard"]), int(b["rank"]))),
        )
        for b in beats
        if int(b["attempt"]) == newest[int(b["shard"])]
    ]


@dataclass(frozen=True)
class Split:
    """One split decided: [at, hi) of `shard`'s slice [lo, hi) goes to the new shard `to`."""

    shard: int
    lo: int
    hi: int
    at: int
    to: int
    attempt: int
    rank: int
    expected_s: float
    median_s: float
    child_s: float

    @property
    def keys(self) -> int:
        return self.hi - self.at

    def event(self, job_id: str | None = None) -> SplitShard:
        return SplitShard(
            shard=self.shard,
            at=self.at,
            to_shard=self.to,
            keys=self.keys,
            expected_s=round(self.expected_s, 1),
            median_s=round(self.median_s, 1),
            child_s=round(self.child_s, 1),
            job_id=job_id,
        )


@dataclass(frozen=True)
class Tail:
    """What the sweep knows of the run's tail when it decides (RunItem and ledger figures)."""

    now: float
    shards_total: int  # every shard of the run, split children included
    shards_done: int
    next_shard: int  # the number the next split child gets
    spent_s: float  # split children's estimated seconds so far (the cap's)


def median_s(ranks: list[RankView]) -> float | None:
    """The run's median expected shard time (ranks with a rate)."""
    totals = [t for r in ranks if (t := r.total_s()) is not None]
    return statistics.median(totals) if totals else None


def startup_s(ranks: list[RankView], settings: Settings) -> float:
    """A split child's expected start-up: the run's median container start to model ready, plus the instance wait."""
    loads = [r.ready_at - r.started_at for r in ranks if r.ready_at is not None]
    return (statistics.median(loads) if loads else 0.0) + settings.split_startup_s


def split_point(r: RankView, fence: Fence, median_rate: float, startup: float) -> int:
    """Where the slow rank and a child started now finish together: slow x/rs = startup + (R - x)/rm."""
    rs = r.rate or 0.0
    pos = max(fence.reserved_to, fence.lo + r.processed)  # its keys are started in order from lo
    left = fence.hi - pos
    x = (startup + left / median_rate) / (1 / rs + 1 / median_rate) if rs > 0 else 0.0
    return max(fence.reserved_to, pos + int(x))


def decide(ranks: list[RankView], tail: Tail, settings: Settings) -> list[Split]:
    """The splits to make now, slowest first (pure)."""
    if settings.split_after <= 0 or tail.shards_total <= 0:
        return []
    started = len({r.shard for r in ranks})
    if started < tail.shards_total and tail.shards_done < settings.split_from * tail.shards_total:
        return []  # the queue still holds shards: a free GPU has work without a split
    median = median_s(ranks)
    rates = [rate for r in ranks if (rate := r.rate) is not None]
    if median is None or not rates:
        return []
    median_rate = statistics.median(rates)
    startup = startup_s(ranks, settings)
    # The run's expected GPU time: each rank's expected total, the median for a shard without one yet.
    expected = sum(r.total_s() or median for r in ranks) + median * max(0, tail.shards_total - started)
    budget = settings.split_share * expected - tail.spent_s
    out: list[Split] = []
    slow = sorted(
        (r for r in ranks if not r.done and (t := r.total_s()) is not None and t > settings.split_after * median),
        key=lambda r: -(r.left_s(tail.now) or 0.0),
    )
    # Every shard has started, so the child waits for a GPU to free: the soonest end of the others running.
    wait = min((_left(r, median, tail.now) for r in ranks if not r.done and r not in slow), default=0.0)
    for r in slow:
        f = r.fence
        if f is None or f.split_at is not None or f.attempt != r.attempt or len(out) >= settings.split_per_sweep:
            continue
        left = r.left_s(tail.now) or 0.0
        if left <= wait + startup + settings.split_min_keys / median_rate:
            continue  # a child could not finish its keys before the slow rank does
        at = min(split_point(r, f, median_rate, wait + startup), f.hi - settings.split_min_keys)
        if at < f.reserved_to:
            continue  # too few keys left past its reservation
        child_s = startup + (f.hi - at) / median_rate  # GPU time: its start-up and its keys, not the wait
        if child_s > budget:
            continue
        budget -= child_s
        out.append(Split(r.shard, f.lo, f.hi, at, tail.next_shard + len(out), r.attempt, r.rank, left, median, child_s))
    return out


def _left(r: RankView, median: float, now: float) -> float:
    """A running rank's expected seconds to its end; one without a rate yet is given the median shard time."""
    left = r.left_s(now)
    return left if left is not None else max(0.0, r.started_at + median - now)


def plan_view(settings: Settings, mode: str, cost: Mapping[str, Any]) -> dict[str, Any] | None:
    """`sluice plan`'s tail: the split policy and its worst case (the cap's share of the run's cost); None when off."""
    if settings.split_after <= 0 or mode == "multinode":
        return None
    usd = cost.get("on_demand_usd")
    return {
        "split_after": settings.split_after,
        "split_from": settings.split_from,
        "min_keys": settings.split_min_keys,
        "share": settings.split_share,
        "per_sweep": settings.split_per_sweep,
        "startup_s": settings.split_startup_s,
        "worst_gpu_hours": round(settings.split_share * float(cost.get("gpu_hours", 0.0)), 2),
        "worst_usd": round(settings.split_share * float(usd), 2) if usd is not None else None,
    }


def plan_lines(t: Mapping[str, Any] | None) -> list[str]:
    """The plan report's lines for the tail."""
    if t is None:
        return ["tail            no splits (SLUICE_SPLIT_AFTER=0, or a multi-node run)"]
    usd = f", about ${t['worst_usd']:,.2f} On-Demand" if t.get("worst_usd") is not None else ""
    return [
        f"tail            a rank expected past {t['split_after']:g}x the median shard time has its remaining keys split"
        f" off to a new shard, once every shard started or {t['split_from']:.0%} are done",
        f"                at most {t['share']:.0%} more GPU time: {t['worst_gpu_hours']:,.2f} GPU-hours{usd} "
        f"(SLUICE_SPLIT_SHARE); each side keeps {t['min_keys']} keys or more",
    ]


def slowest(ranks: list[RankView], now: float, n: int = 3) -> list[dict[str, Any]]:
    """The `n` running ranks expected to end last, for `sluice status` (pure)."""
    median = median_s(ranks)
    running = [(r, left) for r in ranks if not r.done and (left := r.left_s(now)) is not None]
    running.sort(key=lambda x: -x[1])
    return [
        {
            "shard": r.shard,
            "rank": r.rank,
            "attempt": r.attempt,
            "processed": r.processed,
            "todo": r.todo,
            "keys_per_s": round(r.rate or 0.0, 2),
            "ends_in_s": round(left, 1),
            "vs_median": round((r.total_s() or 0.0) / median, 2) if median else None,
            "median_s": round(median, 1) if median else None,
        }
        for r, left in running[:n]
    ]


__all__ = [
    "RankView",
    "Split",
    "Tail",
    "decide",
    "median_s",
    "plan_lines",
    "plan_view",
    "slowest",
    "split_point",
    "startup_s",
    "views",
]
