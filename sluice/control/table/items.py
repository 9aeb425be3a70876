"""The runs table's items (pk=<run id>): RUN, SHARD, JOB, COUNT, MARK, PREPARE and INDEX, as written."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from sluice.contracts.base import Written
from sluice.contracts.prepare import MapResult
from sluice.contracts.status import FailureReason, JobStatus, RunStatus

# ---- the runs table ----------------------------------------------------------------------


class JobLayoutItem(Written):
    """One submitted Batch job as the RUN item lists it."""

    id: str
    kind: Literal["array", "single", "multinode"]
    shard_offset: int
    shard_count: int
    # A job Sluice re-submitted for a stalled attempt (sluice.control.sweep.stall): its attempts follow
    # `attempt_base` earlier ones, and the job it replaces failed by Sluice's TerminateJob.
    attempt_base: int | None = None
    replaces: str | None = None


class PassItem(Written):
    """One pass over shards: the first pass, then each retry pass; or a split child's shard (split_of set)."""

    first_shard: int
    n_shards: int
    # A shard split off a slow shard's slice (sluice.control.sweep.tail): it belongs to the pass of
    # the shard it was split from, and is not a retry pass of its own.
    split_of: int | None = None


def main_passes(passes: list[PassItem]) -> list[PassItem]:
    """The first pass and the retry passes, without split children's shards."""
    return [p for p in passes if p.split_of is None]


class UploadItem(Written):
    """The upload that started a run, so the reconciliation sweep can plan it again."""

    bucket: str
    key: str
    version_id: str | None = None
    etag: str = ""
    sequencer: str | None = None


class RunItem(Written):
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
    lineage: list[str] | None = None  # an incremental run: the earlier runs it completes, newest first
    skipped: dict[str, int] | None = None  # an incremental run: keys left out, by reason
    warnings: list[str] | None = None  # Run Submitted's (a builtin stand-in model, the preflight's)
    gpu_family: str | None = None  # the GPU family its GPU-hours are priced on (the stack's Capacity)
    kind: Literal["image", "text", "video", "audio"] | None = None  # input.kind: what its keys are (status words)
    jobs_done: int = 0
    jobs_failed: int = 0
    outbox: OutboxEvent | None = None  # an event decided but not yet published (sluice.control.outbox)
    prepare: PrepareItem | None = None  # PREPARING: the prepare stage's jobs
    index: IndexItem | None = None  # SUCCEEDED with output.index on: the index stage (sluice.control.indexing.stage)
    finalize_from: RunStatus | None = None
    retried_keys: int = 0
    processed: int | None = None  # the outcome's counts
    failed_keys: int | None = None
    gpu_seconds: int | None = None  # measured (result.json): DynamoDB has no float type
    shards_failed_list: list[int] | None = None
    finished_at: int | None = None

    @property
    def total_shards(self) -> int:
        """Shards of every pass so far."""
        return sum(p.n_shards for p in self.passes) if self.passes else int(self.shards or 0)


class OutboxEvent(Written):
    """An event written with the state change that decided it, published after (at least once)."""

    detail_type: str
    detail: str = Field(description="The detail as JSON (DynamoDB has no float type).")
    claimed_until: int | None = Field(default=None, description="A publisher holds it until then (epoch s).")


class ShardOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ShardItem(Written):
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
    gpu_seconds: int = Field(default=0, description="The worker's wall seconds x its GPUs (result.json; 0 on CPU).")
    parts_embedded: int = Field(default=0, description="Rows written: chunks, frames, windows (result.json parts).")
    media_ms: int = Field(default=0, description="Milliseconds of audio embedded (result.json media_s).")


def reason_counter(reason: FailureReason) -> str:
    """The COUNT item attribute that sums one failure reason's keys (flat: ADD takes no map entry)."""
    return f"failed_{reason.value}"


