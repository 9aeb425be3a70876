"""Transient failures free the claim for the retried delivery; fatal submission errors fail the run."""

from __future__ import annotations

import json

import pytest

from sluice.errors import RetriableError
from sluice.ledger import Ledger
from tests.integration.helpers import INPUT_BUCKET, all_jobs, bus_events, deliver, object_created_event


def _upload(aws, stack, key: str) -> dict:
    control = stack.names["ControlBucket"]
    body = json.dumps({"version": 1, "input": {"keys": ["a.jpg", "b.jpg"], "bucket": INPUT_BUCKET}})
    put = aws.s3.put_object(Bucket=control, Key=key, Body=body)
    return object_created_event(control, key, put, len(body))


def test_transient_failure_releases_the_claim_and_the_retry_submits(aws, stack, monkeypatch):
    event = _upload(aws, stack, "manifests/retry.json")
    # The scratch bucket is missing: writing shards fails, as a throttled/unavailable S3 would.
    with pytest.raises(RetriableError, match="writing s3://missing-scratch"):
        deliver(stack, event, monkeypatch, extra_env={"SLUICE_CONTROL_BUCKET": "missing-scratch"})
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    (item,) = aws.dynamodb.scan(TableName=stack.names["RunsTable"])["Items"]
    run_id = item["pk"]["S"]
    assert ledger.get(run_id)["status"] == "RELEASED"
    assert all_jobs(aws) == [] and bus_events(aws, stack) == []

    out = deliver(stack, event, monkeypatch, extra_env={"SLUICE_CONTROL_BUCKET": stack.names["ControlBucket"]})
    assert out["status"] == "submitted" and out["run_id"] == run_id
    assert ledger.get(run_id)["status"] == "SUBMITTED"
    assert len(all_jobs(aws)) == 1


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
    assert Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])["status"] == "FAILED"
