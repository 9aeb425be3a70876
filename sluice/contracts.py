"""Contracts between processes, defined once: what the worker writes, what the ledger holds, what the bus carries.

Sluice writes every model here, so each forbids unknown fields: a writer that drifts fails
its tests instead of silently sending something a reader ignores. `python -m sluice.ops.schemas`
writes the JSON Schema of each event detail into docs/schemas/ (CI checks it is current).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Written(BaseModel):
    """A document Sluice writes: unknown fields are an error."""

    model_config = ConfigDict(extra="forbid")


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
}


# ---- what a worker writes per shard ------------------------------------------------------


class FailureLine(_Written):
    """One line of failures/<i>.jsonl: a key that produced no embedding, and why."""

    key: str = Field(description="s3:// URI of the object.")
    reason: FailureReason
    attempt: int = Field(ge=1, description="Batch attempt that recorded the failure.")
    detail: str = Field(default="", description="The error, at most 300 characters.")
    etag: str | None = Field(
        default=None, description="ETag of the object version that failed, when its bytes were read (no quotes)."
    )
    version_id: str | None = Field(default=None, description="... and its version id, in a versioned bucket.")


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
    processed_by_model: dict[str, int] = Field(
        default_factory=dict,
        description="Keys embedded by each model (name -> keys); `processed` is the least of them.",
    )
    reason: str | None = Field(
        default=None,
        description="When not ok, the worker's one-line verdict, e.g. '4 of 32 keys failed for their data "
        "(12.50% > 5.00%): not_image 3, corrupt 1'; 'Run Failed' quotes it.",
    )


def over_threshold(failed_data: int, n_keys: int, fraction: float, threshold: float, by_reason: dict[str, int]) -> str:
    """The one line that says why a shard's data failures fail it."""
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])) if n)
    return f"{failed_data} of {n_keys} keys failed for their data ({fraction:.2%} > {threshold:.2%}): {reasons}"


# ---- the runs table ----------------------------------------------------------------------


class JobLayoutItem(_Written):
    """One submitted Batch job as the RUN item lists it."""

    id: str
    kind: Literal["array", "single", "multinode"]
    shard_offset: int
    shard_count: int
    # A job Sluice re-submitted for a stalled attempt (sluice.control.stall): its attempts follow
    # `attempt_base` earlier ones, and the job it replaces failed by Sluice's TerminateJob.
    attempt_base: int | None = None
    replaces: str | None = None


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
    lineage: list[str] | None = None  # an incremental run: the earlier runs it completes, newest first
    skipped: dict[str, int] | None = None  # an incremental run: keys left out, by reason
    warnings: list[str] | None = None  # Run Submitted's (a builtin stand-in model, the preflight's)
    gpu_family: str | None = None  # the GPU family its GPU-hours are priced on (the stack's Capacity)
    kind: Literal["image", "text", "video"] | None = None  # input.kind: what its keys are (status words)
    jobs_done: int = 0
    jobs_failed: int = 0
    outbox: OutboxEvent | None = None  # an event decided but not yet published (sluice.control.outbox)
    prepare: PrepareItem | None = None  # PREPARING: the prepare stage's jobs
    index: IndexItem | None = None  # SUCCEEDED with output.index on: the index stage (sluice.control.indexing)
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
    gpu_seconds: int = Field(default=0, description="The worker's wall seconds x its GPUs (result.json; 0 on CPU).")


StallCause = Literal["no_progress", "no_beat"]


class StalledAttempt(_Written):
    """An attempt ended by the sweep (a STALL# item, counted once): still for its stall_after_s, or never beat."""

    shard: int
    attempt: int
    after_s: float = Field(description="Seconds without progress (or, no_beat, since it started) when ended.")
    cause: StallCause = Field(
        default="no_progress",
        description="no_progress: its beat aged past stall_after_s; no_beat: RUNNING for the plan's load_grace_s "
        "without a first beat (hung before its first batch).",
    )
    job_id: str | None = Field(default=None, description="The child, node or plain job terminated.")
    redo_job_id: str | None = Field(default=None, description="The job Sluice submitted to resume the shard.")


def reason_counter(reason: FailureReason) -> str:
    """The COUNT item attribute that sums one failure reason's keys (flat: ADD takes no map entry)."""
    return f"failed_{reason.value}"


