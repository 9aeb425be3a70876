"""The prepare stage from the control plane's side: route big inputs to it, and submit after it.

The manifest Lambda only decides: it sizes the input cheaply (sluice.prepare.split) and
either plans in-process (inputs up to SLUICE_PREPARE_OVER_KEYS) or writes a PrepareSpec
and submits the two prepare jobs (map, then reduce depending on it) on the CPU queue:
PLANNING -> PREPARING with "Run Preparing". The reduce job's terminal event (or the
reconciliation sweep, when that event is lost) runs the submit step: it reads the
reducers' results (sluice.prepare.collect), writes plan.json and submits the inference
jobs: PREPARING -> SUBMITTED with "Run Submitted", or -> REJECTED ("Manifest Rejected")
when a worker found bad input, or -> FAILED (stage "prepare") when a prepare job failed.
A lease on the RUN item keeps two deliveries from submitting at once; job names make the
submission itself idempotent (sluice.control.batch). An incremental manifest (input.since_run) always
takes the prepare stage, with its lineage's output as map tasks (sluice.incremental).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import ClientError

from sluice import modelid
from sluice.aws.clients import Clients
from sluice.aws.errors import AwsFatalError
from sluice.aws.s3io import put_object, read_uri
from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts import (
    JobLayoutItem,
    JobStatus,
    ManifestRejected,
    PassItem,
    PrepareItem,
    PrepareSpec,
    PrepareTask,
    RunFailed,
    RunItem,
    RunPreparing,
    RunStatus,
    RunSubmitted,
)
from sluice.control import lineage, outbox
from sluice.control.batch import BatchAdapter
from sluice.control.ledger import Ledger
from sluice.control.notify import EventPublisher
from sluice.errors import Rejection
from sluice.input import incremental as inputs
from sluice.log import logger
from sluice.models import Manifest, RunPlan
from sluice.paths import RunPaths
from sluice.plan.layout import Layout, build_plan, job_layouts
from sluice.preflight import Capacity, RunFacts, preflight
from sluice.preflight.spent import spent
from sluice.prepare import split
from sluice.prepare.collect import collect
from sluice.prepare.split import PARTITION_FACTOR
from sluice.prepare.store import PrepareStore
from sluice.prepare.versions_reduce import place_shards
from sluice.settings import Settings


@dataclass(frozen=True)
class Started:
    """The prepare jobs a run got."""

    spec: PrepareSpec
    job_ids: list[str]
    input_bytes: int | None


@dataclass(frozen=True)
class Sized:
    """An input's size as the Lambda can learn it cheaply, and how to cut it into P workers' tasks."""

    keys: int
    input_bytes: int | None
    fits_lambda: bool
    tasks: Callable[[int], Sequence[PrepareTask]]


def size_input(manifest: Manifest, s3: Any, settings: Settings) -> Sized | None:
    """Sized input, or None for inline keys and input names the Lambda path rejects with its own reasons."""
    spec, over = manifest.input, settings.prepare_over_keys
    store = PrepareStore(s3)
    try:
        if spec.key_list is not None:
            uri = spec.key_list
            parse_s3_uri(uri)
            kl = split.estimate_keylist(store, uri)
            fits = kl.keys_estimate <= over and kl.size <= settings.max_keylist_bytes
            return Sized(
                kl.keys_estimate, kl.size, fits, lambda p: split.keylist_tasks(uri, kl.size, kl.format, kl.header, p)
            )
        if spec.inventory is not None:
            parse_s3_uri(spec.inventory)
            inv = split.estimate_inventory(store, spec.inventory)
            return Sized(
                inv.keys_estimate,
                inv.total_bytes,
                inv.keys_estimate <= over,
                lambda p: split.inventory_tasks(inv.report, p),
            )
        if spec.prefix is not None:
            bucket, prefix = parse_s3_uri(spec.prefix, allow_empty_key=True)
            pe = split.estimate_prefix(
                store, bucket, prefix, max_pages=settings.prefix_sample_pages, max_keys=settings.max_keys
            )
            return Sized(
                pe.keys_estimate,
                None,
                pe.exact and pe.keys_estimate <= over,
                lambda p: split.prefix_tasks(s3, bucket, prefix, p),
            )
    except (ValueError, AwsFatalError, Rejection):
        return None  # a bad URI or a missing / unreadable input: the Lambda path says exactly what
    return None


def route(
    run_id: str,
    manifest_uri: str,
    manifest: Manifest,
    control: str,
    settings: Settings,
    s3: Any,
    *,
    at_least: int = 0,
    model_ids: Sequence[str] = (),
    ledger: Ledger | None = None,
) -> tuple[PrepareSpec, int | None] | None:
    """The prepare spec when the input is too big for the Lambda (or prepare is forced), else None.

    `at_least`: keys the Lambda's own scan already met, beyond its cap (the estimate was low).
    `model_ids`: the models' artifact identities (sluice.modelid; default: resolved here), which
    the submit step writes into the plan. An incremental manifest (input.since_run) always gets a
    spec (`ledger`: the runs table its earlier run is checked in; sluice.incremental).
    """
    ids = list(model_ids) or [modelid.resolve(m.uri, s3) for m in manifest.models]
    if manifest.input.since_run is not None:
        return _route_incremental(run_id, manifest_uri, manifest, control, settings, s3, ids, ledger)
    sized = size_input(manifest, s3, settings)
    forced = settings.prepare_workers
    if sized is not None and at_least > sized.keys:
        sized = Sized(at_least, sized.input_bytes, False, sized.tasks)
    if sized is None or (forced is None and sized.fits_lambda):
        return None
    job = manifest.job
    workers = forced or split.choose_workers(sized.keys)
    partitions = split.choose_partitions(sized.keys, job.mode, job.nodes)
    spec = _spec(run_id, manifest_uri, manifest, control, settings, sized, workers, partitions, model_ids=ids)
    return spec, sized.input_bytes


def _spec(
    run_id: str,
    manifest_uri: str,
    manifest: Manifest,
    control: str,
    settings: Settings,
    sized: Sized,
    workers: int,
    partitions: int,
    **extra: Any,
) -> PrepareSpec:
    job = manifest.job
    return PrepareSpec(
        run_id=run_id,
        manifest_uri=manifest_uri,
        root=RunPaths.in_bucket(control, run_id).root,
        workers=workers,
        partitions=partitions,
        keys_per_shard=job.keys_per_shard,
        mode=job.mode,
        nodes=job.nodes if job.mode == "multinode" else 1,
        default_bucket=manifest.input.bucket or settings.default_input_bucket,
        suffixes=manifest.input.suffixes,
        allowed_buckets=list(settings.allowed_buckets),
        max_keys=settings.max_keys,
        input_keys_estimate=sized.keys,
        tasks=list(sized.tasks(workers)),
        **extra,
    )


def _route_incremental(
    run_id: str,
    manifest_uri: str,
    manifest: Manifest,
    control: str,
    settings: Settings,
    s3: Any,
    model_ids: list[str],
    ledger: Ledger | None,
) -> tuple[PrepareSpec, int | None]:
    """An incremental run's spec, whatever its size: its input, and its lineage's output as map tasks.

    Workers and partitions are sized for the larger of the input and the earlier rows the map
    workers read, and a reducer's share is halved (PARTITION_FACTOR: it holds versions too).
    """
    lin = lineage.resolve(manifest, run_id, control, s3, ledger)
    sized = _incremental_input(manifest, s3, settings)
    job = manifest.job
    load = max(sized.keys, lin.rows_estimate(model_ids))
    workers = settings.prepare_workers or split.choose_workers(load)
    partitions = split.choose_partitions(load * PARTITION_FACTOR, job.mode, job.nodes)
    spec = _spec(
        run_id,
        manifest_uri,
        manifest,
        control,
        settings,
        sized,
        workers,
        partitions,
        model_ids=model_ids,
        since_run=manifest.input.since_run,
        lineage=lin.ids,
        earlier=lin.tasks(model_ids, workers),
    )
    logger.info(
        "incremental run: prepare stage",
        extra={"lineage": lin.ids, "earlier_rows_estimate": lin.rows_estimate(model_ids), "workers": workers},
    )
    return spec, sized.input_bytes


def _incremental_input(manifest: Manifest, s3: Any, settings: Settings) -> Sized:
    """An incremental run's input sized: inline keys become tasks; an inventory must carry ETags."""
    if manifest.input.keys is not None:
        pairs = inputs.inline_pairs(manifest, settings)
        return Sized(len(pairs), None, False, lambda p: inputs.inline_tasks(pairs, p))
    sized = size_input(manifest, s3, settings)
    if sized is None:
        raise inputs.input_rejection(manifest, s3, settings)
    why = inputs.versions_problem(sized.tasks(1))
    if why:
        raise Rejection(why)
    return sized


