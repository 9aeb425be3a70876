"""Submit: a written plan -> preflight -> SubmitJob -> SUBMITTED with "Run Submitted".

Both routes end here: the manifest Lambda after planning in-process (the run PLANNING), the
prepare stage's submit step after its reducers (the run PREPARING, sluice.control.intake.prepared). A
preflight error (a limit the run cannot pass: sluice.preflight) raises Rejection before
anything is submitted; its warnings and its GPU-hour and cost estimate (the one `sluice plan`
shows) go out with "Run Submitted". SubmitJob has no idempotency token, so each job is adopted by its deterministic name
when a delivery that died before recording it already submitted it (sluice.control.batch); the
transition is conditional on the status the run had (sluice.control.table.ledger). Two invocations
that both planned one run (a redrive racing the original, sluice.control.sweep.redrive) can both
reach SubmitJob before either's job is listed: the one whose transition loses withdraws the
jobs the recorded submission does not name, so the run keeps one set of jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.contracts.events import RunSubmitted
from sluice.contracts.plan import RunPlan
from sluice.contracts.sections import stand_in_warnings
from sluice.contracts.status import RunStatus
from sluice.control.context import Context, RunRequest
from sluice.control.table.items import JobLayoutItem, PassItem
from sluice.errors import Rejection
from sluice.log import logger
from sluice.preflight import RunFacts, preflight
from sluice.preflight.locality import InputSize, add_locality, input_buckets
from sluice.preflight.spent import run_cost

WITHDRAWN = "sluice: superseded: another invocation recorded this run's submission"


class Superseded(Exception):
    """Another invocation recorded the run's submission first (its jobs stand; this one's extra jobs are withdrawn)."""


def submit(
    ctx: Context,
    req: RunRequest,
    plan: RunPlan,
    *,
    expect: RunStatus = RunStatus.PLANNING,
    warnings: Sequence[str] = (),
) -> RunSubmitted:
    """Preflight, submit the plan's jobs (adopted by name when already out), record SUBMITTED with "Run Submitted".

    `expect`: the run's status now (PLANNING in the Lambda, PREPARING after the prepare stage);
    `warnings` (the prepare stage's) go out after a builtin stand-in model's and before the preflight's.
    """
    settings, plan_uri = ctx.settings, req.paths.plan
    facts = RunFacts.from_plan(
        plan, in_lambda=expect == RunStatus.PLANNING, max_keys=settings.max_keys, manifest=req.manifest
    )
    checked = preflight(facts, ctx.capacity.for_plan(plan))
    s3 = ctx.clients.s3  # input buckets in another Region: warned about, the transfer priced
    buckets = plan.input_buckets or input_buckets(req.manifest.input, settings.default_input_bucket)
    add_locality(checked, buckets, s3.meta.region_name, s3, InputSize(plan.total_keys))
    if checked.errors:
        raise Rejection([f"preflight: {line}" for line in checked.lines("error")])
    job_ids = ctx.batch.submit(plan, plan_uri, settings, queue=req.manifest.job.queue)
    submitted = RunSubmitted(
        run_id=req.run_id,
        manifest=req.manifest_uri,
        total_keys=plan.total_keys,
        duplicates=plan.duplicates,
        shards=plan.n_shards,
        mode=plan.mode,
        job_ids=job_ids,
        plan_uri=plan_uri,
        warnings=[
            *stand_in_warnings([m.uri for m in plan.models]),
            *warnings,
            *(f"preflight: {line}" for line in checked.lines("warn")),
        ],
        gpu_hours_estimate=checked.cost["gpu_hours"],
        cost_estimate_usd=run_cost(checked.cost),
        lineage=plan.lineage,
        skipped=plan.skipped,
    )
    try:
        fields = submitted_fields(plan, job_ids, plan_uri) | {"gpu_family": ctx.capacity.gpu_family}
        if submitted.warnings:
            fields["warnings"] = submitted.warnings
        ctx.ledger.mark_submitted(req.run_id, fields, submitted, expect=expect)
    except ClientError as exc:  # only a lost condition stays a ClientError: the run is no longer `expect`
        _withdraw(ctx, req.run_id, job_ids)
        raise Superseded(req.run_id) from exc
    return submitted


def _withdraw(ctx: Context, run_id: str, job_ids: Sequence[str]) -> None:
    """Terminate this invocation's jobs that the run's recorded submission does not name.

    Nothing is withdrawn while no submission is recorded: the next claimant adopts the jobs by name.
    """
    run = ctx.ledger.get(run_id)
    kept = set(run.job_ids or []) if run is not None else set()
    for job_id in [j for j in job_ids if kept and j not in kept]:
        try:
            ctx.clients.batch.terminate_job(jobId=job_id, reason=WITHDRAWN)
        except (ClientError, BotoCoreError) as exc:  # its events are ignored: not one of the run's jobs
            logger.error("could not withdraw a duplicate job", extra={"job_id": job_id, "error": str(exc)[:300]})
        else:
            logger.warning("duplicate job withdrawn", extra={"run_id": run_id, "job_id": job_id})


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
        "kind": plan.content.kind,
        "jobs_done": 0,
        **({"lineage": plan.lineage, "skipped": plan.skipped} if plan.lineage else {}),
    }


__all__ = ["WITHDRAWN", "Superseded", "submit", "submitted_fields"]