class CounterItem(_Written):
    """A COUNT#<k> item: one of the run's write-sharded counters of settled shards and keys.

    Besides the shard and key totals it sums the keys failed for transient reasons and each
    failure reason's keys, so that a run whose counters show no failed shard is decided from
    these items alone, without reading its SHARD items (sluice.control.completion).
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


class Counts(BaseModel):
    """The run's counters summed over its counter items."""

    shards_succeeded: int = 0
    shards_failed: int = 0
    keys_processed: int = 0
    keys_failed: int = 0
    keys_transient: int = 0
    gpu_seconds: int = 0
    failed_by_reason: dict[FailureReason, int] = Field(default_factory=dict)

    @property
    def shards_done(self) -> int:
        return self.shards_succeeded + self.shards_failed

    @property
    def reasons_complete(self) -> bool:
        """Every failed key has its reason counted (false for counters written before reasons were)."""
        return sum(self.failed_by_reason.values()) == self.keys_failed


class MarkItem(_Written):
    """A FAIL#<i> or RETRY#<i> item: shard i's terminal state failed, or has transient failures.

    Written and deleted in the transaction that changes the shard's item, so that concluding a
    run reads only the few shards that matter, not all of them.
    """

    pk: str
    sk: str
    shard: int
    updated_at: int
    why: str | None = None


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


class RunPreparing(EventDetail):
    """The input is too big for the manifest Lambda: a prepare job shards it (then "Run Submitted")."""

    detail_type: ClassVar[str] = "Run Preparing"
    manifest: str
    workers: int = Field(description="Prepare (map) workers: children of the prepare array job.")
    partitions: int = Field(description="Dedup partitions: children of the prepare-reduce job.")
    input_keys_estimate: int = Field(description="Keys the input holds, estimated from its size (not exact).")
    input_bytes: int | None = Field(default=None, description="Bytes of the key list or inventory data files.")
    job_ids: list[str]


class RunCost(BaseModel):
    """An estimate of what GPU-hours cost, from a price table (sluice.preflight.estimate)."""

    family: str = Field(description="GPU instance family priced, e.g. g6e.")
    on_demand: float | None = Field(description="USD at On-Demand prices; null when the family has no price.")
    spot: float | None = Field(description="USD at typical Spot prices.")
    prices: str = Field(description="Where the prices come from, and their date.")


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
    warnings: list[str] = Field(default_factory=list, description="The preflight's warnings (sluice plan's checks).")
    gpu_hours_estimate: float | None = Field(default=None, description="Planned GPU-hours (the preflight's estimate).")
    cost_estimate_usd: RunCost | None = None
    lineage: list[str] = Field(
        default_factory=list,
        description="An incremental run (input.since_run): the earlier runs whose output it completes, newest first.",
    )
    skipped: dict[str, int] = Field(
        default_factory=dict,
        description="An incremental run: input keys left out, by reason (unchanged: an earlier run of the lineage "
        "embedded the same object version with the same model_id, artifact and preprocessing, for every model).",
    )


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
    stalled: list[StalledAttempt] | None = Field(
        default=None, description="Set when the sweep ended stalled attempts: the ones it ended this time."
    )


class WaitingCause(_Written):
    """Jobs left RUNNABLE for one reason Batch gives (statusReason)."""

    reason: str = Field(description="Batch's statusReason, e.g. capacity, MaxVcpus or no matching instance type.")
    jobs: int = Field(description="Jobs or children RUNNABLE for this reason when the sweep looked.")
    waiting_s: float = Field(description="How long the oldest of them has been RUNNABLE.")
    job_ids: list[str] = Field(default_factory=list, description="Up to 10 of them.")


class RunWaiting(EventDetail):
    """Jobs of the run have been RUNNABLE longer than SLUICE_RUNNABLE_AFTER_S: once per cause, not per child."""

    detail_type: ClassVar[str] = "Run Waiting"
    causes: list[WaitingCause]


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
    gpu_hours: float = Field(default=0.0, description="Measured: each shard's worker wall time x its GPUs.")
    cost_usd: RunCost | None = None


