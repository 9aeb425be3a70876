"""Reconciliation with AWS Batch: runs whose events stopped still reach their outcome.

An event lost to a rule's dead-letter queue or an outage would otherwise leave a run
RUNNING for ever. The sweep (a 5-minute schedule on the completion function, and
`sluice reconcile [RUN]`) asks Batch for the state of each active run's jobs: a terminal
job whose own event never came is counted; shards of a job that has been terminal for
`grace_s` and still have no terminal event are settled from Batch's child (or node) list
and their result.json, exactly as their events would have settled them; a pending
announcement is published; a run whose jobs are all terminal and shards all settled is
concluded. The grace keeps the sweep from racing events that are merely late, so event
order alone still decides every run whose events all arrive. A PREPARING run whose
prepare jobs ended is submitted, rejected or failed as their events would have done; an upload
stranded in PLANNING is handed to the manifest function again (sluice.control.sweep.redrive). The
sweep decides and publishes where the events do (sluice.control.completion.state_change.decide).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import translate
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control.completion.state_change import decide, read_result
from sluice.control.completion.verdict import settle_shard
from sluice.control.context import Context, run_paths
from sluice.control.indexing import stage as indexing
from sluice.control.intake import prepared
from sluice.control.sweep.redrive import redrive_planning
from sluice.control.sweep.stall import SWEPT, beat_items, sweep_stalls
from sluice.control.sweep.tail import sweep_tail
from sluice.control.sweep.waiting import sweep_waiting
from sluice.control.table.items import JobLayoutItem, RunItem

GRACE_S = 900  # a job terminal this long whose shards lack terminal events: settle them from Batch
LOOKBACK_S = 15 * 86400  # runs created this recently are swept (job timeouts are at most 14 days)
DESCRIBE_BATCH = 100  # DescribeJobs takes at most 100 job ids (AWS Batch API reference)


@dataclass
class Reconciled:
    """What reconciling one run did."""

    run_id: str
    status: str
    actions: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reconcile(
    ctx: Context | None = None, run_id: str | None = None, *, now: float | None = None, grace_s: float = GRACE_S
) -> list[Reconciled]:
    """Reconcile one run, or every run of the last LOOKBACK_S that is not final."""
    ctx = ctx or Context.build()
    now = time.time() if now is None else now
    if run_id is not None:
        runs = [r for r in [ctx.ledger.get(run_id)] if r is not None]
    else:
        runs = [
            r
            for r in ctx.ledger.recent_runs(10_000, since=int(now - LOOKBACK_S))
            if not r.status.final or r.outbox is not None or indexing.pending(r)
        ]
    return [reconcile_run(ctx, r, now=now, grace_s=grace_s) for r in runs]


def reconcile_run(ctx: Context, run: RunItem, *, now: float, grace_s: float) -> Reconciled:
    out = Reconciled(run.run_id, run.status.value)
    published = decide(ctx, run, ends=()).published  # no ends: only what was pending goes out, first
    if published:
        out.actions.append(f"published {published}")
    out.actions += indexing.sweep(ctx, ctx.ledger.get(run.run_id) or run, now=now) if indexing.pending(run) else []
    redriven = redrive_planning(ctx, run, now=now)  # an upload stranded in PLANNING: plan it again
    if redriven:
        out.actions.append(redriven)
    if run.status == RunStatus.PREPARING:
        # Safe without a grace: the submit step is leased and every transition conditional.
        decided = decide(ctx, run, prepared.ends(run, lambda ids: _describe(ctx, ids))).decided
        if decided:
            out.actions.append(f"prepare ended without its event: {decided}")
        return out
    expired = run.status == RunStatus.FINALIZING and (run.lease_until or 0) < now
    if not (run.status.active or expired) or not run.jobs:
        return out
    # One read of the run's beats and fences for both guards (none for a run they do not sweep).
    items = beat_items(ctx.clients.dynamodb, ctx.settings.beats_table, run.run_id) if run.status in SWEPT else []
    out.actions += sweep_stalls(ctx, run, now=now, items=items)  # sluice.control.sweep.stall: end stalled attempts
    out.actions += sweep_tail(ctx, run, now=now, items=items)  # sluice.control.sweep.tail: split slow ranks' keys off
    out.actions += sweep_waiting(ctx, run, now=now)  # waiting: why jobs stay RUNNABLE, once a cause
    out.actions += _settle_missing(ctx, run, now=now, grace_s=grace_s)
    fresh = ctx.ledger.get(run.run_id)  # read again: the sweep's own writes (jobs_done) changed it
    concluded = decide(ctx, fresh, now=now).decided if fresh is not None else None
    if concluded:
        out.actions.append(f"concluded: {concluded}")
    return out


def _settle_missing(ctx: Context, run: RunItem, *, now: float, grace_s: float) -> list[str]:
    """Count terminal jobs whose events never came; settle their shards still lacking one after the grace."""
    actions = []
    jobs = _describe(ctx, [j.id for j in run.jobs or []])
    settled = {s.shard for s in ctx.records.shard_items(run.run_id) if s.terminal}
    for job in run.jobs or []:
        desc = jobs.get(job.id)
        status = JobStatus(desc["status"]) if desc else None
        if desc is None or status is None or not status.terminal:
            continue
        if ctx.records.record_job_terminal(run.run_id, job.id, status, desc.get("statusReason")):
            actions.append(f"job {job.id} {status.value} (its event was missing)")
        stopped = int(desc.get("stoppedAt") or 0) / 1000
        missing = [i for i in range(job.shard_offset, job.shard_offset + job.shard_count) if i not in settled]
        if missing and now - stopped >= grace_s:
            n = _settle_from_batch(ctx, run, job, desc, missing)
            actions.append(f"settled {n} shard(s) of job {job.id} from Batch")
    return actions


def _describe(ctx: Context, ids: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i in range(0, len(ids), DESCRIBE_BATCH):
        resp = _batch(ctx, "describe_jobs", jobs=ids[i : i + DESCRIBE_BATCH])
        out.update({j["jobId"]: j for j in resp.get("jobs", [])})
    return out


def _batch(ctx: Context, op: str, **kwargs: Any) -> Any:
    try:
        return getattr(ctx.clients.batch, op)(**kwargs)
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, f"AWS Batch {op}") from exc


def _children(ctx: Context, job: JobLayoutItem) -> dict[int, dict[str, Any]]:
    """Index -> terminal summary of an array job's children or an MNP job's nodes (ListJobs)."""
    if job.kind == "single":
        return {}
    key = "arrayJobId" if job.kind == "array" else "multiNodeJobId"
    out: dict[int, dict[str, Any]] = {}
    for status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {key: job.id, "jobStatus": status.value}
            if token:
                kwargs["nextToken"] = token
            resp = _batch(ctx, "list_jobs", **kwargs)
            for j in resp.get("jobSummaryList", []):
                sep = ":" if job.kind == "array" else "#"
                if sep in j["jobId"]:
                    out[int(j["jobId"].rsplit(sep, 1)[1])] = j
            token = resp.get("nextToken")
            if not token:
                break
    return out


def _settle_from_batch(ctx: Context, run: RunItem, job: JobLayoutItem, desc: dict[str, Any], shards: list[int]) -> int:
    """Settle shards whose terminal events never came, from Batch's view of them and result.json."""
    children = _children(ctx, job)
    paths = run_paths(run)
    n = 0
    for shard in shards:
        # A child Batch does not list falls back to its job's own terminal state.
        src = children.get(shard - job.shard_offset, desc)
        status = JobStatus(src["status"])
        if not status.terminal:
            continue
        exit_code = (src.get("container") or {}).get("exitCode")
        reason = src.get("statusReason")
        attempt = (job.attempt_base or 0) + max(1, len(src.get("attempts") or []))
        settlement = settle_shard(status, exit_code, reason, read_result(ctx.clients.s3, paths, shard), "batch")
        state = {"status": status, "attempt": attempt, "exit_code": exit_code, "reason": reason}
        if ctx.records.record_shard(
            run.run_id, shard, {**state, "job_id": src["jobId"]}, seq=attempt * 10 + status.rank, settlement=settlement
        ):
            n += 1
    return n
