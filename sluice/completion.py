"""Batch job state changes -> run ledger -> "Run Progress" / "Run Succeeded" / "Run Failed".

Every update is idempotent and order-insensitive (sluice.ledger): a shard keeps the state
with the highest (attempt, state rank), a terminal state is final, and counters move in
the same DynamoDB transaction as the state they count. When every submitted job of the
run is terminal, one invocation wins a conditional claim (FINALIZING) and concludes the
run from what the workers wrote (shards/<i>.result.json and failures/<i>.jsonl): a final
retry pass for transient failures, or exactly one outcome event.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ValidationError

from sluice.aws import Clients
from sluice.batch import BatchAdapter
from sluice.batch_events import BatchJobStateChangeDetail
from sluice.contracts import (
    TRANSIENT_FAILURE_REASONS,
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
    ShardItem,
    ShardResult,
)
from sluice.ledger import Ledger
from sluice.log import logger
from sluice.models import JobLayout, RunPlan
from sluice.notify import EventPublisher
from sluice.paths import RunPaths
from sluice.plan import SCRATCH_TAG, load_plan
from sluice.s3io import put_object, read_if_exists, read_uri
from sluice.s3uri import parse_s3_uri
from sluice.settings import Settings
from sluice.shards import encode_shard

NO_RESULT = "no result.json: the worker did not finish"


@dataclass
class JobEventOutcome:
    """What handling one Batch event did."""

    status: str  # ignored | recorded | stale | finalized | retrying
    run_id: str | None = None
    reason: str | None = None
    shard: int | None = None
    published: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Context:
    """One event's view of its run: settings, clients and the adapters built from them."""

    settings: Settings
    clients: Clients
    ledger: Ledger
    events: EventPublisher

    @classmethod
    def build(cls, settings: Settings | None, clients: Clients | None) -> _Context:
        settings = settings or Settings.from_env()
        clients = clients or Clients()
        return cls(
            settings,
            clients,
            Ledger(clients.dynamodb, settings.runs_table),
            EventPublisher(clients.events, settings.event_bus),
        )


def _queue_name(arn_or_name: str) -> str:
    return arn_or_name.rsplit("/", 1)[-1]


def handle_job_event(
    detail: BatchJobStateChangeDetail, *, settings: Settings | None = None, clients: Clients | None = None
) -> JobEventOutcome:
    """Record one job state change and, when the run's jobs are all terminal, conclude the run."""
    ctx = _Context.build(settings, clients)
    run_id = detail.run_id
    ours = {_queue_name(ctx.settings.job_queue), _queue_name(ctx.settings.mnp_job_queue)}
    if run_id is None or _queue_name(detail.job_queue) not in ours:
        return JobEventOutcome("ignored", reason="not a Sluice job")
    run = ctx.ledger.get(run_id)
    if run is None or run.jobs is None:
        logger.warning("event for an unknown or unsubmitted run", extra={"run_id": run_id, "job_id": detail.job_id})
        return JobEventOutcome("ignored", run_id, reason="unknown run")
    job = next((j for j in run.jobs if j.id == detail.parent_id), None)
    if job is None:
        return JobEventOutcome("ignored", run_id, reason=f"job {detail.parent_id} is not one of the run's jobs")

    out = JobEventOutcome("recorded", run_id)
    is_shard_event = detail.child_index is not None or job.kind == "single"
    if is_shard_event:
        shard = job.shard_offset + (detail.child_index or 0)
        if not 0 <= shard < run.total_shards:
            return JobEventOutcome("ignored", run_id, reason=f"shard {shard} outside the run")
        _record_shard(ctx, run, detail, shard, out)
    if detail.child_index is None and detail.status.terminal:
        first_time = ctx.ledger.record_job_terminal(run_id, detail.parent_id, detail.status, detail.reason)
        if not first_time and not is_shard_event:
            out.status = "stale"
    fresh = ctx.ledger.get(run_id) or run
    if fresh.status.active and fresh.jobs_done >= len(fresh.jobs or []):
        concluded = conclude_run(run_id, settings=ctx.settings, clients=ctx.clients)
        if concluded:
            out.status = "retrying" if concluded == "Retry Pass" else "finalized"
            out.published.append(concluded)
    return out


