"""S3 GETs: failure classification and our retries on top of botocore."""

from __future__ import annotations

import io
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError, ReadTimeoutError

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ObjectFailure, WorkerError
from gpu_worker.sources.fetch import Fetcher, classify
from gpu_worker.telemetry.stats import Stats
from sluice.contracts.status import FailureReason


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


@pytest.mark.parametrize(
    ("exc", "reason", "transient"),
    [
        (client_error("NoSuchKey", 404), FailureReason.MISSING, False),
        (client_error("AccessDenied", 403), FailureReason.ACCESS_DENIED, False),
        (client_error("InvalidObjectState", 403), FailureReason.ACCESS_DENIED, False),
        (client_error("InvalidObjectState", 400), FailureReason.S3_ERROR, False),
        (client_error("SlowDown", 503), FailureReason.S3_ERROR_TRANSIENT, True),
        (client_error("", 429), FailureReason.S3_ERROR_TRANSIENT, True),
        (client_error("InternalError", 500), FailureReason.S3_ERROR_TRANSIENT, True),
        (client_error("RequestTimeout", 400), FailureReason.S3_ERROR_TRANSIENT, True),
        (EndpointConnectionError(endpoint_url="http://x"), FailureReason.S3_ERROR_TRANSIENT, True),
        (ReadTimeoutError(endpoint_url="http://x"), FailureReason.S3_ERROR_TRANSIENT, True),
    ],
)
def test_classify(exc, reason, transient):
    f = classify(exc)
    assert (f.reason, f.transient) == (reason, transient)


class FakeClient:
    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls = 0

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        step = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        if isinstance(step, BaseException):
            raise step
        return {"Body": io.BytesIO(step), "ContentLength": len(step), "ResponseMetadata": {"RetryAttempts": 2}}


def fetcher(script: list[Any], **cfg: Any) -> tuple[Fetcher, FakeClient, list[float], Stats]:
    sleeps: list[float] = []
    stats = Stats()
    client = FakeClient(script)
    return Fetcher(WorkerConfig(**cfg), client, stats, sleep=sleeps.append), client, sleeps, stats


def test_immediate_retries_with_capped_exponential_full_jitter():
    slow = client_error("SlowDown", 503)
    f, client, sleeps, stats = fetcher([slow, slow, slow, b"data"], retries=3, backoff_base_s=0.1, backoff_max_s=0.3)
    assert f.get("b", "k").data == b"data"
    assert client.calls == 4
    assert len(sleeps) == 3
    assert all(0 <= s <= cap for s, cap in zip(sleeps, [0.1, 0.2, 0.3]))
    assert stats.get("s3_retries") == 3 and stats.get("s3_botocore_retries") == 2 and stats.get("s3_gets") == 1


def test_still_transient_after_the_retries_is_raised_as_transient():
    f, client, _, _ = fetcher([client_error("SlowDown", 503)], retries=2)
    with pytest.raises(ObjectFailure) as info:
        f.get("b", "k")
    assert info.value.transient and client.calls == 3
    f, client, sleeps, _ = fetcher(
        [client_error("SlowDown", 503)], final_retries=4, final_backoff_base_s=1.0, backoff_max_s=100
    )
    with pytest.raises(ObjectFailure):
        f.get("b", "k", final=True)
    assert client.calls == 4 and max(sleeps) <= 4.0


def test_permanent_errors_are_not_retried():
    f, client, sleeps, _ = fetcher([client_error("NoSuchKey", 404)], retries=5)
    with pytest.raises(ObjectFailure) as info:
        f.get("b", "k")
    assert info.value.reason is FailureReason.MISSING and client.calls == 1 and not sleeps


def test_too_large_objects_are_not_read():
    f, _, _, _ = fetcher([b"x" * 100], max_object_bytes=10)
    with pytest.raises(ObjectFailure) as info:
        f.get("b", "k")
    assert info.value.reason is FailureReason.TOO_LARGE


def test_unexpected_http_stack_errors_are_transient_key_failures():
    import http.client

    f, client, _, _ = fetcher([http.client.IncompleteRead(b"partial"), b"data"], retries=1)
    assert f.get("b", "k").data == b"data" and client.calls == 2
    f, _, _, _ = fetcher([ValueError("bad header")], retries=0)
    with pytest.raises(ObjectFailure) as info:
        f.get("b", "k")
    assert info.value.transient and "ValueError" in info.value.detail


def test_missing_credentials_are_fatal_not_a_key_failure():
    f, _, _, _ = fetcher([NoCredentialsError()])
    with pytest.raises(WorkerError, match="credentials"):
        f.get("b", "k")