class RunFailed(EventDetail):
    """The run's outcome: a shard failed, or Batch refused the jobs (stage "submit")."""

    detail_type: ClassVar[str] = "Run Failed"
    reason: str
    shards_failed: list[int] = Field(description="Indexes of the failed shards (empty for a submission failure).")
    failed_keys_uri: str | None
    processed: int = 0
    failed: int = 0
    duration_s: float | None = None
    gpu_hours: float = Field(default=0.0, description="Measured: each settled shard's worker wall time x its GPUs.")
    cost_usd: RunCost | None = None
    stage: Literal["plan", "prepare", "submit"] | None = Field(
        default=None,
        description='Set when the run never started: "submit" (Batch refused the jobs), "prepare" (the prepare '
        'job failed) or "plan" (an AWS error a retry cannot fix: a missing bucket or permission).',
    )


class IndexedTable(BaseModel):
    """One model's table in the index after the index stage."""

    model: str
    model_id: str
    uri: str = Field(description="The Lance table: <index>/<model name>.lance.")
    rows: int
    ann: str = Field(description='"IVF_PQ", or "none" for a table small enough to scan exactly.')


class VectorsIndexed(BaseModel):
    """What the index stage upserted into Amazon S3 Vectors (output.index.s3_vectors)."""

    bucket: str = Field(description="The vector bucket.")
    indexes: list[str] = Field(description="The vector indexes written: <name>-<model>-<shard>.")
    vectors: int = Field(description="Vectors put by this stage (the run's rows; a retried stage puts them again).")


class RunIndexed(EventDetail):
    """The run's embeddings are in its search index (after "Run Succeeded"; docs/index.md)."""

    detail_type: ClassVar[str] = "Run Indexed"
    index_uri: str = Field(description="The index folder: one Lance table per model.")
    rows: int = Field(description="Rows the index holds now, every model's table together.")
    seconds: float = Field(description="The index stage's wall time.")
    ann: str = Field(description='The ANN index kind: "IVF_PQ", or "none" when every table is small enough to scan.')
    tables: list[IndexedTable] = Field(default_factory=list)
    s3_vectors: VectorsIndexed | None = Field(default=None, description="Set when output.index.s3_vectors is.")


class IndexFailed(EventDetail):
    """The index stage failed; the run's outcome and its embeddings are untouched, the index as it was."""

    detail_type: ClassVar[str] = "Index Failed"
    index_uri: str | None = Field(description="The index the stage was to update.")
    reason: str = Field(description="What went wrong (the file, model or field) and what to do.")


EVENT_DETAILS: tuple[type[EventDetail], ...] = (
    RunPreparing,
    RunSubmitted,
    ManifestRejected,
    RunProgress,
    RunWaiting,
    RunSucceeded,
    RunFailed,
    RunIndexed,
    IndexFailed,
)


def parse_detail(detail_type: str, detail: dict[str, Any]) -> EventDetail:
    """The typed detail of a Sluice event (subscribers, tests, the local summary)."""
    for cls in EVENT_DETAILS:
        if cls.detail_type == detail_type:
            return cls.model_validate(detail)
    raise ValueError(f"not a Sluice event: {detail_type!r}")


# ---- the prepare stage (sluice.prepare; docs/architecture.md "Prepare") -----------------
# The manifest Lambda writes a PrepareSpec; map worker w reads tasks[w::workers], validates
# every key and routes it by digest to one of `partitions` partition files, then writes its
# MapResult (last: its commit marker); reduce worker r deduplicates partition r across every
# map worker, writes its shards and then its ReduceResult; the completion path reads the
# ReduceResults, writes plan.json and submits the inference jobs.


class KeyListRange(_Written):
    """A byte range of a key-list object: the lines that start inside [start, end)."""

    kind: Literal["key_list"] = "key_list"
    uri: str = Field(description="s3:// URI (or, offline, a local path) of the key list.")
    format: Literal[".txt", ".csv", ".jsonl"]
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    header: list[str] | None = Field(default=None, description="A .csv's header row, read once by the planner.")


class InventoryFiles(_Written):
    """Data files of an S3 Inventory report."""

    kind: Literal["inventory"] = "inventory"
    bucket: str = Field(description="Where the data files are (the inventory's destination bucket).")
    keys: list[str]
    format: Literal["CSV", "PARQUET"]
    columns: list[str] = Field(description="The inventory's fileSchema, e.g. ['Bucket', 'Key', 'Size'].")
    first_file: int = Field(default=0, description="Index of keys[0] among the report's files (for messages).")


