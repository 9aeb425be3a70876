"""The tail's decision, pure (sluice.control.sweep.stragglers): who is slow, where the split goes, the cap."""

from __future__ import annotations

from sluice.contracts.tail import Fence
from sluice.control.sweep.stragglers import RankView, Tail, decide, median_s, plan_lines, plan_view, split_point
from sluice.settings import Settings

NOW = 1000.0


def _rank(shard: int, processed: int, todo: int = 400, rate: float = 100.0, reserved: int | None = None) -> RankView:
    """A rank that started 5 s before it was ready, and has gone at `rate` since, up to now."""
    ready = NOW - processed / rate
    fence = Fence(
        shard=shard, lo=0, hi=todo, reserved_to=reserved if reserved is not None else processed, attempt=1, rank=0
    )
    return RankView(shard, 1, 0, processed, todo, ready - 5.0, ready, NOW, fence)


def _settings(**kw: object) -> Settings:
    return Settings.from_values({"split_startup_s": 0.0, **kw})


def test_a_rank_past_twice_the_median_is_split_where_both_sides_end_together():
    fast = [_rank(i, 400) for i in (1, 2, 3)]  # 5 s load + 4 s: 9 s each
    slow = _rank(0, 40, rate=10.0, reserved=60)  # 5 s + 400 / 10 = 45 s: 5x the median
    (s,) = decide([slow, *fast], Tail(NOW, 4, 3, next_shard=4, spent_s=0.0), _settings())
    assert (s.shard, s.to, s.hi) == (0, 4, 400)
    # From position 60: x / 10 = 5 + (340 - x) / 100  ->  x = (5 + 3.4) / (0.1 + 0.01) = 76.4
    assert s.at == 60 + 76
    assert s.median_s == 9.0 and round(s.child_s, 2) == round(5.0 + (400 - s.at) / 100.0, 2)
    assert split_point(slow, slow.fence, 100.0, 5.0) == s.at  # type: ignore[arg-type]


def test_nothing_is_split_while_the_queue_holds_shards_and_few_are_done():
    ranks = [_rank(1, 400), _rank(2, 400), _rank(3, 400), _rank(0, 40, rate=10.0)]
    assert decide(ranks, Tail(NOW, 8, 3, next_shard=8, spent_s=0.0), _settings()) == []  # 4 of 8 started, 3 done
    assert decide(ranks, Tail(NOW, 8, 4, next_shard=8, spent_s=0.0), _settings())  # half done: it may


def test_a_rank_near_the_median_a_split_slice_or_the_cap_stop_it():
    fast = [_rank(i, 400) for i in (1, 2, 3)]
    near = _rank(0, 200, rate=60.0)  # 5 + 6.7 = 11.7 s: under 2x the median
    assert decide([near, *fast], Tail(NOW, 4, 3, 4, 0.0), _settings()) == []
    slow = _rank(0, 40, rate=10.0)
    done_already = RankView(**{**slow.__dict__, "fence": slow.fence.model_copy(update={"split_at": 300})})  # type: ignore[union-attr]
    assert decide([done_already, *fast], Tail(NOW, 4, 3, 4, 0.0), _settings()) == []
    assert decide([slow, *fast], Tail(NOW, 4, 3, 4, 0.0), _settings(split_share=0.05)) == []  # cap: 3.6 s
    assert decide([slow, *fast], Tail(NOW, 4, 3, 4, 0.0), _settings(split_after=0)) == []  # off
    tight = _rank(0, 360, rate=10.0, reserved=380)  # 20 keys past its reservation: under 2 x 32
    assert decide([tight, *fast], Tail(NOW, 4, 3, 4, 0.0), _settings()) == []


def test_the_median_and_the_plan_view():
    assert median_s([_rank(i, 400) for i in range(3)] + [_rank(3, 40, rate=10.0)]) == 9.0
    view = plan_view(_settings(), "array", {"gpu_hours": 100.0, "on_demand_usd": 200.0})
    assert view is not None and (view["worst_gpu_hours"], view["worst_usd"]) == (25.0, 50.0)
    assert "at most 25% more GPU time: 25.00 GPU-hours, about $50.00 On-Demand" in plan_lines(view)[1]
    assert plan_view(_settings(), "multinode", {"gpu_hours": 1.0}) is None
    assert plan_lines(None) == ["tail            no splits (SLUICE_SPLIT_AFTER=0, or a multi-node run)"]


def test_the_child_waits_for_a_gpu_to_free_so_the_slow_rank_keeps_more():
    done = [_rank(i, 400) for i in (1, 2)]
    slow = _rank(0, 40, rate=10.0, reserved=60)
    busy = RankView(3, 1, 0, 0, 400, NOW - 1.0, None, NOW - 1.0, None)  # started 1 s ago: ~8 s to go (median 9)
    tail = Tail(NOW, 4, 2, next_shard=4, spent_s=0.0)
    (free,) = decide([slow, *done], tail, _settings())
    (waiting,) = decide([slow, *done, busy], tail, _settings())
    # From 60: (5 + 8 + 3.4) / 0.11 = 149 keys stay, against 76 with a free GPU; its GPU time is the same formula.
    assert (free.at, waiting.at) == (60 + 76, 60 + 149)
    assert round(waiting.child_s, 2) == round(5.0 + (400 - waiting.at) / 100.0, 2)
