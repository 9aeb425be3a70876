"""The sweep's pure rules: which attempt is stalled (control.sweep.stall), which RUNNABLE causes to tell (waiting)."""

from __future__ import annotations

from sluice.contracts.status import JobStatus
from sluice.control.sweep.stall import Beat, candidates, still_running
from sluice.control.sweep.waiting import NO_REASON, causes
from sluice.control.table.items import ShardItem

NOW = 10_000.0


def _beat(shard: int, attempt: int, rank: int, still_s: float, limit: float = 60) -> Beat:
    return Beat(shard, attempt, rank, f"j:{shard}", 5, NOW - still_s, limit)


def _shard(status: JobStatus, attempt: int) -> ShardItem:
    return ShardItem(
        pk="r", sk="SHARD#000000", shard=0, status=status, seq=attempt * 10 + status.rank, attempt=attempt,
        job_id="j:0", updated_at=0, terminal=status.terminal or None,
    )  # fmt: skip


def test_only_a_rank_still_longer_than_its_limit_in_the_newest_attempt_is_stalled():
    beats = [
        _beat(0, 1, 0, 100),  # attempt 1 of shard 0: old, superseded by attempt 2
        _beat(0, 2, 0, 10),  # moving
        _beat(1, 1, 0, 30),
        _beat(1, 1, 1, 90),  # one rank of shard 1 stopped: the attempt is stalled
        _beat(2, 1, 0, 59.9),  # slow but under its limit
        _beat(3, 1, 0, 200, limit=300),  # loading: its limit has the load grace
    ]
    assert [(b.shard, b.attempt, b.rank) for b in candidates(beats, NOW)] == [(1, 1, 1)]


def test_a_finished_or_superseded_attempt_is_left_alone():
    b = _beat(0, 2, 0, 100)
    assert still_running(b, None) and still_running(b, _shard(JobStatus.RUNNING, 2))
    assert not still_running(b, _shard(JobStatus.SUCCEEDED, 2))  # finished before the sweep came
    assert not still_running(b, _shard(JobStatus.RUNNING, 3))  # a newer attempt runs
    assert still_running(b, _shard(JobStatus.FAILED, 1))  # the ledger lags: an older attempt's end


def test_runnable_causes_are_grouped_by_reason_and_only_past_the_limit():
    jobs = [
        {"jobId": "a:0", "status": "RUNNABLE", "createdAt": (NOW - 4000) * 1000, "statusReason": "CAPACITY:X"},
        {"jobId": "a:1", "status": "RUNNABLE", "createdAt": (NOW - 2000) * 1000, "statusReason": "CAPACITY:X"},
        {"jobId": "a:2", "status": "RUNNABLE", "createdAt": (NOW - 100) * 1000, "statusReason": "CAPACITY:X"},
        {"jobId": "a:3", "status": "RUNNABLE", "createdAt": (NOW - 4000) * 1000},
        # retried: RUNNABLE again since its last attempt ended, 100 s ago
        {"jobId": "a:4", "status": "RUNNABLE", "createdAt": 0, "attempts": [{"stoppedAt": (NOW - 100) * 1000}]},
        {"jobId": "a:5", "status": "RUNNING", "createdAt": 0},
    ]
    got = {c.reason: c for c in causes(jobs, NOW, 1800)}
    assert set(got) == {"CAPACITY:X", NO_REASON}
    assert (got["CAPACITY:X"].jobs, got["CAPACITY:X"].waiting_s, got["CAPACITY:X"].job_ids) == (2, 4000, ["a:0", "a:1"])
    assert got[NO_REASON].jobs == 1
