"""Stalled attempts: the sweep's guard (guard 2 of docs/architecture.md "Stalls").

Every worker rank writes a progress beat (gpu_worker.watchdog) when its processed count moves.
The sweep reads a run's beats; an attempt whose newest beat of some rank is older than its
stall_after_s, and that the ledger does not show finished or superseded, is stalled: the
container could not end itself (stopped, frozen host, a GIL-holding native call). The sweep
records it once (a STALL# item, a conditional put), ends it with TerminateJob (the array
child, the plain job, or the whole MNP job, reason "sluice: stalled ..."), and, since Batch
does not retry a job ended by TerminateJob (it moves to FAILED; "jobs that are cancelled or
terminated aren't retried", AWS Batch User Guide, "Automated job retries"), re-submits the shard itself
as a plain job (or the MNP job) whose attempts follow the terminated one's (SLUICE_ATTEMPT_BASE):
it resumes from the committed chunks, and its events outrank the terminated attempt's. The
attempts in all stay the plan's: a shard stalled on its last attempt is not re-submitted and
fails with the reason "sluice: stalled".

An attempt that never wrote a beat (hung before its first: container start, plan read, a
model download, a stuck GET) is found from the ledger instead: a shard RUNNING in its newest
attempt with no beat of that attempt for the plan's load_grace_s, which Batch too says is
RUNNING (a lost terminal event is settled, not re-run), is stalled (cause "no_beat"). That
reads the run's SHARD items (1 MB a page: about ten pages for 30,000 shards, some 2,500 read
units a sweep, once every 5 minutes), the plan and DescribeJobs only when such a shard exists.

A rank that is slow but moving writes beats, so it is never ended. A termination that
arrives after the attempt finished changes nothing: Batch ignores it, and the re-submission is
skipped when the ledger already shows a newer or terminal state of the shard.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.aws.store import ObjectStore
from sluice.contracts.events import RunProgress, StallCause, StalledAttempt
from sluice.contracts.plan import JobLayout, RunPlan, load_plan
from sluice.contracts.status import JobStatus, RunStatus
from sluice.contracts.tail import is_fence
from sluice.control.batch import RUN_TAG, job_request
from sluice.control.context import Context, run_paths
from sluice.control.policy import STALLED_REASON, retry_strategy
from sluice.control.table.ddb import item, prefixed, values
from sluice.control.table.items import JobItem, JobLayoutItem, RunItem, ShardItem, main_passes
from sluice.log import logger

STALL_PREFIX = "STALL#"
LEGACY_LOAD_GRACE_S = 900.0  # a plan written before plans carried load_grace_s
SWEPT = (RunStatus.SUBMITTED, RunStatus.RUNNING, RunStatus.RETRYING)


def stall_sk(shard: int, attempt: int) -> str:
    return f"{STALL_PREFIX}{shard:06d}#{attempt:03d}"


@dataclass(frozen=True)
class Beat:
    """One rank's newest beat (gpu_worker.watchdog writes them)."""

    shard: int
    attempt: int
    rank: int
    job_id: str
    processed: int
    moved_at: float
    stall_after_s: float
    cause: StallCause = "no_progress"

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> Beat:
        v = values(dict(raw))
        return cls(
            shard=int(v["shard"]),
            attempt=int(v["attempt"]),
            rank=int(v["rank"]),
            processed=int(v["processed"]),
            job_id=str(v["job_id"]),
            moved_at=float(v["moved_at"]),
            stall_after_s=float(v["stall_after_s"]),
        )


def beat_items(dynamodb: Any, table: str, run_id: str) -> list[dict[str, Any]]:
    """Every item of the run in the beats table, raw: its ranks' beats and their slices' fences (one Query, paged).

    The stall and tail sweeps share one read (sluice.control.sweep.reconcile passes it to both).
    """
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "pk = :pk",
        "ExpressionAttributeValues": {":pk": {"S": run_id}},
    }
    while True:
        try:
            resp = dynamodb.query(**kwargs)
        except dynamodb.exceptions.ResourceNotFoundException:
            # No beats table (SLUICE_BEATS_TABLE unset by hand, a stack from before beats): no stall to find.
            logger.warning("no beats table: stalls are not detected", extra={"table": table})
            return out
        out += resp.get("Items", [])
        if not resp.get("LastEvaluatedKey"):
            return out
        kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def beats_of(items: Iterable[Mapping[str, Any]]) -> list[Beat]:
    """The beats among the beats table's items (a slice's fence is not one)."""
    return [Beat.of(i) for i in items if not is_fence(i["sk"]["S"])]


