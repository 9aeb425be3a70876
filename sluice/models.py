"""Pydantic models: the run manifest a user uploads and the plan every worker reads.

The other contracts between processes (result.json, failure lines, ledger items, event
details) are in sluice.contracts.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluice import paths
from sluice.paths import RunPaths

MANIFEST_VERSION = 1
MAX_ARRAY_SIZE = 10_000  # AWS Batch array jobs take 2..10,000 children
MAX_MNP_NODES = 1_000  # AWS Batch multi-node parallel jobs take up to 1,000 nodes (numNodes)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """Where the keys come from: exactly one of keys, key_list, prefix, inventory."""

    keys: list[str] | None = Field(default=None, description="Inline keys: bare keys (in `bucket`) or s3:// URIs.")
    key_list: str | None = Field(default=None, description="s3:// URI of a .txt/.csv/.jsonl key list (one key a line).")
    prefix: str | None = Field(default=None, description="s3://bucket/prefix to list (paginated).")
    inventory: str | None = Field(
        default=None, description="s3:// URI of an S3 Inventory manifest.json (CSV or Parquet)."
    )
    bucket: str | None = Field(default=None, description="Bucket for bare keys.")
    suffixes: list[str] | None = Field(
        default=None, description="Keep only keys ending with one of these (case-insensitive)."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> InputSpec:
        given = [n for n in ("keys", "key_list", "prefix", "inventory") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "input needs exactly one of keys, key_list, prefix, inventory"
                + (f" (got {', '.join(given)})" if given else " (got none)")
            )
        return self


class ModelSpec(_Strict):
    """The model a worker runs."""

    uri: str = Field(default="builtin:reference-cnn", description="builtin:NAME, a path or s3:// URI.")
    batch_size: Annotated[int, Field(ge=1, le=65_536)] = 64
    image_size: Annotated[int, Field(ge=8, le=8_192)] = 224


class JobSpec(_Strict):
    """How the run is laid out on AWS Batch."""

    mode: Literal["array", "multinode"] = "array"
    nodes: Annotated[int, Field(ge=1, le=MAX_MNP_NODES)] = 2
    gpus_per_node: Annotated[int, Field(ge=0, le=16)] = 1
    keys_per_shard: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    attempts: Annotated[int, Field(ge=1, le=10)] = 3
    timeout_s: Annotated[int, Field(ge=60, le=14 * 24 * 3600)] = 6 * 3600
    queue: str | None = Field(default=None, description="Job queue; default from settings.")


class OutputSpec(_Strict):
    """Where embeddings go; default s3://<control bucket>/runs/<run>/output/."""

    prefix: str | None = None
    dtype: Literal["float16", "float32"] = "float16"


class Manifest(_Strict):
    """A run manifest as uploaded to manifests/ (JSON)."""

    version: Literal[1] = Field(description="Manifest schema version; this Sluice reads 1.")
    name: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] | None = None
    input: InputSpec
    model: ModelSpec = ModelSpec()
    job: JobSpec = JobSpec()
    output: OutputSpec = OutputSpec()
    retry_failed: Annotated[int, Field(ge=0, le=3)] = 1
    max_failed_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: object) -> object:
        if v != MANIFEST_VERSION:
            raise ValueError(f"unsupported manifest version {v!r}: this Sluice reads version 1")
        return v


class JobLayout(_Strict):
    """One AWS Batch job of a run: its kind and the shards it covers."""

    kind: Literal["array", "single", "multinode"]
    shard_offset: int
    shard_count: int


class RunPlan(_Strict):
    """Everything a worker needs: written to runs/<run>/plan.json."""

    plan_version: Literal[1] = 1
    run_id: str
    manifest_uri: str
    control_bucket: str
    shards_prefix: str  # s3://bucket/runs/<run>/shards/ ; shard i is <prefix><i>.shard
    output_prefix: str
    failures_prefix: str
    total_keys: int
    duplicates: int
    n_shards: int
    keys_per_shard: int
    mode: Literal["array", "multinode"]
    nodes: int
    gpus_per_node: int
    spot_allowed: bool  # multi-node parallel jobs cannot run on Spot
    model: ModelSpec
    output_dtype: Literal["float16", "float32"]
    attempts: int
    timeout_s: int
    max_failed_fraction: float
    retry_failed: int
    jobs: list[JobLayout]
    created_at: str
    remote_write_url: str | None = None  # AMP remote-write URL; SLUICE_REMOTE_WRITE_URL on the worker wins

    @classmethod
    def standalone(
        cls,
        run_id: str,
        base: str,
        *,
        n_shards: int,
        total_keys: int,
        model: ModelSpec | None = None,
        mode: Literal["array", "multinode"] = "array",
        **overrides: Any,
    ) -> RunPlan:
        """A plan for running workers without the coordinator (benchmarks, tests, by hand).

        `base` is the run's root (`s3://bucket/runs/<run>/` or a local directory ending in
        "/"); shards, output and failures live under it as the coordinator lays them out.
        Any other field can be given in `overrides`.
        """
        bucket = base[5:].split("/", 1)[0] if base.startswith("s3://") else "local"
        root = RunPaths(base)
        values: dict[str, Any] = {
            "run_id": run_id,
            "manifest_uri": base + "manifest.json",
            "control_bucket": bucket,
            "shards_prefix": root.shards_prefix,
            "output_prefix": root.output_prefix,
            "failures_prefix": root.failures_prefix,
            "total_keys": total_keys,
            "duplicates": 0,
            "n_shards": n_shards,
            "keys_per_shard": max(1, -(-total_keys // max(1, n_shards))),
            "mode": mode,
            "nodes": n_shards if mode == "multinode" else 1,
            "gpus_per_node": 0,
            "spot_allowed": mode == "array",
            "model": model or ModelSpec(),
            "output_dtype": "float16",
            "attempts": 3,
            "timeout_s": 3600,
            "max_failed_fraction": 0.05,
            "retry_failed": 1,
            "jobs": [],
            "created_at": "standalone",
        }
        return cls(**{**values, **overrides})

    def shard_uri(self, index: int) -> str:
        """URI of shard `index`."""
        return paths.shard_uri(self.shards_prefix, index)

    def result_uri(self, index: int) -> str:
        """URI of shard `index`'s result.json."""
        return paths.result_uri(self.shards_prefix, index)

    def failures_uri(self, index: int) -> str:
        """URI of shard `index`'s failures/<i>.jsonl."""
        return paths.failures_uri(self.failures_prefix, index)

    def output_dir(self, index: int) -> str:
        """Where shard `index`'s Parquet chunks and commit markers go."""
        return paths.shard_output_dir(self.output_prefix, index)
