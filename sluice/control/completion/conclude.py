"""Conclude: a run whose every job is terminal and every shard settled gets its outcome, once.

One invocation wins the conditional FINALIZING claim (sluice.control.table.ledger.begin_finalize;
a FINALIZING run whose finalizer died is claimed again after its lease) and tallies the run
from its write-sharded counters and the FAIL# / RETRY# marks (sluice.control.table.records), not
from every shard. Then: a retry pass for transient failures (sluice.control.completion.retry), or exactly
one outcome: FINALIZING -> SUCCEEDED with "Run Succeeded", or -> FAILED with "Run Failed",
written with the decision (the RUN item's outbox; the caller publishes it). An error while
deciding releases the claim to the status the run had, so the retried event decides again.
"""

from __future__ import annotations

import time

from sluice.aws.store import ObjectStore
from sluice.contracts.events import RunFailed, RunSucceeded
from sluice.contracts.plan import RunPlan, load_plan
from sluice.contracts.status import RunStatus
from sluice.control.completion import retry
from sluice.control.completion.verdict import RunFigures, figures_from_counts, figures_from_items
from sluice.control.context import Context
from sluice.control.indexing import stage as indexing
from sluice.control.sweep.stall import live_jobs
from sluice.control.sweep.tail import split_figures
from sluice.control.table.items import Counts, PassItem, RunItem, main_passes
from sluice.control.table.records import FAIL, RETRY
from sluice.log import logger
from sluice.preflight.spent import spent


def maybe_conclude(ctx: Context, run: RunItem, *, now: float | None = None, counts: Counts | None = None) -> str | None:
    """Conclude the run once every job is terminal and every shard settled; what it decided, or None.

    `run` is read after the caller's own writes (so the last of two concurrent events sees both);
    `counts`, when given, too. A FINALIZING run whose finalizer died (lease expired) is concluded again.
    """
    now = time.time() if now is None else now
    stalled = run.status == RunStatus.FINALIZING and (run.lease_until or 0) < now
    if not (run.status.active or stalled) or run.jobs_done < len(run.jobs or []):
        return None
    if (counts or ctx.records.counts(run.run_id)).shards_done < run.total_shards:
        return None  # a job is terminal but some of its shards' events are still on their way
    return conclude_run(ctx, run.run_id, now=now)


def conclude_run(ctx: Context, run_id: str, *, now: float | None = None) -> str | None:
    """Decide the run: a retry pass (retry.RETRY_PASS), or exactly one outcome. None if another invocation has it."""
    run = ctx.ledger.begin_finalize(run_id, now=now)
    if run is None:
        return None
    previous = run.finalize_from if run.finalize_from and run.finalize_from.active else RunStatus.RUNNING
    try:
        decided = _conclude(ctx, run)
    except BaseException:
        logger.exception("finalizing failed; releasing for the retried event", extra={"run_id": run_id})
        ctx.ledger.release_finalize(run_id, previous)
        raise
    if decided is None:
        ctx.ledger.release_finalize(run_id, previous)
    return decided


def _conclude(ctx: Context, run: RunItem) -> str | None:
    plan = load_plan(ObjectStore(ctx.clients.s3).get, str(run.plan_uri))
    # A RUN item written before passes were recorded has had the first one only.
    passes = run.passes or [PassItem(first_shard=0, n_shards=plan.n_shards)]
    n_total = sum(p.n_shards for p in passes)
    retry_passes = len(main_passes(passes)) - 1
    t = _run_figures(ctx, run, n_total, retry_passes < plan.retry_failed)
    if t is None or not t.complete:
        logger.info("not concluding: shards unsettled", extra={"run_id": run.run_id})
        return None
    t.failed -= run.retried_keys  # keys re-run by a retry pass are counted by that pass's shards
    reason = t.reason()
    if reason is None and retry.start_pass(ctx, run, plan, t, passes):
        return retry.RETRY_PASS
    if reason is not None:
        return _record_failure(ctx, run, plan, t, reason)
    return _record_success(ctx, run, plan, t, retry_passes=retry_passes)