def candidates(beats: Iterable[Beat], now: float) -> list[Beat]:
    """Per shard, the newest attempt's most stalled rank, when it has been still for its stall_after_s (pure)."""
    newest: dict[int, int] = {}
    for b in beats:
        newest[b.shard] = max(newest.get(b.shard, 0), b.attempt)
    worst: dict[int, Beat] = {}
    for b in beats:
        if b.attempt != newest[b.shard] or now - b.moved_at < b.stall_after_s:
            continue
        if b.shard not in worst or b.moved_at < worst[b.shard].moved_at:
            worst[b.shard] = b
    return [worst[s] for s in sorted(worst)]


def silent(shards: Iterable[ShardItem], beats: Iterable[Beat], grace_s: float, now: float) -> list[Beat]:
    """Attempts RUNNING in the ledger for grace_s without a single beat: hung before their first (pure)."""
    beating = {(b.shard, b.attempt) for b in beats}
    return [
        Beat(s.shard, s.attempt, 0, s.job_id, 0, float(s.updated_at), grace_s, "no_beat")
        for s in shards
        if s.status == JobStatus.RUNNING
        and not s.terminal
        and (s.shard, s.attempt) not in beating
        and now - s.updated_at >= grace_s
    ]


def _silent(ctx: Context, run: RunItem, beats: list[Beat], now: float) -> list[Beat]:
    """silent() over the run's SHARD items, with its plan's load grace (read only when a shard has no beat)."""
    beating = {(b.shard, b.attempt) for b in beats}
    quiet = [
        s
        for s in ctx.records.shard_items(run.run_id)
        if s.status == JobStatus.RUNNING and not s.terminal and (s.shard, s.attempt) not in beating
    ]
    if not quiet:
        return []
    plan = load_plan(ObjectStore(ctx.clients.s3).get, str(run.plan_uri))
    found = silent(quiet, beats, float(plan.load_grace_s or LEGACY_LOAD_GRACE_S), now)
    # Only what Batch says is RUNNING: a shard whose terminal event was lost is not hung (the
    # sweep settles it from Batch), and must not be ended and run again.
    running = _batch_running(ctx, [b.job_id for b in found])
    return [b for b in found if b.job_id in running]


def _batch_running(ctx: Context, job_ids: list[str]) -> set[str]:
    """The jobs Batch describes as RUNNING (DescribeJobs: at most 100 jobs a call)."""
    out: set[str] = set()
    for i in range(0, len(job_ids), 100):
        for job in ctx.clients.batch.describe_jobs(jobs=job_ids[i : i + 100]).get("jobs", []):
            if job.get("status") == "RUNNING":
                out.add(str(job["jobId"]))
    return out


def still_running(beat: Beat, shard: ShardItem | None) -> bool:
    """False when the ledger shows the attempt finished, or a later attempt (pure)."""
    if shard is None:
        return True
    if shard.attempt > beat.attempt:
        return False
    return not (shard.terminal and shard.attempt >= beat.attempt)


def sweep_stalls(ctx: Context, run: RunItem, *, now: float, items: list[dict[str, Any]] | None = None) -> list[str]:
    """End the run's stalled attempts and re-submit their shards; what it did (the sweep's actions).

    `items`: the run's beats table items when the caller read them (beat_items), else read here.
    """
    if run.status not in SWEPT or not run.jobs:
        return []
    if items is None:
        items = beat_items(ctx.clients.dynamodb, ctx.settings.beats_table, run.run_id)
    beats = beats_of(items)
    found = [
        b
        for b in candidates(beats, now) + _silent(ctx, run, beats, now)
        if still_running(b, ctx.records.shard(run.run_id, b.shard))
    ]
    ended = [s for b in found if (s := _end(ctx, run, b, now)) is not None]
    if not ended:
        return []
    counts = ctx.records.counts(run.run_id)
    ctx.events.publish(
        RunProgress(
            run_id=run.run_id,
            shards_done=min(counts.shards_done, run.total_shards),
            shards_failed=min(counts.shards_failed, run.total_shards),
            shards_total=run.total_shards,
            stalled=ended,
        )
    )
    _count_metric(len(ended))
    return [f"stalled: shard {s.shard} attempt {s.attempt} after {s.after_s:.0f} s, ended" for s in ended]


