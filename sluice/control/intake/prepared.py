"""The prepare stage from the control plane's side: start its jobs, react to their ends, submit after it.

`start`: a run routed to the prepare stage (sluice.control.intake.route) gets its PrepareSpec and the
parsed manifest under runs/<run>/prepare/, and two Batch jobs on the CPU queue (map, then reduce
depending on it; adopted by name, sluice.control.batch): PLANNING -> PREPARING with "Run
Preparing". `on_job_end`: the reduce job's end (its event, or the sweep's DescribeJobs when that
event is lost) runs the submit step: a lease on the RUN item, the reducers' results
(sluice.prepare.collect) -> plan.json -> sluice.control.submit: PREPARING -> SUBMITTED with "Run
Submitted"; -> REJECTED ("Manifest Rejected") when a worker found bad input or the preflight
refuses the prepared run; a FAILED prepare job -> FAILED (stage "prepare"). The lease keeps two
deliveries from submitting at once; job names make the submission itself idempotent. Each
decision writes its event to the outbox; the caller publishes it (sluice.control.completion.state_change.decide).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from sluice.aws.store import ObjectStore
from sluice.contracts.events import ManifestRejected, RunFailed, RunPreparing, RunSubmitted
from sluice.contracts.manifest import IndexTarget, Manifest
from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import PrepareSpec
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control import submit
from sluice.control.context import Context, RunRequest, control_bucket, run_paths
from sluice.control.intake.route import ToPrepare
from sluice.control.table.items import PrepareItem, RunItem
from sluice.errors import Rejection
from sluice.log import logger
from sluice.paths import RunPaths
from sluice.plan.layout import Layout, PlanInputs, build_plan, job_layouts, write_plan
from sluice.prepare import prepare_store
from sluice.prepare.collect import Collected, collect
from sluice.prepare.reducer.versions import place_shards


@dataclass(frozen=True)
class Started:
    """The prepare jobs a run got."""

    spec: PrepareSpec
    job_ids: list[str]
    input_bytes: int | None


@dataclass(frozen=True)
class JobEnd:
    """A prepare job's state, from its event or from DescribeJobs (the sweep)."""

    job_id: str
    status: JobStatus
    reason: str | None


def start(ctx: Context, req: RunRequest, routed: ToPrepare) -> Started:
    """Write the spec (and the manifest it came from), submit the prepare jobs, record PREPARING."""
    spec, paths, s3 = routed.spec, req.paths, ctx.clients.s3
    ObjectStore(s3).put(paths.prepare_manifest, req.manifest.model_dump_json().encode(), "application/json")
    ObjectStore(s3).put(paths.prepare_spec, spec.model_dump_json().encode(), "application/json")
    ids = ctx.batch.submit_prepare(req.run_id, paths.prepare_spec, spec.workers, spec.partitions, ctx.settings)
    preparing = RunPreparing(
        run_id=req.run_id,
        manifest=req.manifest_uri,
        workers=spec.workers,
        partitions=spec.partitions,
        input_keys_estimate=spec.input_keys_estimate,
        input_bytes=routed.input_bytes,
        job_ids=ids,
    )
    item = PrepareItem(
        spec_uri=paths.prepare_spec,
        workers=spec.workers,
        partitions=spec.partitions,
        map_job_id=ids[0],
        reduce_job_id=ids[1],
        input_keys_estimate=spec.input_keys_estimate,
        started_at=int(time.time()),
    )
    ctx.ledger.mark_preparing(req.run_id, item, preparing)
    logger.info("run preparing", extra=preparing.model_dump(exclude={"run_id"}))
    return Started(spec, ids, routed.input_bytes)


def on_job_end(ctx: Context, run: RunItem, end: JobEnd) -> str | None:
    """A prepare job reached `end.status`: submit after the reduce job, fail after any failure.

    Returns the event it decided ("Run Submitted", "Manifest Rejected", "Run Failed"), or None.
    """
    prep = run.prepare
    if prep is None or run.status != RunStatus.PREPARING or not end.status.terminal:
        return None
    if end.status == JobStatus.FAILED:
        stage = "map" if end.job_id == prep.map_job_id else "reduce"
        return fail(ctx, run, f"prepare {stage} job {end.job_id} failed: {end.reason or 'no reason given'}")
    if end.job_id == prep.reduce_job_id:
        return submit_step(ctx, run, prep)
    return None  # the map job: the reduce job, which depends on it, decides


def ends(run: RunItem, describe: Callable[[list[str]], dict[str, dict[str, Any]]]) -> list[JobEnd]:
    """The sweep's view of a PREPARING run's prepare jobs (map first), from DescribeJobs."""
    if run.prepare is None:
        return []
    jobs = describe(list(run.prepare.job_ids))
    return [
        JobEnd(jid, JobStatus(desc["status"]), desc.get("statusReason"))
        for jid in run.prepare.job_ids
        if (desc := jobs.get(jid)) is not None
    ]


