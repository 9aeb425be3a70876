"""Transient failures free the claim for the retried delivery; fatal submission errors fail the run."""

from __future__ import annotations

import json
import re

import pytest
from botocore.exceptions import ClientError

from sluice.aws import clients as sluice_aws
from sluice.control.table.ledger import Ledger
from sluice.errors import RetriableError
from tests.integration.helpers import INPUT_BUCKET, all_jobs, bus_events, deliver, put_manifest


def _upload(aws, stack, key: str) -> dict:
    body = json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"keys": ["a.jpg", "b.jpg"], "bucket": INPUT_BUCKET},
        }
    )
    return put_manifest(aws, stack, key, body)


def _unavailable(**_: object) -> None:
    """S3 answering 503 ServiceUnavailable (not SlowDown), after botocore's own retries."""
    raise ClientError(
        {
            "Error": {"Code": "ServiceUnavailable", "Message": "Please reduce your request rate."},
            "ResponseMetadata": {"HTTPStatusCode": 503},
        },
        "PutObject",
    )


def test_transient_failure_releases_the_claim_and_the_retry_submits(aws, stack, monkeypatch):
    event = _upload(aws, stack, "manifests/retry.json")
    s3 = sluice_aws.client("s3")
    s3.meta.events.register("before-call.s3.PutObject", _unavailable, unique_id="unavailable")
    try:
        with pytest.raises(RetriableError, match=r"writing s3://.*ServiceUnavailable.*will retry"):
            deliver(stack, event, monkeypatch)
    finally:
        s3.meta.events.unregister("before-call.s3.PutObject", unique_id="unavailable")
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    (item,) = aws.dynamodb.scan(TableName=stack.names["RunsTable"])["Items"]
    run_id = item["pk"]["S"]
    assert ledger.get(run_id).status == "RELEASED"
    assert all_jobs(aws) == [] and bus_events(aws, stack) == []

    out = deliver(stack, event, monkeypatch)
    assert out["status"] == "submitted" and out["run_id"] == run_id
    assert ledger.get(run_id).status == "SUBMITTED"
    assert len(all_jobs(aws)) == 1


def test_a_missing_bucket_fails_the_run_with_advice_instead_of_retrying(aws, stack, monkeypatch):
    event = _upload(aws, stack, "manifests/nobucket.json")
    out = deliver(stack, event, monkeypatch, extra_env={"SLUICE_CONTROL_BUCKET": "missing-scratch"})
    assert out["status"] == "failed"
    assert re.search(r"writing s3://missing-scratch.*NoSuchBucket.*check that it exists", out["reasons"][0])
    (ev,) = bus_events(aws, stack)
    assert ev["detail-type"] == "Run Failed" and ev["detail"]["stage"] == "plan"
    assert Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"]).status == "FAILED"
    assert all_jobs(aws) == []
    # A redelivery is a duplicate: nothing is planned or announced twice.
    assert deliver(stack, event, monkeypatch, extra_env={"SLUICE_CONTROL_BUCKET": "missing-scratch"})["status"] == (
        "duplicate"
    )
    assert bus_events(aws, stack) == []


def test_a_claim_whose_holder_died_can_be_taken_over_after_its_lease(aws, stack):
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim("r1", "s3://b/manifests/x.json", lease_s=60, now=1_000)
    assert not ledger.claim("r1", "s3://b/manifests/x.json", now=1_030)  # holder still within its lease
    assert ledger.claim("r1", "s3://b/manifests/x.json", now=1_061)  # lease over: taken over


def test_batch_refusal_fails_the_run_with_advice(aws, stack, monkeypatch):
    event = _upload(aws, stack, "manifests/noqueue.json")
    out = deliver(stack, event, monkeypatch, extra_env={"SLUICE_JOB_QUEUE": "no-such-queue"})
    assert out["status"] == "failed"
    assert "Check that the queue and job definition exist" in out["reasons"][0]
    (ev,) = bus_events(aws, stack)
    assert ev["detail-type"] == "Run Failed" and ev["detail"]["run_id"] == out["run_id"]
    # The documented type: a list of shard indexes (empty here), like completion's Run Failed.
    assert ev["detail"]["shards_failed"] == [] and ev["detail"]["stage"] == "submit"
    assert Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"]).status == "FAILED"