def _end(ctx: Context, run: RunItem, beat: Beat, now: float) -> StalledAttempt | None:
    """Record the stall once, terminate the attempt, re-submit the shard; None when another sweep has it."""
    stalled = StalledAttempt(
        shard=beat.shard,
        attempt=beat.attempt,
        after_s=round(now - beat.moved_at, 1),
        job_id=beat.job_id,
        cause=beat.cause,
    )
    key = {"pk": run.run_id, "sk": stall_sk(beat.shard, beat.attempt)}
    try:
        ctx.clients.dynamodb.put_item(
            TableName=ctx.settings.runs_table,
            # DynamoDB's serializer takes no float: after_s goes as a number string.
            Item=item(
                {**key, **stalled.model_dump(mode="json", exclude_none=True, exclude={"after_s"}), "at": int(now)}
            )
            | {"after_s": {"N": str(stalled.after_s)}},
            ConditionExpression="attribute_not_exists(sk)",
        )
    except ctx.clients.dynamodb.exceptions.ConditionalCheckFailedException:
        return None  # counted once: this attempt's stall is already handled
    try:
        job = _layout_of(run, beat.job_id)
        target = job.id if job is not None and job.kind == "multinode" else beat.job_id
        what = "no progress" if beat.cause == "no_progress" else "no progress beat since it started"
        reason = f"{STALLED_REASON}: {what} for {stalled.after_s:.0f} s (shard {beat.shard}, attempt {beat.attempt})"
        ctx.clients.batch.terminate_job(jobId=target, reason=reason)
        redo = _resubmit(ctx, run, job, beat) if job is not None else None
    except BaseException:
        ctx.clients.dynamodb.delete_item(TableName=ctx.settings.runs_table, Key=item(key))  # the next sweep retries
        raise
    logger.warning("stalled attempt ended", extra={"run_id": run.run_id, **stalled.model_dump(), "redo": redo})
    if redo:
        stalled = stalled.model_copy(update={"redo_job_id": redo})
        ctx.clients.dynamodb.update_item(
            TableName=ctx.settings.runs_table,
            Key=item(key),
            UpdateExpression="SET redo_job_id = :r",
            ExpressionAttributeValues={":r": {"S": redo}},
        )
    return stalled


def _layout_of(run: RunItem, job_id: str) -> JobLayoutItem | None:
    parent = job_id.split(":", 1)[0].split("#", 1)[0]
    return next((j for j in run.jobs or [] if j.id == parent), None)


def _resubmit(ctx: Context, run: RunItem, job: JobLayoutItem, beat: Beat) -> str | None:
    """The shard (or the MNP job's shards) again, after `beat.attempt` attempts; None when none are left."""
    plan_uri = plan_uri_of(run, beat.shard)
    plan = load_plan(ObjectStore(ctx.clients.s3).get, plan_uri)
    left = plan.attempts - beat.attempt
    if left <= 0:
        return None  # stalled on every attempt: the terminated attempt's FAILED fails the shard ("sluice: stalled")
    mnp = job.kind == "multinode"
    layout = JobLayout(
        kind="multinode" if mnp else "single",
        shard_offset=job.shard_offset if mnp else beat.shard,
        shard_count=job.shard_count if mnp else 1,
    )
    req = _redo_request(ctx, plan, plan_uri, layout, beat.attempt)
    queue = _queue_of(ctx, job.id) or req["jobQueue"]
    req["jobQueue"] = queue
    redo_id = ctx.batch.find(queue, req["jobName"]) or str(ctx.clients.batch.submit_job(**req)["jobId"])
    entry = JobLayoutItem(id=redo_id, **layout.model_dump(), attempt_base=beat.attempt, replaces=job.id)
    append_job(ctx, run.run_id, entry)
    return redo_id