def fail(ctx: Context, run: RunItem, why: str) -> str | None:
    """PREPARING -> FAILED (stage "prepare") with what to look at."""
    reason = (
        f"{why}. Its log is in CloudWatch Logs, the worker log group (/aws/batch/<stack>-worker), streams "
        "prepare/*; fix the cause and upload the manifest again"
    )
    failed = RunFailed(run_id=run.run_id, reason=reason, shards_failed=[], failed_keys_uri=None, stage="prepare")
    try:
        ctx.ledger.mark_failed(run.run_id, reason, failed, expect=RunStatus.PREPARING)
    except ClientError:  # a lost condition: another delivery decided first
        return None
    return RunFailed.detail_type


def submit_step(ctx: Context, run: RunItem, prep: PrepareItem) -> str | None:
    """The reducers' results -> plan.json -> the inference jobs, once (leased)."""
    if not ctx.ledger.lease_prepared(run.run_id):
        return None
    try:
        return _submit(ctx, run, prep)
    except BaseException:
        ctx.ledger.release_prepared(run.run_id)
        raise


def _submit(ctx: Context, run: RunItem, prep: PrepareItem) -> str | None:
    read = ObjectStore(ctx.clients.s3).get
    spec = PrepareSpec.model_validate_json(read(prep.spec_uri))
    manifest = Manifest.model_validate_json(read(run_paths(run).prepare_manifest))
    req = RunRequest.of(run.run_id, run.manifest_uri, manifest, control_bucket(run), spec.model_ids)
    got = collect(spec, prepare_store(ctx.clients.s3))
    if got.rejected is not None:
        return _reject(ctx, req, got.rejected, "manifest rejected by the prepare stage")
    plan = _plan(ctx, req, spec, got)
    try:
        submit.submit(ctx, req, plan, expect=RunStatus.PREPARING, warnings=_version_warnings(got.versions))
    except Rejection as exc:  # the preflight: a limit the prepared run cannot pass
        return _reject(ctx, req, exc.reasons, "manifest rejected by the preflight")
    except submit.Superseded:  # another delivery recorded the submission first
        return None
    extra: dict[str, Any] = {"total_keys": plan.total_keys, "duplicates": plan.duplicates, "shards": plan.n_shards}
    if spec.incremental:
        extra.update(lineage=plan.lineage, skipped=plan.skipped, versions=got.versions)
    logger.info("run submitted after prepare", extra=extra)
    return RunSubmitted.detail_type


def _plan(ctx: Context, req: RunRequest, spec: PrepareSpec, got: Collected) -> RunPlan:
    """plan.json from the reducers' results (an incremental array run's shards numbered and placed first)."""
    if got.pieces:  # an incremental array run: its reducers' shards, numbered now (sluice.incremental)
        place_shards(spec, got.pieces, prepare_store(ctx.clients.s3))
    mode = req.manifest.job.mode
    kps = spec.keys_per_shard if mode == "array" else max(1, math.ceil(got.unique_keys / spec.nodes))
    lay = Layout(got.n_shards, kps, job_layouts(got.n_shards, mode, ctx.settings.max_array_size))
    plan = build_plan(
        PlanInputs(
            run_id=req.run_id,
            manifest=req.manifest,
            manifest_uri=req.manifest_uri,
            control_bucket=req.control_bucket,
            total_keys=got.unique_keys,
            duplicates=got.duplicates,
            lay=lay,
            capacity=ctx.capacity,
            model_ids=list(req.model_ids) or None,
            lineage=spec.lineage,
            skipped=got.skipped,
            earlier_index=_earlier_index(ctx, req, spec),
            # The buckets the workers read from: a key list's or an inventory's keys name them, not the manifest.
            input_buckets=got.buckets,
        )
    )
    write_plan(ObjectStore(ctx.clients.s3).put, req.paths.plan, plan)
    return plan


def _earlier_index(ctx: Context, req: RunRequest, spec: PrepareSpec) -> IndexTarget | None:
    """An incremental run's earlier index: input.since_run's plan names it (its lineage was checked at the upload)."""
    if not spec.lineage:
        return None
    earlier = RunPaths.in_bucket(req.control_bucket, spec.lineage[0]).plan
    return RunPlan.model_validate_json(ObjectStore(ctx.clients.s3).get(earlier)).index


def _reject(ctx: Context, req: RunRequest, reasons: list[str], message: str) -> str:
    """PREPARING -> REJECTED with the reasons (the stage's or the preflight's) and "Manifest Rejected"."""
    rejected = ManifestRejected(run_id=req.run_id, manifest=req.manifest_uri, reasons=reasons)
    ctx.ledger.mark_rejected(req.run_id, reasons, rejected, expect=RunStatus.PREPARING)
    logger.warning(message, extra={"reasons": reasons[:5]})
    return ManifestRejected.detail_type


def _version_warnings(counts: dict[str, int]) -> list[str]:
    """Why some keys of an incremental run were embedded again though they may be unchanged, and what to do."""
    out = []
    if counts.get("head_denied"):
        out.append(
            f"input.since_run: {counts['head_denied']} HEADs were denied, so those keys were embedded again: grant the "
            "prepare job role s3:GetObject on the input objects (template.yaml InputBucketNames)"
        )
    if counts.get("earlier_unversioned"):
        out.append(
            f"input.since_run: {counts['earlier_unversioned']} earlier output files have no object versions (written "
            "before Sluice recorded them) or are not readable: their keys were embedded again"
        )
    return out


__all__ = ["JobEnd", "Started", "ends", "fail", "on_job_end", "start", "submit_step"]
