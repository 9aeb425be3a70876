"""A model's sidecar spec on S3: only "not found" means none; any other failure stops the worker, never a
silent fall back to default preprocessing. moto for the objects, botocore's Stubber for S3's errors."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber
from moto import mock_aws

from gpu_worker.errors import ConfigError, WorkerError
from gpu_worker.models.spec import SIDECAR_ATTEMPTS, read_sidecar, resolve_uri
from sluice.aws.store import ObjectStore

BUCKET, KEY = "models", "m/tiny.pt"
MODEL = f"s3://{BUCKET}/{KEY}"
SIDECAR = MODEL + ".json"
SPEC = b'{"output_dim": 12}'


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key=KEY, Body=b"model bytes")
        yield client


def _body(data: bytes) -> dict[str, Any]:
    return {"Body": StreamingBody(io.BytesIO(data), len(data)), "ContentLength": len(data)}


def _error(stub: Stubber, op: str, code: str, status: int, **params: str) -> None:
    stub.add_client_error(op, service_error_code=code, service_message=code, http_status_code=status, **params)


SIDECAR_GET = {"expected_params": {"Bucket": BUCKET, "Key": KEY + ".json"}}
SIDECAR_LIST = {"expected_params": {"Bucket": BUCKET, "Prefix": KEY + ".json"}}


def test_a_missing_sidecar_is_no_sidecar(s3, tmp_path):
    local = resolve_uri(MODEL, str(tmp_path), ObjectStore(s3))
    assert Path(local).read_bytes() == b"model bytes"
    assert not (tmp_path / "model" / "tiny.pt.json").exists()


def test_a_sidecar_is_downloaded_next_to_its_model(s3, tmp_path):
    s3.put_object(Bucket=BUCKET, Key=KEY + ".json", Body=SPEC)
    local = resolve_uri(MODEL, str(tmp_path), ObjectStore(s3))
    assert Path(local + ".json").read_bytes() == SPEC


def test_a_403_for_a_key_the_listing_does_not_show_is_no_sidecar(s3):
    # S3 answers 403 for a missing key to a role without s3:ListBucket; a listing tells the two apart.
    with Stubber(s3) as stub:
        _error(stub, "get_object", "AccessDenied", 403, **SIDECAR_GET)
        stub.add_response("list_objects_v2", {"KeyCount": 0, "IsTruncated": False}, **SIDECAR_LIST)
        assert read_sidecar(ObjectStore(s3), SIDECAR) is None
        stub.assert_no_pending_responses()


def test_a_sidecar_that_exists_but_is_denied_stops_the_worker(s3, tmp_path):
    listing = {"Contents": [{"Key": KEY + ".json", "Size": len(SPEC)}], "KeyCount": 1, "IsTruncated": False}
    with Stubber(s3) as stub:
        stub.add_response("get_object", _body(b"model bytes"), {"Bucket": BUCKET, "Key": KEY})
        _error(stub, "get_object", "AccessDenied", 403, **SIDECAR_GET)
        stub.add_response("list_objects_v2", listing, **SIDECAR_LIST)
        with pytest.raises(ConfigError) as exc:
            resolve_uri(MODEL, str(tmp_path), ObjectStore(s3))
    assert str(exc.value).startswith(f"reading the model spec {SIDECAR}: AccessDenied")
    assert "IAM role grants this action" in str(exc.value)


def test_a_403_that_no_listing_can_settle_stops_the_worker_and_says_what_to_grant(s3):
    with Stubber(s3) as stub:
        _error(stub, "get_object", "AccessDenied", 403, **SIDECAR_GET)
        _error(stub, "list_objects_v2", "AccessDenied", 403, **SIDECAR_LIST)
        with pytest.raises(ConfigError, match=r"AccessDenied.*upload the sidecar, or grant the job role s3:ListBucket"):
            read_sidecar(ObjectStore(s3), SIDECAR)


def test_a_transient_error_is_retried(s3):
    sleeps: list[float] = []
    with Stubber(s3) as stub:
        _error(stub, "get_object", "SlowDown", 503, **SIDECAR_GET)
        stub.add_response("get_object", _body(SPEC), SIDECAR_GET["expected_params"])
        assert read_sidecar(ObjectStore(s3), SIDECAR, sleep=sleeps.append) == SPEC
    assert sleeps == [1.0]


def test_a_transient_error_that_outlives_the_retries_fails_the_attempt(s3):
    sleeps: list[float] = []
    with Stubber(s3) as stub:
        for _ in range(SIDECAR_ATTEMPTS):
            _error(stub, "get_object", "ServiceUnavailable", 503, **SIDECAR_GET)
        with pytest.raises(WorkerError, match=r"ServiceUnavailable: still failing after 3 tries") as exc:
            read_sidecar(ObjectStore(s3), SIDECAR, sleep=sleeps.append)
        stub.assert_no_pending_responses()
    assert not isinstance(exc.value, ConfigError) and sleeps == [1.0, 2.0]


def test_any_other_error_is_fatal_with_its_cause(s3):
    with Stubber(s3) as stub:
        _error(stub, "get_object", "InvalidObjectState", 400, **SIDECAR_GET)
        with pytest.raises(ConfigError, match=r"InvalidObjectState.*a retry will not fix it"):
            read_sidecar(ObjectStore(s3), SIDECAR)
