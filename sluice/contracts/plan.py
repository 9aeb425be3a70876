"""The plan every worker of a run reads (runs/<run>/plan.json): its jobs, its models, its paths."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    model_validator,
)

from sluice import paths
from sluice.contracts.manifest import Decode, IndexTarget
from sluice.contracts.sections import MAX_MODELS, ContentSpec, ModelSpec, Strict
from sluice.errors import PlanError


def pass_batch(models: Sequence[ModelSpec] | Sequence[PlannedModel]) -> int:
    """The batch a rank's pass runs every model at: the smallest any of them asks for, so each one fits."""
    return min(m.batch_size for m in models)


class JobLayout(Strict):
    """One AWS Batch job of a run: its kind and the shards it covers."""

    kind: Literal["array", "single", "multinode"]
    shard_offset: int
    shard_count: int


class PlannedModel(Strict):
    """One model of a planned run: the manifest's spec, its output name and its artifact's identity."""

    uri: str
    batch_size: int
    image_size: int
    name: str  # ModelSpec.output_name: the output records' `model` and, with several models, the folder
    # What "the same model" means to incremental runs and indexes (sluice.modelid): the artifact
    # (builtin:<name>@<weights version>, s3etag:<ETag>[@<version id>], sha256:<hex>) and its
    # preprocessing (;image_size=128, a text window, a video's frame sampling).
    model_id: str

    @classmethod
    def of(cls, spec: ModelSpec, model_id: str | None = None) -> PlannedModel:
        """`spec` planned with `model_id` (default: the identity that needs no I/O, identity.static_id)."""
        from sluice.contracts.identity import static_id

        return cls(
            uri=spec.uri,
            batch_size=spec.batch_size,
            image_size=spec.image_size,
            name=spec.output_name,
            model_id=model_id or static_id(spec.uri),
        )


class RunPlan(Strict):
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
    models: Annotated[list[PlannedModel], Field(min_length=1, max_length=MAX_MODELS)]
    output_dtype: Literal["float16", "float32"]
    attempts: int
    timeout_s: int
    stall_after_s: int | None = None  # no progress this long: stalled (None: a plan from before; the worker's default)
    load_grace_s: int | None = None  # no first beat this long after RUNNING: stalled (job.load_grace_s; None: before)
    input_buckets: list[str] = []  # the buckets the prepare stage's keys name; empty: the manifest's input says
    max_failed_fraction: float
    retry_failed: int
    jobs: list[JobLayout]
    created_at: str
    remote_write_url: str | None = None  # AMP remote-write URL; SLUICE_REMOTE_WRITE_URL on the worker wins
    # Incremental runs: the earlier runs whose output this one completes, newest first (input.since_run
    # and the runs it was itself incremental on), and the keys left out because they already have output.
    lineage: list[str] = []
    skipped: dict[str, int] = {}  # reason -> keys (unchanged: same object version, same model_id)
    index: IndexTarget | None = None  # the search index the index stage updates (output.index); None: off
    decode: Decode = "auto"  # job.decode
    decode_binds: bool = False  # the preflight's estimate: CPU decode would hold the GPUs back (auto decodes on GPU)
    content: ContentSpec = ContentSpec()  # what the objects are (input.kind) and how each becomes parts

    @model_validator(mode="before")
    @classmethod
    def _legacy_model(cls, data: Any) -> Any:
        # Plans written before several models per run held one `model` (a ModelSpec).
        if isinstance(data, dict) and "model" in data and "models" not in data:
            data = dict(data)
            data["models"] = [PlannedModel.of(ModelSpec(**data.pop("model"))).model_dump()]
        return data

    @property
    def model(self) -> PlannedModel:
        """The first model: the pass's batch size and input size start from it."""
        return self.models[0]

    @property
    def effective_batch(self) -> int:
        """The batch every model of a rank's pass runs at (pass_batch); the planner's stall limit uses the same."""
        return pass_batch(self.models)

    @property
    def multi_model(self) -> bool:
        """Several models: output goes to output/model_name=<name>/shard=<i>/."""
        return len(self.models) > 1

    def shard_uri(self, index: int) -> str:
        """URI of shard `index`."""
        return paths.shard_uri(self.shards_prefix, index)

    def result_uri(self, index: int) -> str:
        """URI of shard `index`'s result.json."""
        return paths.result_uri(self.shards_prefix, index)

    def failures_uri(self, index: int) -> str:
        """URI of shard `index`'s failures/<i>.jsonl."""
        return paths.failures_uri(self.failures_prefix, index)

    def model_output_prefix(self, model: int = 0) -> str:
        """Where model `model`'s output goes: the output prefix, or <prefix>model_name=<name>/ with several models."""
        if not self.multi_model:
            return self.output_prefix
        return paths.model_output_prefix(self.output_prefix, self.models[model].name)

    def output_dir(self, index: int, model: int = 0) -> str:
        """Where shard `index`'s Parquet chunks and commit markers go (for model `model`)."""
        return paths.shard_output_dir(self.model_output_prefix(model), index)


def load_plan(read: Callable[[str], bytes], uri: str) -> RunPlan:
    """Read and validate a plan.json; `read` fetches a URI (S3 or a local path). PlanError says what is wrong."""
    try:
        raw = read(uri)
    except Exception as exc:
        raise PlanError(f"cannot read the plan {uri}: {type(exc).__name__}: {exc}") from exc
    try:
        return RunPlan.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "plan"
        raise PlanError(
            f"{uri} is not a valid plan.json: {where}: {first.get('msg')} ({exc.error_count()} problem(s))"
        ) from None


SKIPPED_UNCHANGED = "unchanged"  # RunPlan.skipped's reasons: the key's row is of its current version
SKIPPED_FAILED = "failed_before"  # ... its current bytes failed for their data before (docs/incremental.md)
