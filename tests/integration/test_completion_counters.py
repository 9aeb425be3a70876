"""A run decided from its counters alone gives exactly what its SHARD items give."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sluice.contracts.status import FailureReason
from sluice.control.completion.verdict import figures_from_items
from sluice.control.table.items import reason_counter
from sluice.control.table.records import COUNTER_SHARDS, ShardRecords, counter_sk
from tests.integration.completion_support import job_event, submit_run, write_result
from tests.integration.helpers import INPUT_BUCKET, bus_events

CHILD_DONE = ["batch-array-child-running", "batch-array-child-succeeded"]


class CountingDynamoDB:
    """A DynamoDB client whose calls are counted by operation name."""

    def __init__(self, client: Any) -> None:
        self._client, self.calls, self.queried = client, Counter[str](), list[str]()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._client, name)
        if not callable(fn):
            return fn

        def call(*a: Any, **kw: Any) -> Any:
            self.calls[name] += 1
            if name == "query":  # which items: SHARD#, FAIL#, RETRY#, JOB#
                self.queried.append(kw["ExpressionAttributeValues"][":p"]["S"])
            return fn(*a, **kw)

        return call


def _failures(shard: int) -> list[tuple[str, str]]:
    """Data failures below the shard's threshold: each shard still succeeds."""
    reasons = ["corrupt", "not_image", "missing"]
    return [(f"s3://{INPUT_BUCKET}/img/{shard}-{j}.jpg", reasons[(shard + j) % 3]) for j in range(1 + shard % 3)]


def _run_to_the_end(aws, stack, monkeypatch, name, *, strip_reasons=False, transient_shard=None, bad_shard=None):
    """A 4-shard run whose every shard succeeds (some with data failures), delivered to its last event.

    Returns (outcome events, DynamoDB calls of the last event, the tally of the SHARD items).
    """
    from sluice.aws import clients as sluice_aws
    from sluice.aws.clients import Clients
    from sluice.control.completion.batch_events import BatchJobStateChangeEvent
    from sluice.control.completion.state_change import handle_job_event
    from sluice.settings import Settings

    out = submit_run(aws, stack, monkeypatch, n_keys=40, keys_per_shard=10, name=name)
    run_id, job_id = out["run_id"], out["job_ids"][0]
    bus_events(aws, stack)
    for i in range(4):
        failures = _failures(i)
        if i == transient_shard:
            failures.append((f"s3://{INPUT_BUCKET}/img/t.jpg", "s3_error_transient"))
        if i == bad_shard:  # 6 of 10 keys corrupt: over the shard's 50% threshold
            failures = [(f"s3://{INPUT_BUCKET}/img/{i}-bad-{j}.jpg", "corrupt") for j in range(6)]
        # GPU workers: 8 GPUs for 900 s each, so each shard is 2 GPU-hours.
        write_result(
            aws, stack, run_id, i, processed=10 - len(failures), failures=failures, device="cuda", world=8, seconds=900
        )
    for k, v in stack.env_for("HandleManifestUploadFunction").items():
        monkeypatch.setenv(k, v)
    settings = Settings.from_env()
    queue = stack.names["GpuJobQueue"]

    def ev(sample, child=None):
        raw = job_event(sample, run_id=run_id, job_id=job_id, queue=queue, child=child)
        return BatchJobStateChangeEvent.model_validate(raw).detail

    for i in range(4):
        for sample in CHILD_DONE:
            handle_job_event(ev(sample, i), settings=settings)
    if strip_reasons:
        # Counters as a run started before the per-reason sums existed left them.
        names = [reason_counter(r) for r in FailureReason] + ["keys_transient"]
        for k in range(min(4, COUNTER_SHARDS)):  # the counters of shards 0-3
            aws.dynamodb.update_item(
                TableName=stack.names["RunsTable"],
                Key={"pk": {"S": run_id}, "sk": {"S": counter_sk(k)}},
                UpdateExpression="REMOVE " + ", ".join(names),
            )
    counting = CountingDynamoDB(sluice_aws.client("dynamodb"))
    last = handle_job_event(ev("batch-array-parent-succeeded"), settings=settings, clients=Clients(dynamodb=counting))
    t = ShardRecords(aws.dynamodb, stack.names["RunsTable"])
    truth = figures_from_items(4, t.shard_items(run_id), t.job_items(run_id))
    outcomes = [e for e in bus_events(aws, stack) if e["detail-type"] in ("Run Succeeded", "Run Failed")]
    return last, outcomes, counting, truth


