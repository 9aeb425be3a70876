"""Batch job state changes -> runs table -> "Run Progress" / "Run Succeeded" / "Run Failed".

Every update is idempotent and order-insensitive (sluice.control.records): a shard keeps the state of
its newest event, and a terminal state is settled when it is recorded: its outcome and
the worker's counts (result.json) go into the shard's item, with the run's write-sharded
counters and the shard's FAIL# / RETRY# marks, in one transaction. The run is concluded only
when every submitted job is terminal AND every shard is settled: one invocation wins a
conditional claim (FINALIZING), reads the counters and the marks (not every shard, not 2N
objects) and decides: a retry pass for transient
failures, or exactly one outcome, written to the RUN item's outbox with the decision and
then published (sluice.control.outbox). Shards whose events were lost are settled from Batch by
the reconciliation sweep (sluice.control.reconcile).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from sluice.aws.clients import Clients
from sluice.aws.s3io import put_object, read_if_exists, read_uri
from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts import (
    TRANSIENT_FAILURE_REASONS,
    Counts,
    FailureLine,
    FailureReason,
    JobLayoutItem,
    JobStatus,
    PassItem,
    RunFailed,
    RunItem,
    RunProgress,
    RunStatus,
    RunSucceeded,
    ShardResult,
)
from sluice.control import outbox, staging
from sluice.control.batch import BatchAdapter
from sluice.control.batch_events import BatchJobStateChangeDetail
from sluice.control.ledger import Ledger
from sluice.control.notify import EventPublisher
from sluice.control.records import FAIL, RETRY, ShardRecords
from sluice.control.verdict import RunFigures, figures_from_counts, figures_from_items, settle_shard
from sluice.log import logger
from sluice.models import JobLayout, RunPlan, load_plan
from sluice.paths import SCRATCH_TAG, RunPaths
from sluice.preflight.spent import spent
from sluice.settings import Settings
from sluice.shards import encode_shard


@dataclass
class JobEventOutcome:
    """What handling one Batch event did."""

    status: str  # ignored | recorded | stale | finalized | retrying | submitted (after prepare)
    run_id: str | None = None
    reason: str | None = None
    shard: int | None = None
    published: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """Settings, clients and the adapters built from them, for one unit of work."""

    settings: Settings
    clients: Clients
    ledger: Ledger
    records: ShardRecords
    events: EventPublisher

    @classmethod
    def build(cls, settings: Settings | None = None, clients: Clients | None = None) -> Context:
        settings = settings or Settings.from_env()
        clients = clients or Clients()
        return cls(
            settings,
            clients,
            Ledger(clients.dynamodb, settings.runs_table),
            ShardRecords(clients.dynamodb, settings.runs_table),
            EventPublisher(clients.events, settings.event_bus),
        )


WAITING_STATES = frozenset({JobStatus.SUBMITTED, JobStatus.PENDING, JobStatus.RUNNABLE, JobStatus.STARTING})
PROGRESS_EVENTS = 100  # "Run Progress" about every 1% of a run's shards, not once a shard


def progress_step(total_shards: int) -> int:
    """Shards between two "Run Progress" events: the shards whose index is a multiple announce."""
    return max(1, total_shards // PROGRESS_EVENTS)


def _queue_name(arn_or_name: str) -> str:
    return arn_or_name.rsplit("/", 1)[-1]


def handle_job_event(
    detail: BatchJobStateChangeDetail, *, settings: Settings | None = None, clients: Clients | None = None
) -> JobEventOutcome:
    """Record one job state change and, when every job is terminal and every shard settled, conclude."""
    ctx = Context.build(settings, clients)
    run_id = detail.run_id
    ours = {
        _queue_name(q) for q in (ctx.settings.job_queue, ctx.settings.mnp_job_queue, ctx.settings.prepare_job_queue)
    }
    if run_id is None or _queue_name(detail.job_queue) not in ours:
        return JobEventOutcome("ignored", reason="not a Sluice job")
    if detail.child_index is not None and detail.status in WAITING_STATES:
        # A child still waiting tells neither the outcome nor `sluice status` anything (a shard
        # with no item has not started; a lost host shows in the terminal event's attempts),
        # and half of a run's events are these: they cost no AWS call.
        return JobEventOutcome("ignored", run_id, reason=f"{detail.status.value}: waiting states are not recorded")
    run = ctx.ledger.get(run_id)
    if run is not None and run.prepare is not None and detail.parent_id in run.prepare.job_ids:
        return _prepare_event(ctx, run, detail)
    if run is None or run.jobs is None:
        logger.warning("event for an unknown or unsubmitted run", extra={"run_id": run_id, "job_id": detail.job_id})
        return JobEventOutcome("ignored", run_id, reason="unknown run")
    job = next((j for j in run.jobs if j.id == detail.parent_id), None)
    if job is None:
        return JobEventOutcome("ignored", run_id, reason=f"job {detail.parent_id} is not one of the run's jobs")

    out = JobEventOutcome("recorded", run_id)
    counts: Counts | None = None
    is_shard_event = detail.child_index is not None or job.kind == "single"
    if is_shard_event:
        shard = job.shard_offset + (detail.child_index or 0)
        if not 0 <= shard < run.total_shards:
            return JobEventOutcome("ignored", run_id, reason=f"shard {shard} outside the run")
        counts = _record_shard(ctx, run, detail, shard, out)
    if detail.child_index is None and detail.status.terminal:
        first_time = ctx.records.record_job_terminal(run_id, detail.parent_id, detail.status, detail.reason)
        if not first_time and not is_shard_event:
            out.status = "stale"
    if not detail.status.terminal and run.outbox is None:
        return out  # only a terminal event (or its retry) can complete a run; 3 of 4 events stop here
    concluded = maybe_conclude(ctx, run_id, counts=counts if is_shard_event else None)
    if concluded:
        out.status = "retrying" if concluded == RETRY_PASS else "finalized"
        out.published.append(concluded)
    return out


def _prepare_event(ctx: Context, run: RunItem, detail: BatchJobStateChangeDetail) -> JobEventOutcome:
    """A prepare job's event: only the jobs' own terminal states decide (sluice.control.staging)."""
    if detail.child_index is not None or not detail.status.terminal:
        return JobEventOutcome("ignored", run.run_id, reason="prepare: only a prepare job's end decides")
    decided = staging.on_prepare_job(run, detail.parent_id, detail.status, detail.reason, ctx.settings, ctx.clients)
    out = JobEventOutcome("submitted" if decided else "stale", run.run_id)
    if decided:
        out.published.append(decided)
    return out


def _record_shard(
    ctx: Context, run: RunItem, detail: BatchJobStateChangeDetail, shard: int, out: JobEventOutcome
) -> Counts | None:
    """Apply the event to the shard's item; a terminal one is settled, counted and announced.

    Returns the run's counters when it read them (after its own write, so the invocation that
    settles the last shard sees them complete).
    """
    out.shard = shard
    settlement = None
    if detail.status.terminal:
        result = read_result(ctx.clients.s3, _paths(run), shard)
        settlement = settle_shard(detail.status, detail.exit_code, detail.reason, result)
    applied = ctx.records.record_shard(
        run.run_id,
        shard,
        {
            "status": detail.status,
            "attempt": detail.attempt,
            "exit_code": detail.exit_code,
            "reason": detail.reason,
            "job_id": detail.job_id,
            "spot_reclaimed": detail.spot_reclaimed or None,
        },
        seq=detail.seq,
        settlement=settlement,
    )
    if not applied:
        out.status = "stale"
        return None
    if detail.status == JobStatus.RUNNING and run.status == RunStatus.SUBMITTED:
        ctx.ledger.mark_running(run.run_id)
    if settlement is None or not run.status.active or shard % progress_step(run.total_shards):
        return None
    # Progress is informational: a lost one is superseded by the next (and the outcome).
    counts = ctx.records.counts(run.run_id)
    ctx.events.publish(
        RunProgress(
            run_id=run.run_id,
            shards_done=counts.shards_done,
            shards_failed=counts.shards_failed,
            shards_total=run.total_shards,
        )
    )
    out.published.append(RunProgress.detail_type)
    return counts


def maybe_conclude(ctx: Context, run_id: str, *, now: float | None = None, counts: Counts | None = None) -> str | None:
    """Publish a pending outcome; conclude the run once every job is terminal and every shard settled.

    A FINALIZING run whose finalizer died (lease expired) is concluded again.
    """
    run = ctx.ledger.get(run_id)
    if run is None:
        return None
    if run.outbox is not None:
        outbox.deliver(ctx.ledger, ctx.events, run)
    now = time.time() if now is None else now
    stalled = run.status == RunStatus.FINALIZING and (run.lease_until or 0) < now
    if not (run.status.active or stalled) or run.jobs_done < len(run.jobs or []):
        return None
    if (counts or ctx.records.counts(run_id)).shards_done < run.total_shards:
        return None  # a job is terminal but some of its shards' events are still on their way
    return conclude_run(run_id, ctx, now=now)


def _paths(run: RunItem) -> RunPaths:
    return RunPaths.in_bucket(parse_s3_uri(str(run.plan_uri))[0], run.run_id)


def read_result(s3: Any, paths: RunPaths, shard: int) -> ShardResult | None:
    """The worker's result.json for a shard; None if it is missing or unreadable (the shard then fails)."""
    raw = read_if_exists(s3, paths.result(shard))
    if raw is None:
        return None
    try:
        return ShardResult.model_validate_json(raw)
    except ValidationError as exc:
        logger.warning("unreadable result.json", extra={"uri": paths.result(shard), "error": str(exc)[:500]})
        return None


