"""Retriable or fatal: one classification of AWS errors, used by every adapter at the boundary.

Transient (throttling, 5xx, timeouts, dropped connections) is retried: the Lambda invocation,
the worker's GET, the ledger's transaction. Everything else is fatal and says what to check:
a missing resource, a missing permission, or a request AWS will never accept.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from botocore.exceptions import (
    BotoCoreError,
    ChecksumError,
    ClientError,
    ConnectionError,
    FlexibleChecksumError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
)

from sluice.errors import RetriableError, SluiceError

# A body cut short or damaged in transit: the next GET is likely whole.
_IN_TRANSIT = (IncompleteReadError, ChecksumError, FlexibleChecksumError)


class Kind(StrEnum):
    TRANSIENT = "transient"  # retry: throttled, 5xx, timed out, connection dropped
    NOT_FOUND = "not_found"  # the bucket, key, table, queue ... does not exist
    DENIED = "denied"  # credentials or IAM: the role lacks a permission
    CONDITION = "condition"  # a conditional write lost (an outcome, not an error)
    INVALID = "invalid"  # AWS refused the request as such; a retry cannot help


# Error codes across S3, DynamoDB, Batch, EventBridge and STS (each service's API reference,
# "Common Errors" and per-operation errors). HTTP 429 and 5xx are transient whatever the code.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
        "TransactionConflictException",
        "TransactionConflict",  # TransactWriteItems cancellation reason codes
        "ThrottlingError",
        "TransactionInProgressException",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "ServerException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "ExpiredToken",  # Lambda's credentials rotated mid-invocation: the retry gets fresh ones
        "ExpiredTokenException",
    }
)
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchBucket", "ResourceNotFoundException"})
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "403",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
    }
)
CONDITION_CODES = frozenset({"ConditionalCheckFailedException", "PreconditionFailed", "412"})

ADVICE = {
    Kind.NOT_FOUND: "check that it exists (the stack's outputs and the SLUICE_* settings name it)",
    Kind.DENIED: "check that the function's or the job's IAM role grants this action on it (template.yaml)",
    Kind.INVALID: "check the request's values; a retry will not fix it",
}


@dataclass(frozen=True)
class AwsFailure:
    """What an AWS exception means."""

    kind: Kind
    code: str  # the error code, or the exception's class name
    status: int  # HTTP status; 0 when no response came back
    message: str

    @property
    def retriable(self) -> bool:
        return self.kind is Kind.TRANSIENT

    def describe(self, what: str) -> str:
        """'<what>: <code>: <message>', plus what to check when a retry will not help."""
        text = f"{what}: {self.code}" + (f": {self.message}" if self.message and self.message != self.code else "")
        advice = ADVICE.get(self.kind)
        return f"{text}; {advice}" if advice else text


def classify(exc: BaseException) -> AwsFailure:
    """Classify a botocore exception (or a connection-level OSError) once, for every caller."""
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "") or "")
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        message = str(err.get("Message", "") or "")
        code = code or str(status or "ClientError")
        if code in CONDITION_CODES:
            kind = Kind.CONDITION
        elif code in TRANSIENT_CODES or status == 429 or status >= 500:
            kind = Kind.TRANSIENT
        elif code in NOT_FOUND_CODES or status == 404:
            kind = Kind.NOT_FOUND
        elif code in DENIED_CODES or status == 403:
            kind = Kind.DENIED
        else:
            kind = Kind.INVALID
        return AwsFailure(kind, code, status, message)
    name = type(exc).__name__
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return AwsFailure(Kind.DENIED, name, 0, str(exc))
    if isinstance(exc, (ConnectionError, HTTPClientError, OSError, TimeoutError, *_IN_TRANSIT)):
        return AwsFailure(Kind.TRANSIENT, name, 0, str(exc))
    if isinstance(exc, BotoCoreError):
        # Other botocore errors are client-side (bad parameters, missing region): fatal.
        return AwsFailure(Kind.INVALID, name, 0, str(exc))
    return AwsFailure(Kind.INVALID, name, 0, str(exc))


class AwsFatalError(SluiceError):
    """An AWS call failed for a reason a retry will not fix; the message says what to check."""

    def __init__(self, message: str, failure: AwsFailure) -> None:
        super().__init__(message)
        self.failure = failure

    @property
    def kind(self) -> Kind:
        return self.failure.kind


class AwsRetriableError(RetriableError):
    """An AWS call failed for a transient reason (throttled, 5xx, timed out): the caller retries later."""

    def __init__(self, message: str, failure: AwsFailure) -> None:
        super().__init__(message)
        self.failure = failure


def translate(exc: BaseException, what: str) -> AwsFatalError | AwsRetriableError:
    """The Sluice error to raise for an AWS failure: AwsRetriableError if transient, else AwsFatalError.

    Both carry the AwsFailure, for a caller that decides by its kind.
    """
    failure = classify(exc)
    if failure.retriable:
        return AwsRetriableError(f"{failure.describe(what)}; will retry", failure)
    return AwsFatalError(failure.describe(what), failure)