def _record_shard(
    ctx: _Context, run: RunItem, detail: BatchJobStateChangeDetail, shard: int, out: JobEventOutcome
) -> None:
    """Apply the event to the shard's item (monotonic) and announce a shard that became terminal."""
    out.shard = shard
    terminal = detail.status.terminal
    res = read_result(ctx.clients.s3, _paths(run), shard) if terminal else None
    applied = ctx.ledger.record_shard(
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
        terminal=terminal,
        failed=detail.status == JobStatus.FAILED,
        keys_processed=res.processed if res else 0,
        keys_failed=res.failed if res else 0,
    )
    if not applied:
        out.status = "stale"
        return
    if detail.status == JobStatus.RUNNING and run.status == RunStatus.SUBMITTED:
        ctx.ledger.mark_running(run.run_id)
    if terminal and run.status.active:
        fresh = ctx.ledger.get(run.run_id) or run
        ctx.events.publish(
            RunProgress(
                run_id=run.run_id,
                shards_done=fresh.shards_done,
                shards_failed=fresh.shards_failed,
                shards_total=fresh.total_shards,
            )
        )
        out.published.append(RunProgress.detail_type)


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


def conclude_run(run_id: str, *, settings: Settings, clients: Clients) -> str | None:
    """Decide the run: a retry pass, or exactly one outcome event. None if another invocation has it."""
    ledger = Ledger(clients.dynamodb, settings.runs_table)
    run = ledger.begin_finalize(run_id)
    if run is None:
        return None
    try:
        return _conclude(run, ledger, settings, clients)
    except BaseException:
        logger.exception("finalizing failed; releasing for the retried event", extra={"run_id": run_id})
        ledger.release_finalize(run_id, run.finalize_from or RunStatus.RUNNING)
        raise


@dataclass
class _Tally:
    """What the workers' result.json files and the shard items say about every shard so far."""

    n_total: int
    processed: int = 0
    failed: int = 0
    by_reason: Counter[FailureReason] = field(default_factory=Counter)
    failed_shards: list[tuple[int, str]] = field(default_factory=list)


def _tally(s3: Any, paths: RunPaths, n_total: int, items: dict[int, ShardItem]) -> _Tally:
    t = _Tally(n_total)
    for i in range(n_total):
        res = read_result(s3, paths, i)
        item = items.get(i)
        if (item is not None and item.status == JobStatus.FAILED) or res is None:
            why = (item.reason if item else None) or NO_RESULT
            code = item.exit_code if item else None
            t.failed_shards.append((i, f"exit code {code}: {why}" if code is not None else why))
        if res is not None:
            t.processed += res.processed
            t.failed += res.failed
            t.by_reason.update(res.failed_by_reason)
    return t


def _conclude(run: RunItem, ledger: Ledger, settings: Settings, clients: Clients) -> str:
    s3 = clients.s3
    plan = load_plan(lambda uri: read_uri(s3, uri), str(run.plan_uri))
    paths = RunPaths.in_bucket(plan.control_bucket, run.run_id)
    passes = run.passes or [PassItem(first_shard=0, n_shards=plan.n_shards)]
    items = {i.shard: i for i in ledger.shard_items(run.run_id)}
    t = _tally(s3, paths, sum(p.n_shards for p in passes), items)
    t.failed -= run.retried_keys  # keys re-run by a retry pass are counted by that pass's shards
    last = passes[-1]
    if not t.failed_shards and len(passes) - 1 < plan.retry_failed:
        keys = _transient_keys(s3, paths, range(last.first_shard, last.first_shard + last.n_shards))
        if keys:
            _start_retry_pass(run, plan, keys, t.n_total, ledger, settings, clients)
            return "Retry Pass"
    events = EventPublisher(clients.events, settings.event_bus)
    duration = round(time.time() - float(run.created_at), 1)
    if t.failed_shards:
        return _announce_failure(run, plan, t, duration, ledger, events)
    detail = RunSucceeded(
        run_id=run.run_id,
        processed=t.processed,
        failed=t.failed,
        output_prefix=plan.output_prefix,
        duration_s=duration,
        failed_by_reason=dict(t.by_reason),
        failed_keys_uri=plan.failures_prefix,
        retry_passes=len(passes) - 1,
    )
    events.publish(detail)
    ledger.leave_finalizing(
        run.run_id,
        RunStatus.SUCCEEDED,
        {"processed": t.processed, "failed_keys": t.failed, "finished_at": int(time.time())},
    )
    logger.info("run succeeded", extra={"run_id": run.run_id, "processed": t.processed, "failed": t.failed})
    return detail.detail_type