def read_failures(s3: Any, paths: RunPaths, shard: int) -> list[FailureLine]:
    """The lines of failures/<i>.jsonl (empty when the file is missing); unreadable lines are logged and skipped."""
    raw = read_if_exists(s3, paths.failures(shard))
    out = []
    for line in (raw or b"").splitlines():
        if line.strip():
            try:
                out.append(FailureLine.model_validate_json(line))
            except ValidationError:
                logger.warning("unreadable failures line", extra={"uri": paths.failures(shard)})
    return out


RETRY_PASS = "Retry Pass"  # noqa: S105 - a detail-type-like label, not a secret


def conclude_run(run_id: str, ctx: Context, *, now: float | None = None) -> str | None:
    """Decide the run: a retry pass, or exactly one outcome. None if another invocation has it."""
    run = ctx.ledger.begin_finalize(run_id, now=now)
    if run is None:
        return None
    previous = run.finalize_from if run.finalize_from and run.finalize_from.active else RunStatus.RUNNING
    try:
        decided = _conclude(run, ctx)
    except BaseException:
        logger.exception("finalizing failed; releasing for the retried event", extra={"run_id": run_id})
        ctx.ledger.release_finalize(run_id, previous)
        raise
    if decided is None:
        ctx.ledger.release_finalize(run_id, previous)
        return None
    outbox.deliver(ctx.ledger, ctx.events, ctx.ledger.get(run_id))
    return decided