class PrefixRange(_Written):
    """Keys under a prefix with start_after < key < stop_at (ListObjectsV2 StartAfter)."""

    kind: Literal["prefix"] = "prefix"
    bucket: str
    prefix: str
    start_after: str | None = None
    stop_at: str | None = None


class InlineKeys(_Written):
    """An incremental run's inline keys (input.keys), validated by the manifest Lambda: (bucket, key) pairs."""

    kind: Literal["inline"] = "inline"
    pairs: list[tuple[str, str]]


PrepareTask = Annotated[KeyListRange | InventoryFiles | PrefixRange | InlineKeys, Field(discriminator="kind")]


class EarlierOutput(_Written):
    """Shards [start, stop) of one model's output of an earlier run: read for its object versions (incremental)."""

    kind: Literal["earlier"] = "earlier"
    run_id: str
    rank: int = Field(ge=0, description="Its place in the lineage: 0 is input.since_run, 1 the run it completed, ...")
    model_prefix: str = Field(description="RunPlan.model_output_prefix of that model: shard=<i>/ folders under it.")
    model_id: str = Field(description="The model's identity (artifact, preprocessing) in its plan (sluice.modelid).")
    start: int = Field(ge=0)
    stop: int = Field(ge=0)
    failures: bool = Field(
        default=True,
        description="Also read these shards' failures files: they are the run's, not a model's, so only the "
        "tasks of one of its models read them (counted once, however many models match).",
    )


class PrepareSpec(_Written):
    """What the prepare workers do: written once by the planner to <run root>/prepare/spec.json."""

    run_id: str
    manifest_uri: str
    root: str = Field(description="The run's root (RunPaths.root): shards and prepare files go under it.")
    workers: int = Field(ge=1, description="P: map workers; worker w takes tasks[w::workers].")
    partitions: int = Field(ge=1, description="R: dedup partitions, one reduce worker each.")
    keys_per_shard: int = Field(ge=1)
    mode: Literal["array", "multinode"] = "array"
    nodes: int = Field(default=1, ge=1, description="multinode: one shard per node, so partitions == nodes.")
    default_bucket: str | None = None
    suffixes: list[str] | None = None
    allowed_buckets: list[str] = Field(default_factory=list)
    max_keys: int
    input_keys_estimate: int = 0
    tasks: list[PrepareTask]
    # An incremental run (input.since_run; sluice.prepare.versions_map): the map workers also learn each key's
    # object version and read the earlier output (worker w takes earlier[w::workers]); the reducers
    # leave out the keys whose newest earlier record matches for every model.
    since_run: str | None = None
    lineage: list[str] = Field(default_factory=list, description="since_run, then the runs it completed: newest first.")
    model_ids: list[str] = Field(default_factory=list, description="This run's models' identities, one per model.")
    earlier: list[EarlierOutput] = Field(default_factory=list)

    @property
    def incremental(self) -> bool:
        return self.since_run is not None


class PrepareProblem(_Written):
    """One bad entry found by a map worker; `line` is within its task (made global when reported)."""

    task: int
    line: int | None = None
    reason: str


class MapResult(_Written):
    """What map worker `worker` did: its commit marker, written after every partition file."""

    worker: int
    tasks: list[int]
    task_lines: list[int] = Field(description="Lines (key lists) or rows (inventories) read per task, in order.")
    keys_in: int
    partition_keys: list[int] = Field(description="Keys routed to each partition (length = partitions).")
    problems: list[PrepareProblem] = Field(default_factory=list)
    problem_count: int = 0
    seconds: float
    peak_rss_mb: float
    versions: VersionCounts | None = Field(default=None, description="An incremental run: what the worker learned.")
    buckets: list[str] = Field(
        default_factory=list, description="The buckets its keys name (at most 100): the submit's cross-Region check."
    )


