"""The Batch adapter's error translation, on a real (moto) Batch client."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from sluice.control.batch import BatchAdapter
from sluice.errors import RetriableError, SubmissionError
from sluice.settings import Settings
from tests.unit.test_batch import _plan


def _refusing(code: str, status: int):
    """A real (moto) Batch client whose ListJobs (the look-up before submitting) and SubmitJob fail so."""

    def refuse(**_: object) -> None:
        raise ClientError(
            {"Error": {"Code": code, "Message": "nope"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "SubmitJob"
        )

    client = boto3.client("batch", region_name="us-east-1")
    for op in ("ListJobs", "SubmitJob"):
        client.meta.events.register(f"before-call.batch.{op}", refuse)
    return client


def test_throttling_is_retriable_and_a_missing_queue_is_fatal_with_advice():
    plan = _plan()
    with mock_aws():
        with pytest.raises(RetriableError, match=r"TooManyRequestsException.*will retry"):
            BatchAdapter(_refusing("TooManyRequestsException", 429)).submit(plan, "s3://c/p.json", Settings())
        with pytest.raises(SubmissionError, match="Check that the queue and job definition exist"):
            BatchAdapter(_refusing("ClientException", 400)).submit(plan, "s3://c/p.json", Settings())