def _conclude(run: RunItem, ctx: Context) -> str | None:
    s3 = ctx.clients.s3
    plan = load_plan(lambda uri: read_uri(s3, uri), str(run.plan_uri))
    passes = run.passes or [PassItem(first_shard=0, n_shards=plan.n_shards)]
    n_total = sum(p.n_shards for p in passes)
    retries_left = len(passes) - 1 < plan.retry_failed
    t = _run_figures(run, ctx, n_total, retries_left)
    if t is None or not t.complete:
        logger.info("not concluding: shards unsettled", extra={"run_id": run.run_id})
        return None
    t.failed -= run.retried_keys  # keys re-run by a retry pass are counted by that pass's shards
    reason = t.reason()
    last = passes[-1]
    if reason is None and retries_left:
        in_last = [i for i in t.transient_shards if last.first_shard <= i < last.first_shard + last.n_shards]
        keys = _transient_keys(s3, RunPaths.in_bucket(plan.control_bucket, run.run_id), in_last)
        if keys:
            _start_retry_pass(run, plan, keys, t.n_total, ctx)
            return RETRY_PASS
    if reason is not None:
        duration = round(time.time() - float(run.created_at), 1)
        return _record_failure(run, plan, t, reason, duration, ctx.ledger)
    return _record_success(run, plan, t.processed, t.failed, t.by_reason, t.gpu_seconds, ctx)


