"""The run's layout (shards, jobs) and its plan.json: the one builder (build_plan, from PlanInputs) and writer."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sluice.contracts.identity import static_identity
from sluice.contracts.manifest import IndexTarget, Manifest, index_name
from sluice.contracts.plan import JobLayout, PlannedModel, RunPlan, pass_batch
from sluice.paths import RunPaths
from sluice.preflight import limits as L
from sluice.preflight.checks import (
    CHILD_STARTUP_S,
    STARTUP_TARGET,
    TIMEOUT_MARGIN,
    TIMEOUT_SLACK_S,
    derived_load_grace_s,
    derived_stall_after_s,
    derived_timeout_s,
    startup_share,
    work_for_share,
)
from sluice.preflight.facts import Capacity
from sluice.settings import Settings

MAX_KEYS_PER_SHARD = 10_000_000  # JobSpec.keys_per_shard's upper bound
LOCAL_KEYLIST = "s3://local/keys.txt"  # stands in for a local key list's URI; never read
NO_STACK = "local"  # the control bucket of a plan made outside a stack (its files in a folder: PlanInputs.root)


def keylist_manifest(settings: Settings, keys_per_shard: int | None = None, *, index: bool = True) -> Manifest:
    """The manifest a bare local key list runs with (`sluice plan` and `sluice prepare` alike)."""
    model = {"model": {"uri": settings.default_model_uri}} if settings.default_model_uri else {}
    job = {} if keys_per_shard is None else {"job": {"keys_per_shard": keys_per_shard}}
    output = {} if index else {"output": {"index": False}}
    return Manifest.model_validate({"version": 1, "input": {"key_list": LOCAL_KEYLIST}, **model, **job, **output})


@dataclass(frozen=True)
class Layout:
    """How many shards, how big, and which Batch jobs cover them."""

    n_shards: int
    keys_per_shard: int
    jobs: list[JobLayout]
    why: str = ""  # how keys_per_shard was decided (`sluice plan` prints it)


def layout(unique_keys: int, manifest: Manifest, max_array_size: int, cap: Capacity | None = None) -> Layout:
    """Array: one child per shard, several array jobs past max_array_size. MNP: node i = shard i.

    An array run's shard size is the manifest's job.keys_per_shard, else chosen_keys_per_shard's
    at `cap`'s images/s (the stack's: Capacity.build; None: Capacity's defaults).
    """
    job = manifest.job
    if job.mode == "multinode":
        kps = max(1, math.ceil(unique_keys / job.nodes))
        return Layout(job.nodes, kps, job_layouts(job.nodes, job.mode, max_array_size), "job.nodes")
    kps, why = shard_size(unique_keys, manifest, cap or Capacity())
    n = max(1, math.ceil(unique_keys / kps))
    return Layout(n, kps, job_layouts(n, job.mode, max_array_size), why)


def shard_size(unique_keys: int, manifest: Manifest, cap: Capacity) -> tuple[int, str]:
    """(keys_per_shard, why): the manifest's when it sets one, else chosen_keys_per_shard's."""
    job = manifest.job
    if "keys_per_shard" in job.model_fields_set:
        return job.keys_per_shard, "the manifest's job.keys_per_shard"
    per_s = cap.for_manifest(manifest).rate * max(1, cap.worker_gpus)
    return chosen_keys_per_shard(unique_keys, per_s)


def chosen_keys_per_shard(unique_keys: int, per_s: float) -> tuple[int, str]:
    """Shards big enough that a child's start-up stays under STARTUP_TARGET of its time, within the limits.

    `per_s`: images a second one child embeds (its GPUs together). Each shard gets at least
    work_for_share(STARTUP_TARGET) seconds of work; the limits cap the size: JobSpec's 10M keys
    and a derived timeout within Batch's 14 days (attemptDurationSeconds). The count the size
    gives needs no cap: Sluice splits past Batch's 10,000 children an array job into several
    jobs, and a lone shard runs as a plain job (an array job has at least 2 children).
    """
    n_keys = max(1, unique_keys)
    least = max(1, math.ceil(work_for_share(STARTUP_TARGET) * per_s))
    by_timeout = int((L.BATCH_MAX_TIMEOUT_S - TIMEOUT_SLACK_S) / TIMEOUT_MARGIN * per_s)
    most = max(1, min(MAX_KEYS_PER_SHARD, by_timeout))
    target = f"start-up ({CHILD_STARTUP_S} s a child) under {STARTUP_TARGET:.0%} of its time at {per_s:g} images/s"
    if n_keys <= least:
        share = startup_share(n_keys / per_s)
        return n_keys, f"one shard: all {n_keys:,} keys are {n_keys / per_s:,.0f} s of work, start-up {share:.0%}"
    if least > most:
        share = startup_share(most / per_s)
        limit = "JobSpec's 10,000,000" if most == MAX_KEYS_PER_SHARD else "a 14-day timeout's"
        return most, f"{limit} keys a shard at most: start-up {share:.0%}, over the {STARTUP_TARGET:.0%} aimed at"
    n = max(n_keys // least, math.ceil(n_keys / most))  # each shard at least `least` keys, at most `most`
    return math.ceil(n_keys / n), f"chosen: {target}"


def job_layouts(n_shards: int, mode: str, max_array_size: int) -> list[JobLayout]:
    """The Batch jobs that cover shards 0..n_shards-1 (MNP: one job, node i = shard i)."""
    if mode == "multinode":
        return [JobLayout(kind="multinode", shard_offset=0, shard_count=n_shards)]
    jobs = []
    for off in range(0, n_shards, max_array_size):
        count = min(max_array_size, n_shards - off)
        # Batch array jobs need >= 2 children: a lone shard becomes a plain job.
        jobs.append(JobLayout(kind="array" if count >= 2 else "single", shard_offset=off, shard_count=count))
    return jobs


@dataclass(frozen=True)
class PlanInputs:
    """What build_plan makes a run's plan.json from."""

    run_id: str
    manifest: Manifest
    manifest_uri: str
    control_bucket: str  # the plan's files go under s3://<control_bucket>/runs/<run_id>/ (sluice.paths.RunPaths)
    total_keys: int  # unique keys in the run's shards
    duplicates: int  # keys left out as duplicates of others
    lay: Layout
    capacity: Capacity  # the stack's (Capacity.build): decode placement, derived timeout and stall time
    model_ids: Sequence[str] | None = None  # each model's identity (sluice.modelid.identity); None: static
    lineage: Sequence[str] = ()  # an incremental run's earlier runs, newest first (RunPlan.lineage)
    skipped: Mapping[str, int] | None = None  # an incremental run's keys left out, by reason (RunPlan.skipped)
    earlier_index: IndexTarget | None = None  # an incremental run: the index of input.since_run (its plan's)
    input_buckets: Sequence[str] = ()  # the buckets a prepared run's keys name (RunPlan.input_buckets)
    root: str | None = None  # the run's folder when not runs/<run_id>/ of the control bucket (`sluice prepare`'s DIR)


