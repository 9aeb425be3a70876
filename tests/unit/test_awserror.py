"""One classification of AWS errors: every adapter asks sluice.aws.errors."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)

from sluice.aws.errors import AwsFatalError, Kind, classify, translate
from sluice.errors import RetriableError
from tests.unit.aws_errors import client_error


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("SlowDown", 503, Kind.TRANSIENT),
        ("ServiceUnavailable", 503, Kind.TRANSIENT),  # S3's other 503: was permanent for the manifest reader
        ("InternalError", 500, Kind.TRANSIENT),
        ("ThrottlingException", 400, Kind.TRANSIENT),  # DynamoDB / Batch throttling is a 400
        ("ProvisionedThroughputExceededException", 400, Kind.TRANSIENT),
        ("TransactionConflictException", 400, Kind.TRANSIENT),
        ("RequestTimeout", 400, Kind.TRANSIENT),
        ("", 502, Kind.TRANSIENT),
        ("Whatever", 429, Kind.TRANSIENT),
        ("NoSuchKey", 404, Kind.NOT_FOUND),
        ("NoSuchBucket", 404, Kind.NOT_FOUND),
        ("ResourceNotFoundException", 400, Kind.NOT_FOUND),  # DynamoDB: was retriable for the ledger
        ("", 404, Kind.NOT_FOUND),
        ("AccessDenied", 403, Kind.DENIED),
        ("AccessDeniedException", 400, Kind.DENIED),  # DynamoDB: was retriable for the ledger
        ("UnrecognizedClientException", 400, Kind.DENIED),
        ("ConditionalCheckFailedException", 400, Kind.CONDITION),
        ("ValidationException", 400, Kind.INVALID),
        ("ClientException", 400, Kind.INVALID),  # Batch: no such queue / definition
        ("InvalidObjectState", 403, Kind.DENIED),  # the status decides when the code is unknown
    ],
)
def test_client_errors(code, status, kind):
    failure = classify(client_error(code, status))
    assert failure.kind is kind
    assert failure.retriable is (kind is Kind.TRANSIENT)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (EndpointConnectionError(endpoint_url="https://s3"), Kind.TRANSIENT),
        (ReadTimeoutError(endpoint_url="https://s3"), Kind.TRANSIENT),
        (ConnectTimeoutError(endpoint_url="https://s3"), Kind.TRANSIENT),
        (ConnectionResetError("reset by peer"), Kind.TRANSIENT),
        (IncompleteReadError(actual_bytes=10, expected_bytes=20), Kind.TRANSIENT),
        (NoCredentialsError(), Kind.DENIED),
        (ParamValidationError(report="Bucket is required"), Kind.INVALID),
    ],
)
def test_other_exceptions(exc, kind):
    assert classify(exc).kind is kind


def test_translate_says_what_to_check():
    transient = translate(client_error("SlowDown", 503), "reading s3://b/k")
    assert isinstance(transient, RetriableError) and "will retry" in str(transient)
    fatal = translate(client_error("AccessDeniedException", 400, "not authorized"), "DynamoDB PutItem on 't'")
    assert isinstance(fatal, AwsFatalError)
    assert "DynamoDB PutItem on 't': AccessDeniedException: not authorized" in str(fatal)
    assert "IAM role" in str(fatal)
    missing = translate(client_error("ResourceNotFoundException", 400), "DynamoDB GetItem on 'x'")
    assert isinstance(missing, AwsFatalError) and "check that it exists" in str(missing)
