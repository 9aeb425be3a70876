"""Contracts between processes, defined once: what the worker writes, what the ledger holds, what the bus carries.

Sluice writes every model here, so each forbids unknown fields: a writer that drifts fails
its tests instead of silently sending something a reader ignores. `python -m sluice.schemas`
writes the JSON Schema of each event detail into docs/schemas/ (CI checks it is current).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Written(BaseModel):
    """A document Sluice writes: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


# ---- statuses ----------------------------------------------------------------------------


class RunStatus(StrEnum):
    """The RUN item's status (docs/architecture.md has the state machine)."""

    PLANNING = "PLANNING"
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


# Failures worth the run's retry pass; permanent ones (missing, corrupt, not_image, ...) never are.
TRANSIENT_FAILURE_REASONS = frozenset({FailureReason.S3_ERROR_TRANSIENT})


# ---- what a worker writes per shard ------------------------------------------------------


class FailureLine(_Written):
    """One line of failures/<i>.jsonl: a key that produced no embedding, and why."""

    key: str = Field(description="s3:// URI of the object.")
    reason: FailureReason
    attempt: int = Field(ge=1, description="Batch attempt that recorded the failure.")
    detail: str = Field(default="", description="The error, at most 300 characters.")


class ShardResult(_Written):
    """shards/<i>.result.json: the worker's own account of one shard, written last."""

    run_id: str
    shard: int = Field(ge=0)
    node: int = Field(ge=0, description="MNP node index; the shard index for array and plain jobs.")
    attempt: int = Field(ge=1)
    kind: Literal["array", "single", "multinode"]
    device: str = Field(description="cpu or cuda.")
    world: int = Field(ge=1, description="Ranks on the node.")
    seconds: float = Field(description="Wall time of the container, start to result.json.")
    pipeline_seconds: float = Field(description="Longest rank's streaming time.")
    pipeline_window: list[float] = Field(description="[first rank start, last rank end], epoch seconds; [] if idle.")
    resumed_chunks: int = Field(ge=0, description="Chunks committed by earlier attempts.")
    stats: dict[str, float] = Field(description="Worker counters summed over ranks (docs/worker.md).")
    n_keys: int = Field(ge=0)
    processed: int = Field(ge=0, description="Keys embedded.")
    failed: int = Field(ge=0, description="Keys in failures/<i>.jsonl.")
    failed_transient: int = Field(
        default=0, ge=0, description="Of those, transient (S3 throttling, 5xx): the run's retry pass retries them."
    )
    failed_fraction: float = Field(description="Data failures (failed - failed_transient) / n_keys.")
    max_failed_fraction: float
    ok: bool = Field(description="failed_fraction <= max_failed_fraction: transient failures never fail a shard.")
    failed_by_reason: dict[FailureReason, int]
    chunks: int = Field(ge=0, description="Committed Parquet chunks.")


# ---- the runs table ----------------------------------------------------------------------


class JobLayoutItem(_Written):
    """One submitted Batch job as the RUN item lists it."""

    id: str
    kind: Literal["array", "single", "multinode"]
    shard_offset: int
    shard_count: int


class PassItem(_Written):
    """One pass over shards: the first pass, then each retry pass."""

    first_shard: int
    n_shards: int


class UploadItem(_Written):
    """The upload that started a run, so the reconciliation sweep can plan it again."""

    bucket: str
    key: str
    version_id: str | None = None
    etag: str = ""
    sequencer: str | None = None


class RunItem(_Written):
    """The RUN item (pk = run id, sk = "RUN"): a typed view of what the ledger stores."""

    pk: str
    sk: Literal["RUN"]
    gsi1pk: str
    run_id: str
    status: RunStatus
    manifest_uri: str
    upload: UploadItem | None = None
    created_at: int
    updated_at: int
    expires_at: int
    lease_until: int | None = None
    last_error: str | None = None
    reasons: list[str] | None = None  # REJECTED
    reason: str | None = None  # FAILED
    total_keys: int | None = None
    duplicates: int | None = None
    shards: int | None = None  # shards of the first pass
    mode: Literal["array", "multinode"] | None = None
    job_ids: list[str] = Field(default_factory=list)
    jobs: list[JobLayoutItem] | None = None
    passes: list[PassItem] = Field(default_factory=list)
    plan_uri: str | None = None
    output_prefix: str | None = None
    jobs_done: int = 0
    jobs_failed: int = 0
    outbox: OutboxEvent | None = None  # an event decided but not yet published (sluice.outbox)
    finalize_from: RunStatus | None = None
    retried_keys: int = 0
    processed: int | None = None  # the outcome's counts
    failed_keys: int | None = None
    shards_failed_list: list[int] | None = None
    finished_at: int | None = None

    @property
    def total_shards(self) -> int:
        """Shards of every pass so far."""
        return sum(p.n_shards for p in self.passes) if self.passes else int(self.shards or 0)