def start(
    run_id: str,
    manifest_uri: str,
    manifest: Manifest,
    spec: PrepareSpec,
    input_bytes: int | None,
    settings: Settings,
    clients: Clients,
    ledger: Ledger,
) -> Started:
    """Write the spec (and the manifest it came from), submit the prepare jobs, record PREPARING."""
    paths = RunPaths(spec.root)
    put_object(clients.s3, paths.prepare_manifest, manifest.model_dump_json().encode(), "application/json")
    put_object(clients.s3, paths.prepare_spec, spec.model_dump_json().encode(), "application/json")
    ids = BatchAdapter(clients.batch).submit_prepare(
        run_id, paths.prepare_spec, spec.workers, spec.partitions, settings
    )
    preparing = RunPreparing(
        run_id=run_id,
        manifest=manifest_uri,
        workers=spec.workers,
        partitions=spec.partitions,
        input_keys_estimate=spec.input_keys_estimate,
        input_bytes=input_bytes,
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
    ledger.mark_preparing(run_id, item, preparing)
    logger.info("run preparing", extra=preparing.model_dump(exclude={"run_id"}))
    return Started(spec, ids, input_bytes)


def on_prepare_job(
    run: RunItem, job_id: str, status: JobStatus, reason: str | None, settings: Settings, clients: Clients
) -> str | None:
    """A prepare job reached `status`: submit after the reduce job, fail after any failure.

    Returns the event it decided ("Run Submitted", "Manifest Rejected", "Run Failed"), or None.
    """
    ledger = Ledger(clients.dynamodb, settings.runs_table)
    events = EventPublisher(clients.events, settings.event_bus)
    # The outbox holds one event: what is pending ("Run Preparing", or the "Run Submitted" of a
    # delivery that died after deciding) goes out before a transition replaces it.
    outbox.deliver(ledger, events, run)
    prep = run.prepare
    if prep is None or run.status != RunStatus.PREPARING or not status.terminal:
        return None
    if status == JobStatus.FAILED:
        stage = "map" if job_id == prep.map_job_id else "reduce"
        decided = fail(run, f"prepare {stage} job {job_id} failed: {reason or 'no reason given'}", ledger)
    elif job_id == prep.reduce_job_id:
        decided = submit(run, prep, settings, clients, ledger)
    else:
        return None  # the map job: the reduce job, which depends on it, decides
    if decided:
        outbox.deliver(ledger, events, ledger.get(run.run_id))
    return decided


def fail(run: RunItem, why: str, ledger: Ledger) -> str | None:
    """PREPARING -> FAILED (stage "prepare") with what to look at."""
    reason = (
        f"{why}. Its log is in CloudWatch Logs, the worker log group (/aws/batch/<stack>-worker), streams "
        "prepare/*; fix the cause and upload the manifest again"
    )
    failed = RunFailed(run_id=run.run_id, reason=reason, shards_failed=[], failed_keys_uri=None, stage="prepare")
    try:
        ledger.mark_failed(run.run_id, reason, failed, expect=RunStatus.PREPARING)
    except ClientError:  # a lost condition: another delivery decided first
        return None
    return RunFailed.detail_type


def submit(run: RunItem, prep: PrepareItem, settings: Settings, clients: Clients, ledger: Ledger) -> str | None:
    """The submit step: the reducers' results -> plan.json -> the inference jobs, once (leased)."""
    if not ledger.lease_prepared(run.run_id):
        return None
    try:
        return _submit(run, prep, settings, clients, ledger)
    except BaseException:
        ledger.release_prepared(run.run_id)
        raise


def _submit(run: RunItem, prep: PrepareItem, settings: Settings, clients: Clients, ledger: Ledger) -> str:
    read = functools.partial(read_uri, clients.s3)
    spec = PrepareSpec.model_validate_json(read(prep.spec_uri))
    paths = RunPaths(spec.root)
    manifest = Manifest.model_validate_json(read(paths.prepare_manifest))
    got = collect(spec, PrepareStore(clients.s3))
    if got.rejected is not None:
        rejected = ManifestRejected(run_id=run.run_id, manifest=run.manifest_uri, reasons=got.rejected)
        ledger.mark_rejected(run.run_id, got.rejected, rejected, expect=RunStatus.PREPARING)
        logger.warning("manifest rejected by the prepare stage", extra={"reasons": got.rejected[:5]})
        return ManifestRejected.detail_type
    if got.pieces:  # an incremental array run: its reducers' shards, numbered now (sluice.incremental)
        place_shards(spec, got.pieces, PrepareStore(clients.s3))
    mode = manifest.job.mode
    kps = spec.keys_per_shard if mode == "array" else max(1, math.ceil(got.unique_keys / spec.nodes))
    lay = Layout(got.n_shards, kps, job_layouts(got.n_shards, mode, settings.max_array_size))
    control = paths.root.removeprefix("s3://").split("/", 1)[0]
    plan = build_plan(
        run_id=run.run_id,
        manifest=manifest,
        manifest_uri=run.manifest_uri,
        control_bucket=control,
        total_keys=got.unique_keys,
        duplicates=got.duplicates,
        lay=lay,
        images_per_gpu_s=Capacity.from_settings(settings).rate,
        model_ids=spec.model_ids or None,
        lineage=spec.lineage,
        skipped=got.skipped,
    )
    put_object(clients.s3, paths.plan, plan.model_dump_json(indent=2).encode(), "application/json")
    try:
        submit_plan(
            run.run_id,
            run.manifest_uri,
            plan,
            paths.plan,
            manifest.job.queue,
            settings,
            clients,
            ledger,
            expect=RunStatus.PREPARING,
            warnings=_version_warnings(got.versions),
        )
    except Rejection as exc:  # the preflight: a limit the prepared run cannot pass
        rejected = ManifestRejected(run_id=run.run_id, manifest=run.manifest_uri, reasons=exc.reasons)
        ledger.mark_rejected(run.run_id, exc.reasons, rejected, expect=RunStatus.PREPARING)
        logger.warning("manifest rejected by the preflight", extra={"reasons": exc.reasons[:5]})
        return ManifestRejected.detail_type
    extra: dict[str, Any] = {"total_keys": plan.total_keys, "duplicates": plan.duplicates, "shards": plan.n_shards}
    if spec.incremental:
        extra.update(lineage=plan.lineage, skipped=plan.skipped, versions=got.versions)
    logger.info("run submitted after prepare", extra=extra)
    return RunSubmitted.detail_type


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


def submit_plan(
    run_id: str,
    manifest_uri: str,
    plan: RunPlan,
    plan_uri: str,
    queue: str | None,
    settings: Settings,
    clients: Clients,
    ledger: Ledger,
    *,
    expect: RunStatus = RunStatus.PLANNING,
    warnings: Sequence[str] = (),
) -> RunSubmitted:
    """Preflight, submit the plan's jobs (adopted by name when already out), record SUBMITTED with "Run Submitted".

    A preflight error (a limit the run cannot pass: sluice.preflight) raises ManifestRejected
    before anything is submitted; its warnings and cost estimate go out with "Run Submitted",
    after `warnings` (the prepare stage's).
    """
    cap = replace(Capacity.from_settings(settings), models=len(plan.models))  # each image costs every model
    checked = preflight(
        RunFacts.from_plan(plan, in_lambda=expect == RunStatus.PLANNING, max_keys=settings.max_keys), cap
    )
    if checked.errors:
        raise Rejection([f"preflight: {line}" for line in checked.lines("error")])
    job_ids = BatchAdapter(clients.batch).submit(plan, plan_uri, settings, queue=queue)
    estimate = spent(round(plan.total_keys / cap.rate))  # GPU-seconds at the estimated rate
    submitted = RunSubmitted(
        run_id=run_id,
        manifest=manifest_uri,
        total_keys=plan.total_keys,
        duplicates=plan.duplicates,
        shards=plan.n_shards,
        mode=plan.mode,
        job_ids=job_ids,
        plan_uri=plan_uri,
        warnings=[*warnings, *(f"preflight: {line}" for line in checked.lines("warn"))],
        gpu_hours_estimate=estimate["gpu_hours"],
        cost_estimate_usd=estimate["cost_usd"],
        lineage=plan.lineage,
        skipped=plan.skipped,
    )
    ledger.mark_submitted(run_id, submitted_fields(plan, job_ids, plan_uri), submitted, expect=expect)
    return submitted


def submitted_fields(plan: RunPlan, job_ids: list[str], plan_uri: str) -> dict[str, Any]:
    """The RUN item's fields once its inference jobs are out."""
    return {
        "total_keys": plan.total_keys,
        "duplicates": plan.duplicates,
        "shards": plan.n_shards,
        "mode": plan.mode,
        "job_ids": job_ids,
        "jobs": [JobLayoutItem(id=i, **j.model_dump()) for i, j in zip(job_ids, plan.jobs, strict=True)],
        "passes": [PassItem(first_shard=0, n_shards=plan.n_shards)],
        "plan_uri": plan_uri,
        "output_prefix": plan.output_prefix,
        "jobs_done": 0,
        **({"lineage": plan.lineage, "skipped": plan.skipped} if plan.lineage else {}),
    }


def reconcile_preparing(run: RunItem, settings: Settings, clients: Clients, describe: Any) -> str | None:
    """The sweep's part: a PREPARING run whose prepare jobs ended without their events reaching us."""
    prep = run.prepare
    if prep is None:
        return None
    jobs = describe([prep.map_job_id, prep.reduce_job_id])
    for jid in (prep.map_job_id, prep.reduce_job_id):
        desc = jobs.get(jid)
        if desc is None:
            continue
        decided = on_prepare_job(run, jid, JobStatus(desc["status"]), desc.get("statusReason"), settings, clients)
        if decided:
            return decided
    return None


__all__ = ["Started", "fail", "on_prepare_job", "reconcile_preparing", "route", "start", "submit"]