class VersionCounts(_Written):
    """What a map worker of an incremental run learned about object versions (sluice.prepare.versions_map)."""

    partition_records: list[int] = Field(description="Version records routed to each partition (current + earlier).")
    listed: int = Field(default=0, description="Current versions from the listing's or the inventory's ETags.")
    heads: int = Field(default=0, description="HeadObject requests made (key lists and inline keys).")
    head_missing: int = Field(default=0, description="HEAD 404: not skipped (the GPU worker records it as missing).")
    head_denied: int = Field(default=0, description="HEAD 403: not skipped (grant the prepare role s3:GetObject).")
    head_errors: int = Field(default=0, description="Other HEAD refusals: not skipped.")
    earlier_files: int = Field(default=0, description="Committed output files of earlier runs read.")
    earlier_rows: int = Field(default=0, description="Their rows with one of this run's model ids.")
    earlier_unversioned: int = Field(
        default=0,
        description="Files without the version columns (written before output recorded them) or not readable: "
        "their keys are embedded again.",
    )
    earlier_failures: int = Field(
        default=0,
        description="Failure lines of earlier runs whose bytes failed (with the version read), once per shard.",
    )


class ReduceResult(_Written):
    """What reduce worker `partition` did: written after its shards."""

    partition: int
    skipped: bool = Field(default=False, description="A map worker found bad input: nothing written.")
    keys_in: int = 0
    unique_keys: int = 0
    duplicates: int = 0
    first_shard: int = 0
    shard_keys: list[int] = Field(default_factory=list, description="Keys in shards first_shard, first_shard+1, ...")
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    skipped_unchanged: int = Field(default=0, description="An incremental run: unique keys left out (unchanged).")
    skipped_failed: int = Field(
        default=0, description="... and those left out because their unchanged bytes failed before (failed_before)."
    )
    staged: bool = Field(
        default=False,
        description="An incremental array run: shards written as prepare/reduce/<r>/<j>.shard, numbered and "
        "copied to shards/ by the submit step (their count is known only after the skip).",
    )


class PrepareItem(_Written):
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


class IndexItem(_Written):
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


# ---- the distributed index build (sluice.index.fleet) ---------------------------------------

# What the stages do to a table: "segments" (train trained the lists, children build segments,
# commit commits them), "extended" (train added the new rows to the existing lists: small growth),
# "none" (too few rows for an ANN index: exact scans). Children act on "segments" only.
FleetMode = Literal["segments", "extended", "none"]


class FleetTable(_Written):
    """One model's table in a FleetPlan: what train merged and decided, and each child's fragments."""

    model: str
    model_id: str
    uri: str
    dim: int
    rows: int  # the table's rows at train's version
    version: int  # the Lance version train planned on: children read it, commit checks its fragments
    mode: FleetMode
    index_name: str = "embedding_idx"
    num_partitions: int | None = None
    num_sub_vectors: int | None = None
    ivf: str | None = None  # the trained IVF centroids (Arrow IPC) under the run's _fleet folder
    pq: str | None = None  # the trained PQ codebook (Arrow IPC)
    shares: list[list[int]] = Field(default_factory=list)  # shares[k]: fragment ids child k indexes
    merged: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    inserted: int = 0
    updated: int = 0


class FleetPlan(_Written):
    """<index>/_fleet/<run>/plan.json: train's output, read by every segment child and by commit."""

    run_id: str
    index_uri: str
    children: int = Field(ge=1)
    started_at: float  # epoch s: train's start (RunIndexed's seconds run from it)
    accelerator: str | None = None  # "cuda" when training ran on a GPU
    tables: list[FleetTable]


class FleetSegment(_Written):
    """One index segment a child built (lance.dataset.Index as JSON; details base64)."""

    table: str  # the table's URI
    uuid: str
    name: str
    fields: list[int]
    dataset_version: int
    fragment_ids: list[int]
    index_version: int
    created_at: str | None = None
    base_id: int | None = None
    files: list[tuple[str, int]] | None = None  # (path, size in bytes)
    details_type: str | None = None
    details: str | None = None
    covering_fields: list[int] = Field(default_factory=list)


class FleetChild(_Written):
    """<index>/_fleet/<run>/segments/<child>.json: a segment child's work (empty when it had none)."""

    run_id: str
    child: int
    children: int
    segments: list[FleetSegment] = Field(default_factory=list)
    rows: int = 0
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