def index_target(i: PlanInputs) -> IndexTarget | None:
    """The index the run's index stage updates: the manifest's, else an incremental run's earlier index."""
    spec = i.manifest.output.index
    if spec.enabled and spec.uri is None and spec.name is None and i.earlier_index is not None:
        return i.earlier_index  # the lineage's one index, updated (newest row per key wins), not a new one
    return spec.target(i.control_bucket, index_name(i.manifest.name, i.manifest_uri))


def run_times(manifest: Manifest, keys_per_shard: int, cap: Capacity) -> tuple[int, int]:
    """(job timeout, stall time) in seconds: the manifest's, else derived at `cap`'s rate for this manifest."""
    cap = cap.for_manifest(manifest)
    gpus = max(1, cap.worker_gpus)
    timeout_s = manifest.job.timeout_s or derived_timeout_s(keys_per_shard, gpus, cap.rate)
    batch = pass_batch(manifest.models)  # the batch the workers run (RunPlan.effective_batch)
    return timeout_s, manifest.job.stall_after_s or derived_stall_after_s(batch, cap.part_rate, timeout_s)


def build_plan(i: PlanInputs) -> RunPlan:
    """The plan.json a worker reads (PlanInputs documents each field)."""
    manifest, lay = i.manifest, i.lay
    root = RunPaths(i.root) if i.root else RunPaths.in_bucket(i.control_bucket, i.run_id)
    timeout_s, stall_after_s = run_times(manifest, lay.keys_per_shard, i.capacity)
    load_grace_s = manifest.job.load_grace_s or derived_load_grace_s(len(manifest.models), timeout_s)
    return RunPlan(
        run_id=i.run_id,
        manifest_uri=i.manifest_uri,
        control_bucket=i.control_bucket,
        shards_prefix=root.shards_prefix,
        output_prefix=manifest.output.prefix or root.output_prefix,
        failures_prefix=root.failures_prefix,
        total_keys=i.total_keys,
        duplicates=i.duplicates,
        n_shards=lay.n_shards,
        keys_per_shard=lay.keys_per_shard,
        mode=manifest.job.mode,
        nodes=manifest.job.nodes if manifest.job.mode == "multinode" else 1,
        gpus_per_node=i.capacity.worker_gpus,  # what each worker gets (the stack's WorkerGpus)
        spot_allowed=manifest.job.mode == "array",
        models=[
            PlannedModel.of(m, i.model_ids[n] if i.model_ids else static_identity(m, manifest.input.content))
            for n, m in enumerate(manifest.models)
        ],
        lineage=list(i.lineage),
        skipped=dict(i.skipped or {}),
        input_buckets=list(i.input_buckets),
        output_dtype=manifest.output.dtype,
        content=manifest.input.content,
        attempts=manifest.job.attempts,
        timeout_s=timeout_s,
        stall_after_s=stall_after_s,
        load_grace_s=load_grace_s,
        max_failed_fraction=manifest.max_failed_fraction,
        retry_failed=manifest.retry_failed,
        jobs=lay.jobs,
        index=index_target(i),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        decode=manifest.job.decode,
        decode_binds=i.capacity.for_manifest(manifest).decode_binds,
    )


class PutObject(Protocol):
    """Writes one object by URI: an ObjectStore's put (sluice.aws.store)."""

    def __call__(self, uri: str, data: bytes, *, content_type: str) -> None: ...


def write_plan(put: PutObject, uri: str, plan: RunPlan) -> None:
    """Write `plan` to `uri` (runs/<run>/plan.json, a retry pass's plan-retry-<k>.json) as every reader reads it."""
    put(uri, plan.model_dump_json(indent=2).encode(), content_type="application/json")