def _run_figures(ctx: Context, run: RunItem, n_total: int, retries_left: bool) -> RunFigures | None:
    """The run's tally from its counters and marks; None while a shard is unsettled.

    Shards are counted only inside the run and each terminal shard once, so shards_done ==
    n_total means every shard is settled. The counters give the figures and the FAIL# / RETRY#
    marks name the shards that matter: a succeeded run costs one TransactGetItems, a failed one a
    Query of its failed shards, not of all of them (a 30,000-shard run's SHARD items are ten
    1-MB pages). Counters or marks written before these existed (the per-reason sums, a mark
    per failed shard) are detected and the run is tallied from every SHARD item instead.
    """
    counts = ctx.records.counts(run.run_id)
    if counts.shards_done < n_total:
        return None
    want_retry = bool(counts.keys_transient) and retries_left
    if counts.reasons_complete:
        fails = ctx.records.marks(run.run_id, FAIL) if counts.shards_failed else []
        marked = ctx.records.marks(run.run_id, RETRY) if want_retry else []
        if len(fails) == counts.shards_failed and (marked or not want_retry):
            jobs = live_jobs(run, ctx.records.job_items(run.run_id)) if run.jobs_failed and not fails else []
            failed = [(m.shard, m.why or "failed") for m in fails]
            return figures_from_counts(n_total, counts, failed, [m.shard for m in marked], jobs)
    shards = ctx.records.shard_items(run.run_id)
    jobs = live_jobs(run, ctx.records.job_items(run.run_id))  # less those Sluice ended to re-submit a stall
    return figures_from_items(n_total, shards, jobs)


def _record_success(ctx: Context, run: RunItem, plan: RunPlan, t: RunFigures, *, retry_passes: int) -> str:
    """FINALIZING -> SUCCEEDED with "Run Succeeded" (its figures measured from the shards' results)."""
    detail = RunSucceeded(
        run_id=run.run_id,
        processed=t.processed,
        failed=t.failed,
        output_prefix=plan.output_prefix,
        duration_s=round(time.time() - float(run.created_at), 1),
        failed_by_reason={r: n for r, n in sorted(t.by_reason.items()) if n},
        failed_keys_uri=plan.failures_prefix,
        retry_passes=retry_passes,
        **spent(t.gpu_seconds, ctx.capacity.gpu_family),
        **split_figures(ctx, run),
    )
    ctx.ledger.leave_finalizing(
        run.run_id,
        RunStatus.SUCCEEDED,
        {
            "processed": t.processed,
            "failed_keys": t.failed,
            "gpu_seconds": t.gpu_seconds,
            "finished_at": int(time.time()),
            # the index stage's claim, in the same write: never lost between the two
            **indexing.claim(plan, t.processed, ctx.settings),
        },
        outbox=detail,
    )
    logger.info("run succeeded", extra={"run_id": run.run_id, "processed": t.processed, "failed": t.failed})
    return detail.detail_type


def _record_failure(ctx: Context, run: RunItem, plan: RunPlan, t: RunFigures, reason: str) -> str:
    """FINALIZING -> FAILED with "Run Failed" naming the failed shards (or jobs)."""
    shards = [i for i, _ in t.failed_shards]
    detail = RunFailed(
        run_id=run.run_id,
        reason=reason,
        shards_failed=shards,
        failed_keys_uri=plan.failures_prefix,
        processed=t.processed,
        failed=t.failed,
        duration_s=round(time.time() - float(run.created_at), 1),
        **spent(t.gpu_seconds, ctx.capacity.gpu_family),
        **split_figures(ctx, run),
    )
    ctx.ledger.leave_finalizing(
        run.run_id,
        RunStatus.FAILED,
        {
            "reason": reason,
            "processed": t.processed,
            "failed_keys": t.failed,
            "shards_failed_list": shards,
            "gpu_seconds": t.gpu_seconds,
            "finished_at": int(time.time()),
        },
        outbox=detail,
    )
    logger.info("run failed", extra={"run_id": run.run_id, "reason": reason})
    return detail.detail_type


__all__ = ["conclude_run", "maybe_conclude"]
