"""Where a run's files live, defined once.

Under the run's root (`s3://<control bucket>/runs/<run>/`, or a local directory for
standalone workers):

    plan.json                      the plan every worker reads
    plan-retry-<k>.json            the plan of retry pass k
    shards/<i>.shard               shard i (docs/shard-format.md)
    shards/<i>.result.json         the worker's result for shard i (sluice.contracts.results.ShardResult)
    failures/<i>.jsonl             keys of shard i that failed (sluice.contracts.results.FailureLine)
    prepare/spec.json              the prepare stage's work (sluice.contracts.prepare.PrepareSpec)
    prepare/manifest.json          the parsed manifest the submit step plans from
    prepare/map/<w>/<r>.part       keys map worker w routed to partition r (shard format)
    prepare/map/<w>.json           map worker w's result (MapResult), written after its parts
    prepare/reduce/<r>.json        reduce worker r's result (ReduceResult), written after its shards
    prepare/map/<w>/<r>.current    incremental runs: current object versions map worker w routed to r
    prepare/map/<w>/<r>.earlier    ... and the earlier runs' output records it routed to r
    prepare/reduce/<r>/<j>.shard   incremental array runs: reduce worker r's shards, numbered at submit
    output/shard=<i>/part-*.parquet             embeddings (the default output prefix)
    output/shard=<i>/_commits/part-*.json       commit markers, written after each Parquet object
    output/model_name=<name>/shard=<i>/...      the same, per model, when a run embeds with several models
                                   (not model=: Parquet readers would take the folder for the `model` column)

Search indexes (docs/index.md) live in the control bucket's `indexes/<name>/` unless the
manifest names another URI: one Lance table per model, `<index>/<model name>.lance`, and the
index stage's outcome for each run, `<index>/_results/<run>.json`. A distributed index build's
work files (sluice.index.fleet.build) are under `<index>/_fleet/<run>/`: plan.json (FleetPlan), the
trained models, segments/<child>.json (FleetChild).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.aws.s3uri import s3_uri

MANIFESTS_PREFIX = "manifests/"  # uploads here start runs (the template's rule matches it)
RUNS_PREFIX = "runs/"
COMMITS_DIR = "_commits/"
# The folder key of each model's output in a run with several models. Not "model": hive-partitioned
# readers (pyarrow.dataset, duckdb) add a folder key as a column, and `model` is a column already.
MODEL_DIR_KEY = "model_name"
INDEXES_PREFIX = "indexes/"  # search indexes: indexes/<name>/<model name>.lance
LANCE_SUFFIX = ".lance"
# Written into every run folder `sluice local run --out DIR` made: the folder holds committed chunks only.
LOCAL_COPY_MARKER = ".sluice-run.json"


def join(prefix: str, name: str) -> str:
    """prefix + name with exactly one separator (prefixes are s3:// URIs or local directories)."""
    return prefix if not name else (prefix if prefix.endswith("/") else prefix + "/") + name


def run_key(run_id: str, name: str = "") -> str:
    """Key of `name` under the run's root in the control bucket."""
    return f"{RUNS_PREFIX}{run_id}/{name}"


@dataclass(frozen=True)
class RunPaths:
    """The run's root and everything under it, as URIs."""

    root: str  # s3://bucket/runs/<run>/ or a local directory ending in "/"

    @classmethod
    def in_bucket(cls, bucket: str, run_id: str) -> RunPaths:
        """The layout of a run the coordinator planned: under runs/<run>/ of the control bucket."""
        return cls(s3_uri(bucket, run_key(run_id)))

    @property
    def plan(self) -> str:
        return self.root + "plan.json"

    def retry_plan(self, pass_no: int) -> str:
        return self.root + f"plan-retry-{pass_no}.json"

    def split_plan(self, shard: int) -> str:
        """The plan a split child runs under: the run's, with the child's shard in it."""
        return self.root + f"plan-split-{shard}.json"

    @property
    def shards_prefix(self) -> str:
        return self.root + "shards/"

    @property
    def failures_prefix(self) -> str:
        return self.root + "failures/"

    @property
    def output_prefix(self) -> str:
        """The default output prefix (a manifest may name another)."""
        return self.root + "output/"

    @property
    def prepare_spec(self) -> str:
        return self.root + "prepare/spec.json"

    @property
    def prepare_manifest(self) -> str:
        return self.root + "prepare/manifest.json"

    def prepare_part(self, worker: int, partition: int) -> str:
        return self.root + f"prepare/map/{worker}/{partition}.part"

    def versions_part(self, worker: int, partition: int, earlier: bool) -> str:
        """Map worker `worker`'s version records for `partition` (an incremental run): current or earlier."""
        return self.root + f"prepare/map/{worker}/{partition}.{'earlier' if earlier else 'current'}"

    def staged_shard(self, partition: int, j: int) -> str:
        """Reduce worker `partition`'s j-th shard before the submit step numbers it (an incremental array run)."""
        return self.root + f"prepare/reduce/{partition}/{j}.shard"

    def map_result(self, worker: int) -> str:
        return self.root + f"prepare/map/{worker}.json"

    def reduce_result(self, partition: int) -> str:
        return self.root + f"prepare/reduce/{partition}.json"

    def shard(self, i: int) -> str:
        return shard_uri(self.shards_prefix, i)

    def result(self, i: int) -> str:
        return result_uri(self.shards_prefix, i)

    def error(self, i: int) -> str:
        return error_uri(self.shards_prefix, i)

    def failures(self, i: int) -> str:
        return failures_uri(self.failures_prefix, i)


def shard_uri(shards_prefix: str, i: int) -> str:
    return join(shards_prefix, f"{i}.shard")


def result_uri(shards_prefix: str, i: int) -> str:
    return join(shards_prefix, f"{i}.result.json")


def error_uri(shards_prefix: str, i: int) -> str:
    """A worker's last words: why its attempt ended without result.json (sluice.contracts.results.ShardError)."""
    return join(shards_prefix, f"{i}.error.json")


def failures_uri(failures_prefix: str, i: int) -> str:
    return join(failures_prefix, f"{i}.jsonl")


def model_output_prefix(output_prefix: str, name: str) -> str:
    """Where one model's output goes in a run with several models: <output prefix>model_name=<name>/."""
    return join(output_prefix, f"{MODEL_DIR_KEY}={name}/")


def shard_output_dir(output_prefix: str, i: int) -> str:
    """Where shard i's Parquet chunks go: <output prefix>shard=<i>/."""
    return join(output_prefix, f"shard={i}/")


def index_uri(bucket: str, name: str) -> str:
    """The default place of the index `name`: s3://<control bucket>/indexes/<name>/."""
    return s3_uri(bucket, f"{INDEXES_PREFIX}{name}/")


def index_table_uri(index: str, model: str) -> str:
    """One model's Lance table in the index folder `index`: <index>/<model name>.lance."""
    return join(index, model + LANCE_SUFFIX)


def index_result(index: str, run_id: str) -> str:
    """The index stage's outcome for a run: a RunIndexed or IndexFailed detail (sluice.contracts)."""
    return join(index, f"_results/{run_id}.json")


def fleet_path(index: str, run_id: str, name: str = "") -> str:
    """A distributed index build's work file: <index>/_fleet/<run>/<name> (plan.json, models/, segments/<k>.json)."""
    return join(index, f"_fleet/{run_id}/{name}")


def committed_chunk(marker_uri: str, file: str) -> str:
    """The Parquet chunk a commit marker names: its shard folder (the marker's, less _commits/) + `file`."""
    return marker_uri.rsplit(COMMITS_DIR, 1)[0] + file


def is_commit_marker(key: str) -> bool:
    """True for a commit marker's key or URI (output/shard=<i>/_commits/<chunk>.json)."""
    return f"/{COMMITS_DIR}" in key and key.endswith(".json")


SCRATCH_TAG = "sluice-scratch=true"  # the bucket's lifecycle rule expires tagged shards (template.yaml)