def _run_figures(run: RunItem, ctx: Context, n_total: int, retries_left: bool) -> RunFigures | None:
    """The run's tally from its counters and marks; None while a shard is unsettled.

    Shards are counted only inside the run and each terminal shard once, so shards_done ==
    n_total means every shard is settled. The counters give the figures and the FAIL# / RETRY#
    marks name the shards that matter: a succeeded run costs one BatchGetItem, a failed one a
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
        retry = ctx.records.marks(run.run_id, RETRY) if want_retry else []
        if len(fails) == counts.shards_failed and (retry or not want_retry):
            jobs = ctx.records.job_items(run.run_id) if run.jobs_failed and not fails else []
            failed = [(m.shard, m.why or "failed") for m in fails]
            return figures_from_counts(n_total, counts, failed, [m.shard for m in retry], jobs)
    return figures_from_items(n_total, ctx.records.shard_items(run.run_id), ctx.records.job_items(run.run_id))


def _record_success(
    run: RunItem,
    plan: RunPlan,
    processed: int,
    failed: int,
    by_reason: Mapping[FailureReason, int],
    gpu_seconds: int,
    ctx: Context,
) -> str:
    passes = run.passes or [PassItem(first_shard=0, n_shards=plan.n_shards)]
    used = spent(gpu_seconds)
    detail = RunSucceeded(
        run_id=run.run_id,
        processed=processed,
        failed=failed,
        output_prefix=plan.output_prefix,
        duration_s=round(time.time() - float(run.created_at), 1),
        failed_by_reason={r: n for r, n in sorted(by_reason.items()) if n},
        failed_keys_uri=plan.failures_prefix,
        retry_passes=len(passes) - 1,
        **used,
    )
    ctx.ledger.leave_finalizing(
        run.run_id,
        RunStatus.SUCCEEDED,
        {
            "processed": processed,
            "failed_keys": failed,
            "gpu_seconds": gpu_seconds,
            "finished_at": int(time.time()),
        },
        outbox=detail,
    )
    logger.info("run succeeded", extra={"run_id": run.run_id, "processed": processed, "failed": failed})
    return detail.detail_type


def _record_failure(run: RunItem, plan: RunPlan, t: RunFigures, reason: str, duration: float, ledger: Ledger) -> str:
    shards = [i for i, _ in t.failed_shards]
    used = spent(t.gpu_seconds)
    detail = RunFailed(
        run_id=run.run_id,
        reason=reason,
        shards_failed=shards,
        failed_keys_uri=plan.failures_prefix,
        processed=t.processed,
        failed=t.failed,
        duration_s=duration,
        **used,
    )
    ledger.leave_finalizing(
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


def _transient_keys(s3: Any, paths: RunPaths, shards: list[int]) -> dict[str, list[str]]:
    """bucket -> keys whose last recorded failure in these shards is transient."""
    last: dict[str, FailureReason] = {}
    for i in shards:
        for line in read_failures(s3, paths, i):
            last[line.key] = line.reason
    out: dict[str, list[str]] = {}
    for uri, reason in last.items():
        if reason in TRANSIENT_FAILURE_REASONS:
            b, k = parse_s3_uri(uri)
            out.setdefault(b, []).append(k)
    return out


def _write_retry_shards(s3: Any, plan: RunPlan, keys: dict[str, list[str]], first: int, n: int) -> None:
    """The transient failures, cut into n shards numbered from `first`."""
    flat = [(b, k) for b, ks in sorted(keys.items()) for k in ks]
    for j in range(n):
        groups: dict[str, list[str]] = {}
        for b, k in flat[j * len(flat) // n : (j + 1) * len(flat) // n]:
            groups.setdefault(b, []).append(k)
        put_object(s3, plan.shard_uri(first + j), encode_shard(sorted(groups.items())), tagging=SCRATCH_TAG)


def _start_retry_pass(run: RunItem, plan: RunPlan, keys: dict[str, list[str]], first: int, ctx: Context) -> None:
    """Write the transient failures as new shards after the existing ones and submit them (idempotent)."""
    n_keys = sum(len(v) for v in keys.values())
    n = max(1, min(math.ceil(n_keys / plan.keys_per_shard), ctx.settings.max_array_size))
    _write_retry_shards(ctx.clients.s3, plan, keys, first, n)
    pass_no = len(run.passes) if run.passes else 1
    layout = JobLayout(kind="array" if n >= 2 else "single", shard_offset=first, shard_count=n)
    retry_plan = plan.model_copy(
        update={"n_shards": first + n, "jobs": [layout], "mode": "array", "spot_allowed": True}
    )
    plan_uri = RunPaths.in_bucket(plan.control_bucket, run.run_id).retry_plan(pass_no)
    put_object(ctx.clients.s3, plan_uri, retry_plan.model_dump_json(indent=2).encode(), "application/json")
    # Job names continue the run's numbering (sluice-<run>-<n>) so events map back to the run,
    # and a resubmission after a crash finds the job it already submitted.
    jobs = run.jobs or []
    ids = BatchAdapter(ctx.clients.batch).submit(retry_plan, plan_uri, ctx.settings, start_index=len(jobs))
    progress = RunProgress(
        run_id=run.run_id,
        retry_pass=pass_no,
        retry_keys=n_keys,
        retry_shards=n,
        shards_done=first,
        shards_failed=0,
        shards_total=first + n,
    )
    ctx.ledger.leave_finalizing(
        run.run_id,
        RunStatus.RETRYING,
        {
            "jobs": [*jobs, JobLayoutItem(id=ids[0], **layout.model_dump())],
            "job_ids": [*run.job_ids, *ids],
            "passes": [
                *(run.passes or [PassItem(first_shard=0, n_shards=plan.n_shards)]),
                PassItem(first_shard=first, n_shards=n),
            ],
            "retried_keys": run.retried_keys + n_keys,
        },
        outbox=progress,
    )
    logger.info("retry pass submitted", extra={"run_id": run.run_id, "keys": n_keys, "shards": n, "jobs": ids})
