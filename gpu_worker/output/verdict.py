"""The worker's verdict on its shard, decided here once: the threshold, ok or not, and why.

sink.write_shard_result turns the shard's failure lines into ShardResult's verdict fields
with `judge`; the node (main.py) takes the threshold from `threshold` and, when the shard is
not ok, exits 1 with `exit_reason`. Only failures caused by the data count: transient ones
(throttling that outlived every retry) go to the run's retry pass, so they never fail a shard.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gpu_worker.config import WorkerConfig
from sluice.contracts.plan import RunPlan
from sluice.contracts.results import FailureLine, ShardResult, over_threshold
from sluice.contracts.status import TRANSIENT_FAILURE_REASONS, FailureReason


def threshold(cfg: WorkerConfig, plan: RunPlan) -> float:
    """The failed fraction a shard may reach: SLUICE_WORKER_MAX_FAILED_FRACTION when set (>= 0), else the plan's."""
    return cfg.max_failed_fraction if cfg.max_failed_fraction >= 0 else plan.max_failed_fraction


@dataclass(frozen=True)
class Verdict:
    """ShardResult's verdict fields, named as there (sluice.contracts.results.ShardResult documents each)."""

    failed: int
    failed_transient: int
    failed_fraction: float
    max_failed_fraction: float
    ok: bool
    failed_by_reason: dict[FailureReason, int]
    reason: str | None


def judge(failures: Sequence[FailureLine], n_keys: int, max_failed_fraction: float) -> Verdict:
    """The verdict on a shard of `n_keys` keys whose keys failed as `failures` (one line per failed key)."""
    transient = sum(1 for f in failures if f.reason in TRANSIENT_FAILURE_REASONS)
    data_failed = len(failures) - transient
    fraction = data_failed / n_keys if n_keys else 0.0
    by_reason = dict(sorted(Counter(f.reason for f in failures).items()))
    ok = fraction <= max_failed_fraction
    data = {str(r): n for r, n in by_reason.items() if r not in TRANSIENT_FAILURE_REASONS}
    return Verdict(
        failed=len(failures),
        failed_transient=transient,
        failed_fraction=round(fraction, 6),
        max_failed_fraction=max_failed_fraction,
        ok=ok,
        failed_by_reason=by_reason,
        reason=None if ok else over_threshold(data_failed, n_keys, fraction, max_failed_fraction, data),
    )


def exit_reason(result: ShardResult) -> str:
    """The node's one-line reason for exiting 1 on a shard that is not ok."""
    return f"shard {result.shard}: {result.reason}"