def _redo_request(ctx: Context, plan: RunPlan, plan_uri: str, layout: JobLayout, base: int) -> dict[str, Any]:
    """A SubmitJob request for `layout` whose attempts continue after `base` (name: sluice-<run>-s<shard>a<base>)."""
    req = job_request(plan, plan_uri, layout, 0, ctx.settings)
    req["jobName"] = f"sluice-{plan.run_id}-s{layout.shard_offset}a{base}"[:128]
    req["retryStrategy"] = retry_strategy(plan.attempts - base)
    req["tags"] = {RUN_TAG: plan.run_id}
    extra = {"name": "SLUICE_ATTEMPT_BASE", "value": str(base)}
    if "nodeOverrides" in req:
        req["nodeOverrides"]["nodePropertyOverrides"][0]["containerOverrides"]["environment"].append(extra)
    else:
        req["containerOverrides"]["environment"].append(extra)
    return req


def plan_uri_of(run: RunItem, shard: int) -> str:
    """The plan of the pass the shard belongs to: plan.json, or a retry pass's plan-retry-<k>.json."""
    paths = run_paths(run)
    for p in run.passes or []:
        if p.split_of is not None and p.first_shard == shard:
            return paths.split_plan(shard)
    for k, p in enumerate(main_passes(run.passes or [])):
        if k and p.first_shard <= shard < p.first_shard + p.n_shards:
            return paths.retry_plan(k)
    return str(run.plan_uri)


def _queue_of(ctx: Context, job_id: str) -> str | None:
    jobs = ctx.clients.batch.describe_jobs(jobs=[job_id]).get("jobs", [])
    return str(jobs[0]["jobQueue"]) if jobs else None


def append_job(ctx: Context, run_id: str, entry: JobLayoutItem) -> None:
    """Add the re-submitted job to the RUN item's jobs (once: conditional on its id not being there)."""
    # Already there when a sweep died after appending: the condition fails and nothing changes.
    with contextlib.suppress(ctx.clients.dynamodb.exceptions.ConditionalCheckFailedException):
        ctx.clients.dynamodb.update_item(
            TableName=ctx.settings.runs_table,
            Key=item({"pk": run_id, "sk": "RUN"}),
            UpdateExpression="SET jobs = list_append(jobs, :j), job_ids = list_append(job_ids, :i)",
            ConditionExpression="attribute_exists(pk) AND NOT contains(job_ids, :id)",
            ExpressionAttributeValues=item({":j": [entry], ":i": [entry.id], ":id": entry.id}),
        )


def live_jobs(run: RunItem, jobs: list[JobItem]) -> list[JobItem]:
    """JOB items without those a re-submission replaced: Sluice's own TerminateJob failed them, not the work."""
    replaced = {j.replaces for j in run.jobs or [] if j.replaces}
    return [j for j in jobs if j.sk.removeprefix("JOB#") not in replaced]


def stalled_attempts(dynamodb: Any, table: str, run_id: str) -> list[StalledAttempt]:
    """The run's recorded stalls (STALL# items), in shard and attempt order."""
    fields = set(StalledAttempt.model_fields)
    found = prefixed(dynamodb, table, run_id, STALL_PREFIX)
    return [StalledAttempt(**{k: v for k, v in i.items() if k in fields}) for i in found]


METRIC = {"Namespace": "Sluice", "Dimensions": [[]], "Metrics": [{"Name": "StalledAttempts", "Unit": "Count"}]}


def _count_metric(n: int) -> None:
    """The StalledAttempts metric (namespace Sluice): an embedded-metric-format log line CloudWatch counts."""
    emf = {"Timestamp": int(time.time() * 1000), "CloudWatchMetrics": [METRIC]}
    logger.warning("stalled attempts ended", extra={"_aws": emf, "StalledAttempts": n})


__all__ = [
    "Beat",
    "beat_items",
    "beats_of",
    "candidates",
    "live_jobs",
    "silent",
    "stall_sk",
    "stalled_attempts",
    "still_running",
    "sweep_stalls",
]
