"""The worker's verdict on a shard, decided in gpu_worker.output.verdict: the threshold, ok, and the reason text."""

from __future__ import annotations

from gpu_worker.config import WorkerConfig
from gpu_worker.output.verdict import exit_reason, judge, threshold
from sluice.contracts.results import FailureLine, ShardResult
from sluice.contracts.status import FailureReason
from tests.plans import run_plan


def _lines(*reasons: str) -> list[FailureLine]:
    return [FailureLine(key=f"s3://b/{i}.jpg", reason=r, attempt=1) for i, r in enumerate(reasons)]


def test_the_worker_setting_overrides_the_plans_threshold():
    plan = run_plan("r", "s3://c/runs/r/", total_keys=1, max_failed_fraction=0.05)
    assert threshold(WorkerConfig(), plan) == 0.05  # unset (-1): the plan's
    assert threshold(WorkerConfig(max_failed_fraction=0.0), plan) == 0.0
    assert threshold(WorkerConfig(max_failed_fraction=0.5), plan) == 0.5


def test_only_data_failures_count_and_the_reason_names_them():
    failures = _lines("s3_error_transient", "not_image", "corrupt", "not_image", "s3_error_transient")
    v = judge(failures, 32, 0.05)
    assert (v.failed, v.failed_transient, v.failed_fraction, v.ok) == (5, 2, 0.09375, False)
    assert v.failed_by_reason == {
        FailureReason.CORRUPT: 1,
        FailureReason.NOT_IMAGE: 2,
        FailureReason.S3_ERROR_TRANSIENT: 2,
    }
    assert v.reason == "3 of 32 keys failed for their data (9.38% > 5.00%): not_image 2, corrupt 1"
    assert judge(failures, 32, 0.1).reason is None  # 9.38% is within 10%


def test_transient_failures_alone_never_fail_a_shard():
    v = judge(_lines("s3_error_transient", "s3_error_transient"), 2, 0.0)
    assert (v.failed_fraction, v.ok, v.reason) == (0.0, True, None)
    assert judge([], 0, 0.0).ok  # an empty shard


def test_the_node_exits_with_the_shards_reason():
    plan = run_plan("r", "s3://c/runs/r/", total_keys=4)
    v = judge(_lines("bomb", "bomb"), 4, plan.max_failed_fraction)
    result = ShardResult(
        run_id="r", shard=3, node=3, attempt=1, kind="array", device="cpu", world=1, seconds=1.0,
        pipeline_seconds=1.0, pipeline_window=[], resumed_chunks=0, stats={}, n_keys=4, processed=2, chunks=1,
        failed=v.failed, failed_transient=v.failed_transient, failed_fraction=v.failed_fraction,
        max_failed_fraction=v.max_failed_fraction, ok=v.ok, failed_by_reason=v.failed_by_reason, reason=v.reason,
    )  # fmt: skip
    assert exit_reason(result) == "shard 3: 2 of 4 keys failed for their data (50.00% > 5.00%): bomb 2"
