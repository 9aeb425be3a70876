"""The prepare stage's documents: its spec, each map worker's result, each reduce worker's result."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from sluice.contracts.base import Written

# ---- the prepare stage (sluice.prepare; docs/architecture.md "Prepare") -----------------
# The manifest Lambda writes a PrepareSpec; map worker w reads tasks[w::workers], validates
# every key and routes it by digest to one of `partitions` partition files, then writes its
# MapResult (last: its commit marker); reduce worker r deduplicates partition r across every
# map worker, writes its shards and then its ReduceResult; the completion path reads the
# ReduceResults, writes plan.json and submits the inference jobs.


class KeyListRange(Written):
    """A byte range of a key-list object: the lines that start inside [start, end)."""

    kind: Literal["key_list"] = "key_list"
    uri: str = Field(description="s3:// URI (or, offline, a local path) of the key list.")
    format: Literal[".txt", ".csv", ".jsonl"]
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    header: list[str] | None = Field(default=None, description="A .csv's header row, read once by the planner.")


class InventoryFiles(Written):
    """Data files of an S3 Inventory report."""

    kind: Literal["inventory"] = "inventory"
    bucket: str = Field(description="Where the data files are (the inventory's destination bucket).")
    keys: list[str]
    format: Literal["CSV", "PARQUET"]
    columns: list[str] = Field(description="The inventory's fileSchema, e.g. ['Bucket', 'Key', 'Size'].")
    first_file: int = Field(default=0, description="Index of keys[0] among the report's files (for messages).")


class PrefixRange(Written):
    """Keys under a prefix with start_after < key < stop_at (ListObjectsV2 StartAfter)."""

    kind: Literal["prefix"] = "prefix"
    bucket: str
    prefix: str
    start_after: str | None = None
    stop_at: str | None = None


class InlineKeys(Written):
    """An incremental run's inline keys (input.keys), validated by the manifest Lambda: (bucket, key) pairs."""

    kind: Literal["inline"] = "inline"
    pairs: list[tuple[str, str]]


PrepareTask = Annotated[KeyListRange | InventoryFiles | PrefixRange | InlineKeys, Field(discriminator="kind")]


class EarlierOutput(Written):
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


class PrepareSpec(Written):
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
    # An incremental run (input.since_run; sluice.prepare.mapper.versions): the map workers also learn each key's
    # object version and read the earlier output (worker w takes earlier[w::workers]); the reducers
    # leave out the keys whose newest earlier record matches for every model.
    since_run: str | None = None
    lineage: list[str] = Field(default_factory=list, description="since_run, then the runs it completed: newest first.")
    model_ids: list[str] = Field(default_factory=list, description="This run's models' identities, one per model.")
    earlier: list[EarlierOutput] = Field(default_factory=list)

    @property
    def incremental(self) -> bool:
        return self.since_run is not None


class PrepareProblem(Written):
    """One bad entry found by a map worker; `line` is within its task (made global when reported)."""

    task: int
    line: int | None = None
    reason: str


class MapResult(Written):
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


class VersionCounts(Written):
    """What a map worker of an incremental run learned about object versions (sluice.prepare.mapper.versions)."""

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


class ReduceResult(Written):
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
