"""Route: is a run planned here, in the manifest Lambda, or by the prepare stage? Decided only here.

The Lambda sizes the input cheaply (sluice.prepare.split): a key list by a HEAD and one ranged
GET, an inventory by its manifest.json, a prefix by a bounded listing. Inline keys, and inputs
estimated at or below SLUICE_PREPARE_OVER_KEYS whose size is known, are planned here: pass 1
and 2 (sluice.plan) write the shards, then plan.json. Anything bigger, every run when
SLUICE_PREPARE_WORKERS forces the prepare stage, and every incremental manifest
(input.since_run: its lineage's output becomes map tasks, sluice.control.intake.lineage) gets a
PrepareSpec for the prepare stage (sluice.control.intake.prepared). The in-Lambda scan stops at
LAMBDA_CAP_FACTOR x the threshold, so an input whose estimate was low (long lines sampled
first) is routed to the prepare stage after all, with the keys the scan met as its size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sluice.aws.errors import AwsFatalError
from sluice.aws.s3uri import parse_s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import PrepareSpec, PrepareTask
from sluice.control.context import Context, RunRequest
from sluice.control.intake import lineage
from sluice.errors import Rejection, TooBigForLambda
from sluice.input import incremental as inputs
from sluice.input.checks import guarded, reading_input
from sluice.input.keys import iter_keys
from sluice.log import logger
from sluice.paths import SCRATCH_TAG
from sluice.plan.layout import PlanInputs, build_plan, layout, shard_size, write_plan
from sluice.plan.scan import scan, write_shards
from sluice.prepare import prepare_store, split
from sluice.prepare.split import PARTITION_FACTOR
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

LAMBDA_CAP_FACTOR = 4  # 20M keys at the default threshold: ~55 CPU-s and ~550 MiB measured, inside the limits


@dataclass(frozen=True)
class ToPrepare:
    """The route to the prepare stage: its spec, and the input's size in bytes when known."""

    spec: PrepareSpec
    input_bytes: int | None


@dataclass(frozen=True)
class Sized:
    """An input's size as the Lambda can learn it cheaply, and how to cut it into P workers' tasks."""

    keys: int
    input_bytes: int | None
    fits_lambda: bool
    tasks: Callable[[int], Sequence[PrepareTask]]


def route(ctx: Context, req: RunRequest) -> RunPlan | ToPrepare:
    """The run planned here (its plan, written), or its route to the prepare stage."""
    with reading_input():
        to_prepare = _to_prepare(ctx, req)
    if to_prepare is not None:
        return to_prepare
    try:
        return plan_here(ctx, req)
    except TooBigForLambda as exc:  # the estimate was low (long lines sampled first): prepare after all
        with reading_input():
            to_prepare = _to_prepare(ctx, req, at_least=exc.keys_seen)
        if to_prepare is None:
            raise
        return to_prepare


def size_input(manifest: Manifest, s3: S3Client, settings: Settings) -> Sized | None:
    """Sized input, or None for inline keys and input names the Lambda path rejects with its own reasons."""
    spec, over = manifest.input, settings.prepare_over_keys
    store = prepare_store(s3)
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


def _to_prepare(ctx: Context, req: RunRequest, *, at_least: int = 0) -> ToPrepare | None:
    """The prepare route when the input is too big for the Lambda (or prepare is forced), else None.

    `at_least`: keys the Lambda's own scan already met, beyond its cap (the estimate was low).
    An incremental manifest (input.since_run) always takes the prepare stage.
    """
    if req.manifest.input.since_run is not None:
        return _incremental(ctx, req)
    sized = size_input(req.manifest, ctx.clients.s3, ctx.settings)
    forced = ctx.settings.prepare_workers
    if sized is not None and at_least > sized.keys:
        sized = replace(sized, keys=at_least, fits_lambda=False)
    if sized is None or (forced is None and sized.fits_lambda):
        return None
    job = req.manifest.job
    workers = forced or split.choose_workers(sized.keys)
    partitions = split.choose_partitions(sized.keys, job.mode, job.nodes)
    return ToPrepare(_spec(ctx, req, sized, workers, partitions), sized.input_bytes)