class CounterItem(Written):
    """A COUNT#<k> item: one of the run's write-sharded counters of settled shards and keys.

    Besides the shard and key totals it sums the keys failed for transient reasons and each
    failure reason's keys, so that a run whose counters show no failed shard is decided from
    these items alone, without reading its SHARD items (sluice.control.completion.state_change).
    """

    pk: str
    sk: str
    updated_at: int
    shards_succeeded: int = 0
    shards_failed: int = 0
    keys_processed: int = 0
    keys_failed: int = 0
    keys_transient: int = 0
    gpu_seconds: int = 0
    parts_embedded: int = 0
    media_ms: int = 0
    failed_missing: int = 0
    failed_access_denied: int = 0
    failed_s3_error: int = 0
    failed_s3_error_transient: int = 0
    failed_too_large: int = 0
    failed_bomb: int = 0
    failed_not_image: int = 0
    failed_corrupt: int = 0
    failed_unsupported: int = 0
    failed_not_text: int = 0
    failed_empty: int = 0
    failed_not_video: int = 0
    failed_too_long: int = 0
    failed_no_frames: int = 0
    failed_not_audio: int = 0
    failed_silent: int = 0


class Counts(BaseModel):
    """The run's counters summed over its counter items."""

    shards_succeeded: int = 0
    shards_failed: int = 0
    keys_processed: int = 0
    keys_failed: int = 0
    keys_transient: int = 0
    gpu_seconds: int = 0
    parts_embedded: int = 0
    media_ms: int = 0
    failed_by_reason: dict[FailureReason, int] = Field(default_factory=dict)

    @property
    def shards_done(self) -> int:
        return self.shards_succeeded + self.shards_failed

    @property
    def reasons_complete(self) -> bool:
        """Every failed key has its reason counted (false for counters written before reasons were)."""
        return sum(self.failed_by_reason.values()) == self.keys_failed


class MarkItem(Written):
    """A FAIL#<i> or RETRY#<i> item: shard i's terminal state failed, or has transient failures.

    Written and deleted in the transaction that changes the shard's item, so that concluding a
    run reads only the few shards that matter, not all of them.
    """

    pk: str
    sk: str
    shard: int
    updated_at: int
    why: str | None = None


class JobItem(Written):
    """A JOB#<id> item: a submitted job's terminal status, counted once."""

    pk: str
    sk: str
    status: JobStatus
    updated_at: int
    reason: str | None = None


class PrepareItem(Written):
    """The RUN item's record of its prepare stage."""

    spec_uri: str
    workers: int
    partitions: int
    map_job_id: str
    reduce_job_id: str
    input_keys_estimate: int
    started_at: int

    @property
    def job_ids(self) -> tuple[str, str]:
        return (self.map_job_id, self.reduce_job_id)


IndexState = Literal["claimed", "submitted", "indexed", "failed"]
IndexMode = Literal["single", "fleet"]


class IndexItem(Written):
    """The RUN item's record of its index stage: claimed with "Run Succeeded", then its job and its end."""

    uri: str
    state: IndexState
    job_id: str | None = None
    lease_until: int | None = None  # a submitter holds the claim until then (epoch s)
    rows: int | None = None
    ann: str | None = None
    reason: str | None = None
    finished_at: int | None = None
    timeout_s: int | None = None  # its job's timeout, from the rows it indexes (sluice.control.policy)
    # timeout_s is SLUICE_INDEX_TIMEOUT_S's, fixed at the claim: every job's, each fleet stage's too
    # (not a floor); a rerun's --timeout-s clears it.
    timeout_fixed: bool = False
    reruns: int = 0  # `sluice index rerun`: each rerun submits a job of its own name
    retired: list[str] = Field(default_factory=list)  # the job ids of earlier attempts: their late events are stale
    # "single": one job (job_id); "fleet": train, segments (an array of `children`) and commit, each
    # job id in `stages` (job_id is commit's). An item written before the fleet existed is "single".
    mode: IndexMode = "single"
    children: int | None = None
    planned_rows: int | None = None  # fleet: the rows estimated at the claim (the stage timeouts)
    stages: dict[str, str] = Field(default_factory=dict)


RunItem.model_rebuild()
MapResult.model_rebuild()