def _figures(detail: dict[str, Any]) -> tuple[Any, ...]:
    keys = ("processed", "failed", "failed_by_reason", "retry_passes", "gpu_hours", "cost_usd")
    return tuple(detail[k] for k in keys)


def test_a_succeeded_run_is_decided_from_its_counters_without_reading_shard_items(aws, stack, monkeypatch):
    last, (outcome,), ddb, truth = _run_to_the_end(aws, stack, monkeypatch, "fast")
    assert last.status == "finalized" and outcome["detail-type"] == "Run Succeeded"
    assert ddb.calls["query"] == 0, ddb.calls  # no SHARD, mark or JOB item was read
    by_reason = {r.value: n for r, n in sorted(truth.by_reason.items())}
    d = outcome["detail"]
    assert (
        _figures(d)[:5]
        == (truth.processed, truth.failed, by_reason, 0, truth.gpu_seconds / 3600)
        == (33, 7, by_reason, 0, 8.0)
    )
    # 8 GPU-hours on the default family (g6e, $1.861 an hour On-Demand, Spot at 40%).
    assert d["cost_usd"]["family"] == "g6e" and (d["cost_usd"]["on_demand"], d["cost_usd"]["spot"]) == (14.89, 5.96)
    assert by_reason == {"corrupt": 3, "missing": 2, "not_image": 2}


def test_counters_without_reason_sums_fall_back_to_the_items_with_the_same_outcome(aws, stack, monkeypatch):
    _, (fast,), _, _ = _run_to_the_end(aws, stack, monkeypatch, "fast")
    last, (slow,), ddb, _ = _run_to_the_end(aws, stack, monkeypatch, "slow", strip_reasons=True)
    assert last.status == "finalized" and ddb.queried == ["SHARD#", "JOB#"]  # every item read
    assert slow["detail-type"] == fast["detail-type"] == "Run Succeeded"
    assert _figures(slow["detail"]) == _figures(fast["detail"])


def test_a_transient_failure_with_a_retry_pass_left_is_not_decided_from_counters(aws, stack, monkeypatch):
    last, outcomes, ddb, _ = _run_to_the_end(aws, stack, monkeypatch, "transient", transient_shard=2)
    assert last.status == "retrying" and outcomes == []  # the retry pass takes the transient key
    assert ddb.queried == ["RETRY#"]  # the shards with transient failures, not every shard


def test_a_failed_run_reads_only_its_failed_shards_and_names_them_as_every_item_would(aws, stack, monkeypatch):
    last, (marked,), ddb, truth = _run_to_the_end(aws, stack, monkeypatch, "bad", bad_shard=1)
    assert last.status == "finalized" and marked["detail-type"] == "Run Failed"
    assert ddb.queried == ["FAIL#"]
    d = marked["detail"]
    assert d["shards_failed"] == [1] and d["reason"] == truth.reason()
    assert (
        d["reason"] == "1 of 4 shards failed: shard 1 (6 of 10 keys failed for their data (60.00% > 50.00%): corrupt 6)"
    )
    _, (legacy,), ddb2, _ = _run_to_the_end(aws, stack, monkeypatch, "bad-legacy", bad_shard=1, strip_reasons=True)
    assert ddb2.queried == ["SHARD#", "JOB#"]
    same = ("reason", "shards_failed", "processed", "failed", "gpu_hours", "cost_usd")
    assert {k: legacy["detail"][k] for k in same} == {k: d[k] for k in same}


@pytest.mark.parametrize("reason", list(FailureReason))
def test_every_failure_reason_has_a_counter(reason):
    from sluice.control.table.items import CounterItem

    assert reason_counter(reason) in CounterItem.model_fields