def _spec(ctx: Context, req: RunRequest, sized: Sized, workers: int, partitions: int, **extra: Any) -> PrepareSpec:
    job, settings = req.manifest.job, ctx.settings
    return PrepareSpec(
        run_id=req.run_id,
        manifest_uri=req.manifest_uri,
        root=req.paths.root,
        workers=workers,
        partitions=partitions,
        keys_per_shard=shard_size(sized.keys, req.manifest, ctx.capacity)[0],  # from the estimate: fixed before the map
        mode=job.mode,
        nodes=job.nodes if job.mode == "multinode" else 1,
        default_bucket=req.manifest.input.bucket or settings.default_input_bucket,
        suffixes=req.manifest.input.suffixes,
        allowed_buckets=list(settings.allowed_buckets),
        max_keys=settings.max_keys,
        input_keys_estimate=sized.keys,
        tasks=list(sized.tasks(workers)),
        model_ids=list(req.model_ids),
        **extra,
    )


def _incremental(ctx: Context, req: RunRequest) -> ToPrepare:
    """An incremental run's route, whatever its size: its input, and its lineage's output as map tasks.

    Workers and partitions are sized for the larger of the input and the earlier rows the map
    workers read, and a reducer's share is halved (PARTITION_FACTOR: it holds versions too).
    """
    manifest, s3, model_ids = req.manifest, ctx.clients.s3, list(req.model_ids)
    lin = lineage.resolve(manifest, req.run_id, req.control_bucket, s3, ctx.ledger)
    sized = _incremental_input(manifest, s3, ctx.settings)
    load = max(sized.keys, lin.rows_estimate(model_ids))
    workers = ctx.settings.prepare_workers or split.choose_workers(load)
    partitions = split.choose_partitions(load * PARTITION_FACTOR, manifest.job.mode, manifest.job.nodes)
    spec = _spec(
        ctx,
        req,
        sized,
        workers,
        partitions,
        since_run=manifest.input.since_run,
        lineage=lin.ids,
        earlier=lin.tasks(model_ids, workers),
    )
    logger.info(
        "incremental run: prepare stage",
        extra={"lineage": lin.ids, "earlier_rows_estimate": lin.rows_estimate(model_ids), "workers": workers},
    )
    return ToPrepare(spec, sized.input_bytes)


def _incremental_input(manifest: Manifest, s3: S3Client, settings: Settings) -> Sized:
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


def plan_here(ctx: Context, req: RunRequest) -> RunPlan:
    """Pass 1 and 2 over the keys in the Lambda: shards under runs/<run>/shards/, then plan.json (written last).

    Raises TooBigForLambda when the scan meets more keys than the Lambda may plan (route() then
    sends the input to the prepare stage).
    """
    s3, settings, manifest = ctx.clients.s3, ctx.settings, req.manifest
    # Inline keys are bounded by the manifest's size; anything else stops at LAMBDA_CAP_FACTOR x
    # the routing threshold, so a low estimate cannot push the Lambda past its memory or time.
    cap = None if manifest.input.keys is not None else settings.prepare_over_keys * LAMBDA_CAP_FACTOR
    keys = guarded(iter_keys(manifest, s3, settings))
    store = ObjectStore(s3)
    with scan(keys, max_keys=settings.max_keys, spill_dir=settings.spill_dir, lambda_cap=cap) as sc:
        lay = layout(sc.unique_keys, manifest, settings.max_array_size, ctx.capacity)
        plan = build_plan(
            PlanInputs(
                run_id=req.run_id,
                manifest=manifest,
                manifest_uri=req.manifest_uri,
                control_bucket=req.control_bucket,
                total_keys=sc.unique_keys,
                duplicates=sc.duplicates,
                lay=lay,
                capacity=ctx.capacity,
                model_ids=list(req.model_ids),
            )
        )
        write_shards(sc, lay, lambda i, data: store.put(plan.shard_uri(i), data, tagging=SCRATCH_TAG))
    write_plan(store.put, req.paths.plan, plan)
    return plan


__all__ = ["LAMBDA_CAP_FACTOR", "Sized", "ToPrepare", "plan_here", "route", "size_input"]