class OutboxEvent(_Written):
    """An event written with the state change that decided it, published after (at least once)."""

    detail_type: str
    detail: str = Field(description="The detail as JSON (DynamoDB has no float type).")
    claimed_until: int | None = Field(default=None, description="A publisher holds it until then (epoch s).")


class ShardOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ShardItem(_Written):
    """A SHARD#<i> item: the newest state of one shard (seq only grows; terminal is final).

    A terminal shard is settled: its outcome and the worker's counts (from result.json) are
    written with the terminal state, so concluding a run reads these items, not 2N objects.
    """

    pk: str
    sk: str
    shard: int
    status: JobStatus
    seq: int
    attempt: int
    job_id: str
    updated_at: int
    exit_code: int | None = None
    reason: str | None = None
    spot_reclaimed: bool | None = None
    terminal: bool | None = None
    settled_by: Literal["event", "batch"] | None = None
    outcome: ShardOutcome | None = None
    why: str | None = Field(default=None, description="Why the shard failed, the same whatever the event order.")
    processed: int = 0
    failed_keys: int = 0
    failed_transient: int = 0
    failed_by_reason: dict[FailureReason, int] = Field(default_factory=dict)


class CounterItem(_Written):
    """A COUNT#<k> item: one of the run's write-sharded counters of settled shards and keys."""

    pk: str
    sk: str
    updated_at: int
    shards_succeeded: int = 0
    shards_failed: int = 0
    keys_processed: int = 0
    keys_failed: int = 0


class Counts(BaseModel):
    """The run's counters summed over its counter items."""

    shards_succeeded: int = 0
    shards_failed: int = 0
    keys_processed: int = 0
    keys_failed: int = 0

    @property
    def shards_done(self) -> int:
        return self.shards_succeeded + self.shards_failed


class JobItem(_Written):
    """A JOB#<id> item: a submitted job's terminal status, counted once."""

    pk: str
    sk: str
    status: JobStatus
    updated_at: int
    reason: str | None = None


# ---- events on the sluice bus (source "sluice") ------------------------------------------


class EventDetail(_Written):
    """The detail of an event Sluice publishes; `detail_type` is its EventBridge detail-type."""

    detail_type: ClassVar[str]
    run_id: str


class RunSubmitted(EventDetail):
    """The run's jobs are submitted."""

    detail_type: ClassVar[str] = "Run Submitted"
    manifest: str = Field(description="s3:// URI of the uploaded manifest.")
    total_keys: int = Field(description="Unique keys.")
    duplicates: int
    shards: int
    mode: Literal["array", "multinode"]
    job_ids: list[str]
    plan_uri: str


class ManifestRejected(EventDetail):
    """The manifest cannot run; nothing was submitted."""

    detail_type: ClassVar[str] = "Manifest Rejected"
    manifest: str
    reasons: list[str] = Field(description="Each names the field, key or line and what to do.")


class RunProgress(EventDetail):
    """A shard became terminal, or a retry pass started."""

    detail_type: ClassVar[str] = "Run Progress"
    shards_done: int
    shards_failed: int
    shards_total: int
    retry_pass: int | None = Field(default=None, description="Set when a retry pass starts: its number.")
    retry_keys: int | None = None
    retry_shards: int | None = None


class RunSucceeded(EventDetail):
    """The run's outcome: every shard finished within its failed-fraction threshold."""

    detail_type: ClassVar[str] = "Run Succeeded"
    processed: int
    failed: int
    output_prefix: str
    duration_s: float
    failed_by_reason: dict[FailureReason, int]
    failed_keys_uri: str
    retry_passes: int


class RunFailed(EventDetail):
    """The run's outcome: a shard failed, or Batch refused the jobs (stage "submit")."""

    detail_type: ClassVar[str] = "Run Failed"
    reason: str
    shards_failed: list[int] = Field(description="Indexes of the failed shards (empty for a submission failure).")
    failed_keys_uri: str | None
    processed: int = 0
    failed: int = 0
    duration_s: float | None = None
    stage: Literal["plan", "submit"] | None = Field(
        default=None,
        description='Set when the run never started: "submit" (Batch refused the jobs) or "plan" (an AWS error a '
        "retry cannot fix: a missing bucket or permission).",
    )


EVENT_DETAILS: tuple[type[EventDetail], ...] = (RunSubmitted, ManifestRejected, RunProgress, RunSucceeded, RunFailed)


def parse_detail(detail_type: str, detail: dict[str, Any]) -> EventDetail:
    """The typed detail of a Sluice event (subscribers, tests, the local summary)."""
    for cls in EVENT_DETAILS:
        if cls.detail_type == detail_type:
            return cls.model_validate(detail)
    raise ValueError(f"not a Sluice event: {detail_type!r}")


RunItem.model_rebuild()
