"""Worker exceptions and the fixed set of per-object failure reasons."""

from __future__ import annotations

from enum import StrEnum


class WorkerError(Exception):
    """Base class for errors the worker raises on purpose (one-line messages)."""


class ConfigError(WorkerError):
    """The environment or the plan is missing something or is inconsistent (exit code 2)."""


class RankFailed(WorkerError):
    """A rank or loader process died or raised; the attempt fails and a retry resumes."""


class FailureReason(StrEnum):
    """Why one object produced no embedding. A small fixed set: issue #4 retries only TRANSIENT ones."""

    MISSING = "missing"  # NoSuchKey / 404
    ACCESS_DENIED = "access_denied"  # 403
    S3_ERROR = "s3_error"  # any other non-retriable S3 error (400, InvalidObjectState, ...)
    S3_ERROR_TRANSIENT = "s3_error_transient"  # 429/5xx/timeouts that outlived every retry and the final pass
    TOO_LARGE = "too_large"  # object bigger than max_object_bytes
    BOMB = "bomb"  # more pixels than max_image_pixels (decompression bomb guard)
    NOT_IMAGE = "not_image"  # bytes no image decoder recognises
    CORRUPT = "corrupt"  # looks like an image (magic bytes) but does not decode: truncated or damaged
    UNSUPPORTED = "unsupported"  # an image Pillow cannot turn into RGB (missing codec, odd mode)


TRANSIENT_REASONS = frozenset({FailureReason.S3_ERROR_TRANSIENT})


class ObjectFailure(Exception):
    """One object failed; `transient` ones are retried, then deferred to the final pass."""

    def __init__(self, reason: FailureReason, detail: str = "", *, transient: bool = False) -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail[:300]
        self.transient = transient
