"""Submit: a written plan -> preflight -> SubmitJob -> SUBMITTED with "Run Submitted".

Both routes end here: the manifest Lambda after planning in-process (the run PLANNING), the
prepare stage's submit step after its reducers (the run PREPARING, sluice.control.prepared). A
preflight error (a limit the run cannot pass: sluice.preflight) raises Rejection before
anything is submitted; its warnings and the GPU-hour and cost estimate go out with "Run
Submitted". SubmitJob has no idempotency token, so each job is adopted by its deterministic name
when a delivery that died before recording it already submitted it (sluice.control.batch); the
transition is conditional on the status the run had (sluice.control.ledger).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sluice.contracts import JobLayoutItem, PassItem, RunStatus, RunSubmitted
from sluice.control.context import Context, RunRequest
from sluice.errors import Rejection
from sluice.models import RunPlan
from sluice.preflight import Capacity, RunFacts, preflight
from sluice.preflight.locality import InputSize, add_locality, input_buckets
from sluice.preflight.spent import spent


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
    `warnings` (the prepare stage's) go out before the preflight's.
    """
    settings, plan_uri = ctx.settings, req.paths.plan
    cap = replace(
        Capacity.from_settings(settings), models=len(plan.models), decode=plan.decode
    )  # each image costs every model
    checked = preflight(
        RunFacts.from_plan(plan, in_lambda=expect == RunStatus.PLANNING, max_keys=settings.max_keys), cap
    )
    s3 = ctx.clients.s3  # input buckets in another Region: warned about, the transfer priced
    buckets = input_buckets(req.manifest.input, settings.default_input_bucket)
    add_locality(checked, buckets, s3.meta.region_name, s3, InputSize(plan.total_keys))
    if checked.errors:
        raise Rejection([f"preflight: {line}" for line in checked.lines("error")])
    job_ids = ctx.batch.submit(plan, plan_uri, settings, queue=req.manifest.job.queue)
    estimate = spent(round(plan.total_keys / cap.rate))  # GPU-seconds at the estimated rate
    submitted = RunSubmitted(
        run_id=req.run_id,
        manifest=req.manifest_uri,
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
    ctx.ledger.mark_submitted(req.run_id, submitted_fields(plan, job_ids, plan_uri), submitted, expect=expect)
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


__all__ = ["submit", "submitted_fields"]
