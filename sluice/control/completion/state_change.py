"""Batch job state changes -> runs table -> "Run Progress" / "Run Succeeded" / "Run Failed".

One event: parse (functions/), one context, one read of the RUN item, record, maybe decide.
Every update is idempotent and order-insensitive (sluice.control.table.records): a shard keeps the
state of its newest event, and a terminal state is settled when it is recorded: its outcome
and the worker's counts (result.json) go into the shard's item, with the run's write-sharded
counters and the shard's FAIL# / RETRY# marks, in one transaction. A prepare job's end goes to
sluice.control.intake.prepared; otherwise the run is concluded (sluice.control.completion.conclude) only when
every submitted job is terminal AND every shard is settled. `decide` is where a Batch event,
or the reconciliation sweep (sluice.control.sweep.reconcile), decides: it publishes what the RUN item
had pending before a transition can replace it, decides, and publishes the decision's event in
the same invocation (sluice.control.outbox).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sluice.aws.clients import Clients
from sluice.aws.store import ObjectStore
from sluice.contracts.events import RunProgress, RunSucceeded
from sluice.contracts.results import ShardError, ShardResult
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control import outbox
from sluice.control.completion.batch_events import BatchJobStateChangeDetail
from sluice.control.completion.conclude import maybe_conclude
from sluice.control.completion.retry import RETRY_PASS
from sluice.control.completion.verdict import settle_shard
from sluice.control.context import Context, run_paths
from sluice.control.indexing import stage as indexing
from sluice.control.intake import prepared
from sluice.control.intake.prepared import JobEnd
from sluice.control.sweep.tail import slow_ranks
from sluice.control.table.items import Counts, RunItem
from sluice.log import logger
from sluice.paths import RunPaths
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


@dataclass
class JobEventOutcome:
    """What handling one Batch event did."""

    status: str  # ignored | recorded | stale | finalized | retrying | submitted (after prepare) | indexed
    run_id: str | None = None
    reason: str | None = None
    shard: int | None = None
    published: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Decided:
    """What `decide` published first (an event left pending) and what it decided (its event is out too)."""

    published: str | None
    decided: str | None


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
    run = ctx.ledger.get(run_id)  # the event's one read of the RUN item
    if run is not None and indexing.is_index_job(run_id, detail.job_name):
        return _index_event(ctx, run, detail)
    if run is not None and run.prepare is not None and detail.parent_id in run.prepare.job_ids:
        return _prepare_event(ctx, run, detail)
    if run is None or run.jobs is None:
        logger.warning("event for an unknown or unsubmitted run", extra={"run_id": run_id, "job_id": detail.job_id})
        return JobEventOutcome("ignored", run_id, reason="unknown run")
    return _record(ctx, run, detail)


def _prepare_event(ctx: Context, run: RunItem, detail: BatchJobStateChangeDetail) -> JobEventOutcome:
    """A prepare job's event: only the jobs' own terminal states decide (sluice.control.intake.prepared)."""
    if detail.child_index is not None or not detail.status.terminal:
        return JobEventOutcome("ignored", run.run_id, reason="prepare: only a prepare job's end decides")
    got = decide(ctx, run, [JobEnd(detail.parent_id, detail.status, detail.reason)])
    out = JobEventOutcome("submitted" if got.decided else "stale", run.run_id)
    if got.decided:
        out.published.append(got.decided)
    return out


def _index_event(ctx: Context, run: RunItem, detail: BatchJobStateChangeDetail) -> JobEventOutcome:
    """An index job: only a job's own end decides ("Run Indexed" / "Index Failed", sluice.control.indexing.stage).

    A segment child's events are not: Batch retries a child, and the array's own FAILED follows the last.
    """
    if not detail.status.terminal or detail.child_index is not None:
        return JobEventOutcome("ignored", run.run_id, reason="index job: only its end decides")
    got = indexing.on_end(ctx, run, detail.status, detail.reason, detail.parent_id, detail.job_name)
    return JobEventOutcome("indexed" if got else "stale", run.run_id, published=[got] if got else [])


def _record(ctx: Context, run: RunItem, detail: BatchJobStateChangeDetail) -> JobEventOutcome:
    """An inference job's event: its shard (a child, node or plain job) and its job's end, then maybe conclude."""
    job = next((j for j in run.jobs or [] if j.id == detail.parent_id), None)
    if job is None:
        return JobEventOutcome("ignored", run.run_id, reason=f"job {detail.parent_id} is not one of the run's jobs")
    if job.attempt_base:  # re-submitted for a stalled attempt (sluice.control.sweep.stall): after the earlier attempts
        detail = detail.model_copy(update={"attempt_base": job.attempt_base})
    out = JobEventOutcome("recorded", run.run_id)
    counts: Counts | None = None
    is_shard_event = detail.child_index is not None or job.kind == "single"
    if is_shard_event:
        shard = job.shard_offset + (detail.child_index or 0)
        if not 0 <= shard < run.total_shards:
            return JobEventOutcome("ignored", run.run_id, reason=f"shard {shard} outside the run")
        counts = _record_shard(ctx, run, detail, shard, out)
    if detail.child_index is None and detail.status.terminal:
        first_time = ctx.records.record_job_terminal(run.run_id, detail.parent_id, detail.status, detail.reason)
        if not first_time and not is_shard_event:
            out.status = "stale"
    if detail.status.terminal:
        # Read again after this event's own writes: of two events that finish a run at once (the
        # last shard's and its job's), the later one then sees both and concludes.
        fresh = ctx.ledger.get(run.run_id)
        if fresh is None:
            return out
        run = fresh
    elif run.outbox is None:
        return out  # only a terminal event (or its retry) can complete a run; 3 of 4 events stop here
    got = decide(ctx, run, counts=counts if is_shard_event else None)
    if got.decided:
        out.status = "retrying" if got.decided == RETRY_PASS else "finalized"
        out.published.append(got.decided)
    return out


def decide(
    ctx: Context,
    run: RunItem,
    ends: Sequence[JobEnd] | None = None,
    *,
    counts: Counts | None = None,
    now: float | None = None,
) -> Decided:
    """Publish what `run` had pending, decide, publish the decision's event: the one place a Batch event
    or the sweep decides.

    The outbox holds one event, so a pending one ("Run Preparing", or the "Run Submitted" of a
    delivery that died after deciding) goes out before a transition replaces it. `ends`: a
    prepare job's end (or the sweep's view of both, map first) for a PREPARING run
    (sluice.control.intake.prepared); else the run is concluded when it can be (sluice.control.completion.conclude).
    """
    published = outbox.deliver(ctx, run.run_id) if run.outbox is not None else None
    if ends is not None:
        decided = next((d for end in ends if (d := prepared.on_job_end(ctx, run, end))), None)
    else:
        decided = maybe_conclude(ctx, run, now=now, counts=counts)
    if decided:
        outbox.deliver(ctx, run.run_id)
    if RunSucceeded.detail_type in (published, decided):
        indexing.start(ctx, run.run_id)  # after "Run Succeeded" is out; the sweep submits it if this is lost
    return Decided(published, decided)


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
        result = read_result(ctx.clients.s3, run_paths(run), shard)
        reason = detail.reason if result is not None else last_words(ctx.clients.s3, run_paths(run), shard, detail)
        settlement = settle_shard(detail.status, detail.exit_code, reason, result)
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
            slowest=slow_ranks(ctx, run.run_id) or None,
        )
    )
    out.published.append(RunProgress.detail_type)
    return counts


def read_result(s3: S3Client, paths: RunPaths, shard: int) -> ShardResult | None:
    """The worker's result.json for a shard; None if it is missing or unreadable (the shard then fails)."""
    raw = ObjectStore(s3).get_if_exists(paths.result(shard))
    if raw is None:
        return None
    try:
        return ShardResult.model_validate_json(raw)
    except ValidationError as exc:
        logger.warning("unreadable result.json", extra={"uri": paths.result(shard), "error": str(exc)[:500]})
        return None


def last_words(s3: S3Client, paths: RunPaths, shard: int, detail: BatchJobStateChangeDetail) -> str | None:
    """The failed attempt's own reason (shards/<i>.error.json of that attempt), else Batch's."""
    raw = ObjectStore(s3).get_if_exists(paths.error(shard))
    if raw is None:
        return detail.reason
    try:
        err = ShardError.model_validate_json(raw)
    except ValidationError:
        return detail.reason
    return err.reason if err.attempt == detail.attempt and detail.status == JobStatus.FAILED else detail.reason


__all__ = ["Decided", "JobEventOutcome", "decide", "handle_job_event", "last_words", "progress_step", "read_result"]