def _announce_failure(
    run: RunItem, plan: RunPlan, t: _Tally, duration: float, ledger: Ledger, events: EventPublisher
) -> str:
    names = ", ".join(f"shard {i} ({why})" for i, why in t.failed_shards[:10])
    more = f" and {len(t.failed_shards) - 10} more" if len(t.failed_shards) > 10 else ""
    reason = f"{len(t.failed_shards)} of {t.n_total} shards failed: {names}{more}"
    shards = [i for i, _ in t.failed_shards]
    detail = RunFailed(
        run_id=run.run_id,
        reason=reason,
        shards_failed=shards,
        failed_keys_uri=plan.failures_prefix,
        processed=t.processed,
        failed=t.failed,
        duration_s=duration,
    )
    events.publish(detail)
    ledger.leave_finalizing(
        run.run_id,
        RunStatus.FAILED,
        {
            "reason": reason,
            "processed": t.processed,
            "failed_keys": t.failed,
            "shards_failed_list": shards,
            "finished_at": int(time.time()),
        },
    )
    logger.info("run failed", extra={"run_id": run.run_id, "reason": reason})
    return detail.detail_type


def _transient_keys(s3: Any, paths: RunPaths, shards: range) -> dict[str, list[str]]:
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


def _start_retry_pass(
    run: RunItem,
    plan: RunPlan,
    keys: dict[str, list[str]],
    first: int,
    ledger: Ledger,
    settings: Settings,
    clients: Clients,
) -> None:
    """Write the transient failures as new shards after the existing ones and submit them."""
    n_keys = sum(len(v) for v in keys.values())
    n = max(1, min(math.ceil(n_keys / plan.keys_per_shard), settings.max_array_size))
    _write_retry_shards(clients.s3, plan, keys, first, n)
    pass_no = len(run.passes) if run.passes else 1
    layout = JobLayout(kind="array" if n >= 2 else "single", shard_offset=first, shard_count=n)
    retry_plan = plan.model_copy(
        update={"n_shards": first + n, "jobs": [layout], "mode": "array", "spot_allowed": True}
    )
    plan_uri = RunPaths.in_bucket(plan.control_bucket, run.run_id).retry_plan(pass_no)
    put_object(clients.s3, plan_uri, retry_plan.model_dump_json(indent=2).encode(), "application/json")
    # Job names continue the run's numbering (sluice-<run>-<n>) so events map back to the run.
    jobs = run.jobs or []
    ids = BatchAdapter(clients.batch).submit(retry_plan, plan_uri, settings, start_index=len(jobs))
    ledger.leave_finalizing(
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
    )
    EventPublisher(clients.events, settings.event_bus).publish(
        RunProgress(
            run_id=run.run_id,
            retry_pass=pass_no,
            retry_keys=n_keys,
            retry_shards=n,
            shards_done=first,
            shards_failed=0,
            shards_total=first + n,
        )
    )
    logger.info("retry pass submitted", extra={"run_id": run.run_id, "keys": n_keys, "shards": n, "jobs": ids})
