"""What a worker writes per shard: its result.json and its failures/<i>.jsonl lines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.contracts.base import Written
from sluice.contracts.status import FailureReason

# ---- what a worker writes per shard ------------------------------------------------------


class FailureLine(Written):
    """One line of failures/<i>.jsonl: a key that produced no embedding, and why."""

    key: str = Field(description="s3:// URI of the object.")
    reason: FailureReason
    attempt: int = Field(ge=1, description="Batch attempt that recorded the failure.")
    detail: str = Field(default="", description="The error, at most 300 characters.")
    etag: str | None = Field(
        default=None, description="ETag of the object version that failed, when its bytes were read (no quotes)."
    )
    version_id: str | None = Field(default=None, description="... and its version id, in a versioned bucket.")


class ShardResult(Written):
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
    n_keys: int = Field(ge=0, description="Keys this shard settled: its keys less those it handed to split children.")
    handed: int = Field(
        default=0, ge=0, description="Keys split off to other shards while it ran (the tail: settled there)."
    )
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
    parts: int = Field(
        default=0, ge=0, description="Rows the first model wrote (an image one, a text's chunks, a video's frames...)."
    )
    media_s: float = Field(default=0.0, ge=0, description="Seconds of audio its objects hold (audio runs; else 0).")
    processed_by_model: dict[str, int] = Field(
        default_factory=dict,
        description="Keys embedded by each model (name -> keys); `processed` is the least of them.",
    )
    reason: str | None = Field(
        default=None,
        description="When not ok, the worker's one-line verdict, e.g. '4 of 32 keys failed for their data "
        "(12.50% > 5.00%): not_image 3, corrupt 1'; 'Run Failed' quotes it.",
    )


class ShardError(Written):
    """shards/<i>.error.json: why a worker's attempt ended without result.json, in its own words.

    Batch's event says only "Essential container in task exited" (ECS sets container.reason,
    not the process), so the completion function quotes this instead when its attempt matches.
    """

    run_id: str
    shard: int = Field(ge=0)
    attempt: int = Field(ge=1)
    exit_code: int
    reason: str = Field(description="The worker's one line, e.g. 'configuration error: chunk_tokens 300 is over ...'.")


def over_threshold(failed_data: int, n_keys: int, fraction: float, threshold: float, by_reason: dict[str, int]) -> str:
    """The one line that says why a shard's data failures fail it."""
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0])) if n)
    return f"{failed_data} of {n_keys} keys failed for their data ({fraction:.2%} > {threshold:.2%}): {reasons}"
