"""Events on the sluice bus (source "sluice"): each detail type's model, and the parser by detail type."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from sluice.contracts.base import Written
from sluice.contracts.status import FailureReason

# ---- events on the sluice bus (source "sluice") ------------------------------------------

StallCause = Literal["no_progress", "no_beat"]


class StalledAttempt(Written):
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


class SplitShard(Written):
    """A slow shard's remaining keys split off to a new shard (a SPLIT# item, made once): the tail."""

    shard: int = Field(description="The slow shard.")
    at: int = Field(description="Its position where the split child's keys begin.")
    to_shard: int = Field(description="The split child's shard: the keys [at, end of the slow rank's slice).")
    keys: int = Field(description="Keys handed to the split child.")
    expected_s: float = Field(description="When it was split: the slow rank's expected seconds to finish alone.")
    median_s: float = Field(description="The run's median expected shard time then.")
    child_s: float = Field(description="The split child's estimated seconds (start-up + its keys at the median rate).")
    job_id: str | None = Field(default=None, description="The split child's job, once submitted.")


class SlowRank(Written):
    """A running rank expected to end among the last (the tail), from its beats."""

    shard: int
    rank: int
    attempt: int
    processed: int = Field(description="Keys it has settled in this attempt.")
    todo: int = Field(description="Keys it had to settle in this attempt (less any split off).")
    keys_per_s: float = Field(description="Its rate since its models were ready.")
    ends_in_s: float = Field(description="Expected seconds until it ends, at that rate.")
    vs_median: float | None = Field(default=None, description="Its expected shard time over the run's median.")
    median_s: float | None = Field(default=None, description="The run's median expected shard time.")


class EventDetail(Written):
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
    split: list[SplitShard] | None = Field(
        default=None, description="Set when the sweep split slow shards' remaining keys off: the splits it made."
    )
    slowest: list[SlowRank] | None = Field(
        default=None, description="The running ranks expected to end last (up to 3), when any is running."
    )


class WaitingCause(Written):
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
    splits: int = Field(default=0, description="Slow shards whose remaining keys were split off (the tail).")
    split_keys: int = Field(default=0, description="Keys the split children embedded for them.")
    split_gpu_hours: float = Field(default=0.0, description="Estimated GPU-hours of the split children, in gpu_hours.")


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
    splits: int = Field(default=0, description="Slow shards whose remaining keys were split off (the tail).")
    split_keys: int = Field(default=0, description="Keys handed to split children.")
    split_gpu_hours: float = Field(default=0.0, description="Estimated GPU-hours of the split children, in gpu_hours.")
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
