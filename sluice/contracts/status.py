"""A run's and a job's status, and why one object produced no embedding."""

from __future__ import annotations

from enum import StrEnum

# ---- statuses ----------------------------------------------------------------------------


class RunStatus(StrEnum):
    """The RUN item's status (docs/architecture.md has the state machine)."""

    PLANNING = "PLANNING"
    PREPARING = "PREPARING"
    RELEASED = "RELEASED"
    REJECTED = "REJECTED"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    FINALIZING = "FINALIZING"
    RETRYING = "RETRYING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def final(self) -> bool:
        """No event changes the run any more."""
        return self in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.REJECTED)

    @property
    def active(self) -> bool:
        """Jobs are out: Batch events are recorded and may finalize the run."""
        return self in (RunStatus.SUBMITTED, RunStatus.RUNNING, RunStatus.RETRYING)


class JobStatus(StrEnum):
    """An AWS Batch job's status, which is also a shard's (a shard is one child, node or plain job)."""

    SUBMITTED = "SUBMITTED"
    PENDING = "PENDING"
    RUNNABLE = "RUNNABLE"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED)

    @property
    def rank(self) -> int:
        """Order within one attempt; both terminal states rank last."""
        return _RANK[self]


_RANK = {s: min(i, 5) for i, s in enumerate(JobStatus)}


class FailureReason(StrEnum):
    """Why one object produced no embedding: a small fixed set, shared by the worker and completion."""

    MISSING = "missing"  # NoSuchKey / 404
    ACCESS_DENIED = "access_denied"  # 403
    S3_ERROR = "s3_error"  # any other non-retriable S3 error (400, InvalidObjectState, ...)
    S3_ERROR_TRANSIENT = "s3_error_transient"  # 429/5xx/timeouts that outlived every retry and the final pass
    TOO_LARGE = "too_large"  # object bigger than max_object_bytes
    BOMB = "bomb"  # more pixels than max_image_pixels (decompression bomb guard)
    NOT_IMAGE = "not_image"  # bytes no image decoder recognises
    CORRUPT = "corrupt"  # looks like an image (magic bytes) but does not decode: truncated or damaged
    UNSUPPORTED = "unsupported"  # an image Pillow cannot turn into RGB (missing codec, odd mode)
    NOT_TEXT = "not_text"  # input.kind text: not UTF-8 nor UTF-16 with a BOM (a binary file named .txt)
    EMPTY = "empty"  # input.kind text: no characters (0 bytes, or only a BOM / whitespace)
    NOT_VIDEO = "not_video"  # input.kind video: no container or video stream recognised
    TOO_LONG = "too_long"  # input.kind video: longer than the worker's duration limit
    NO_FRAMES = "no_frames"  # input.kind video: not one sampled frame decoded
    NOT_AUDIO = "not_audio"  # input.kind audio: no container or audio stream recognised
    SILENT = "silent"  # input.kind audio: every sample below the silence threshold


# Failures worth the run's retry pass; permanent ones (missing, corrupt, not_image, ...) never are.
TRANSIENT_FAILURE_REASONS = frozenset({FailureReason.S3_ERROR_TRANSIENT})
# Failures of the bytes themselves: the same object version fails the same way again.
BYTES_FAILURE_REASONS = frozenset(
    {
        FailureReason.NOT_IMAGE,
        FailureReason.CORRUPT,
        FailureReason.BOMB,
        FailureReason.UNSUPPORTED,
        FailureReason.NOT_TEXT,
        FailureReason.EMPTY,
        FailureReason.NOT_VIDEO,
        FailureReason.TOO_LONG,
        FailureReason.NO_FRAMES,
        FailureReason.NOT_AUDIO,
        FailureReason.SILENT,
    }
)

# The reasons a run of each content kind can record: a rank's failure series stay within the
# metrics budget (docs/metrics.md) because a run has one kind.
_ANY_KIND = {
    FailureReason.MISSING,
    FailureReason.ACCESS_DENIED,
    FailureReason.S3_ERROR,
    FailureReason.S3_ERROR_TRANSIENT,
    FailureReason.TOO_LARGE,
}
KIND_FAILURE_REASONS: dict[str, frozenset[FailureReason]] = {
    "image": frozenset(
        _ANY_KIND | {FailureReason.NOT_IMAGE, FailureReason.CORRUPT, FailureReason.BOMB, FailureReason.UNSUPPORTED}
    ),
    "text": frozenset(_ANY_KIND | {FailureReason.NOT_TEXT, FailureReason.EMPTY}),
    "video": frozenset(
        _ANY_KIND
        | {
            FailureReason.NOT_VIDEO,
            FailureReason.CORRUPT,
            FailureReason.TOO_LONG,
            FailureReason.BOMB,
            FailureReason.NO_FRAMES,
        }
    ),
    "audio": frozenset(
        _ANY_KIND
        | {
            FailureReason.NOT_AUDIO,
            FailureReason.CORRUPT,
            FailureReason.TOO_LONG,
            FailureReason.SILENT,
            FailureReason.EMPTY,
        }
    ),
}
