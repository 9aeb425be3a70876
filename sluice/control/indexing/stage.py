"""The index stage from the control plane's side: submit it once after "Run Succeeded", publish its end.

A run whose plan names an index (output.index, RunPlan.index) is claimed for the index stage
in the write that decides "Run Succeeded" (sluice.control.completion.conclude: `claim`), so the claim is
never lost between the two. `start` then submits the stage, an AWS Batch CPU job on the
prepare queue (`python -m sluice.index build --bucket --run`, docs/index.md), under a lease on
the claim and adopted by name (sluice.control.batch), so a duplicated event, the sweep and a
delivery that died between SubmitJob and recording it submit one job between them. The job's
end (its "Batch Job State Change", or the sweep's DescribeJobs when that event is lost) reads
the outcome the stage wrote beside the index (sluice.paths.index_result) and moves the claim,
once, to "indexed" with "Run Indexed" or to "failed" with "Index Failed", through the RUN
item's outbox (sluice.control.outbox). The run's status and its output are never touched.

The claim also decides, once, how the index is built (IndexItem.mode): one job below
SLUICE_INDEX_FLEET_ROWS rows, else the fleet's three stages (train, an array of segment
children, commit: sluice.control.indexing.jobs) submitted together under the same lease, each
adopted by name. Then commit's SUCCEEDED, or ANY stage job's FAILED, ends the stage; the
other stages' SUCCEEDED events are ignored.
"""

from __future__ import annotations

import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from sluice.aws.errors import AwsFatalError, translate
from sluice.aws.store import ObjectStore
from sluice.contracts.events import IndexFailed, RunIndexed
from sluice.contracts.plan import RunPlan
from sluice.contracts.status import JobStatus
from sluice.control import outbox
from sluice.control.context import Context
from sluice.control.indexing.jobs import (
    ATTEMPTS,
    TIMEOUT_S,
    is_index_job,
    job_name,
    parse_name,
    request,
    stage_request,
    stage_timeout_s,
)
from sluice.control.policy import INDEX_STAGES, TIMEOUT_REASON, index_mode, index_rows, index_timeout_s
from sluice.control.table.ddb import item
from sluice.control.table.items import IndexItem, RunItem
from sluice.control.table.ledger import RUN_SK, staged
from sluice.errors import Rejection, RetriableError, SubmissionError
from sluice.log import logger
from sluice.paths import index_result
from sluice.settings import Settings

LEASE_S = 300  # a submitter holds the claim this long; the sweep takes over after it
PENDING = ("claimed", "submitted")
Outcome = RunIndexed | IndexFailed


def claim(plan: RunPlan, processed: int, settings: Settings) -> dict[str, Any]:
    """The RUN item's fields that claim the index stage, written with "Run Succeeded"; none when the index is off.

    The mode (one job, or the fleet's stages and their children) and the timeouts are decided
    here, once, from the rows it will index: `processed` keys, each a row a model (a text's
    chunks, a video's frames: sluice.control.policy's guess a key).
    """
    if plan.index is None:
        return {}
    c = plan.content
    rows = index_rows(c, len(plan.models), processed)
    mode, children = index_mode(rows, settings.index_fleet_rows, settings.index_rows_per_child)
    fixed = settings.index_timeout_s  # SLUICE_INDEX_TIMEOUT_S: every job's (each stage's), decided here once
    ix = IndexItem(uri=plan.index.uri, state="claimed", timeout_s=fixed, timeout_fixed=bool(fixed))
    if mode == "fleet":  # the stages' timeouts: from planned_rows (index_jobs.stage_timeout_s), unless fixed
        return {"index": ix.model_copy(update={"mode": "fleet", "children": children, "planned_rows": rows})}
    return {"index": ix if fixed else ix.model_copy(update={"timeout_s": index_timeout_s(rows)})}


def pending(run: RunItem) -> bool:
    """The run's index stage is claimed or running: the sweep looks at it."""
    return run.index is not None and run.index.state in PENDING


def start(ctx: Context, run_id: str, *, now: float | None = None) -> str | None:
    """Submit the claimed index stage once; its (commit's) job id, or None (nothing claimed, another holds it).

    A refusal that a retry cannot fix ends the stage with "Index Failed"; a transient one gives
    the lease back, so the sweep submits it (adopting, by name, every job SubmitJob took).
    """
    run = ctx.ledger.get(run_id)
    if run is None or run.index is None or run.index.state != "claimed" or not _lease(ctx, run_id, now):
        return None
    try:
        stages = _submit_stages(ctx, run) if run.index.mode == "fleet" else {}
        job_id = stages["commit"] if stages else ctx.batch.submit_named(request(run, ctx.settings))
    except RetriableError as exc:
        logger.warning("index job not submitted; the sweep retries", extra={"run_id": run_id, "error": str(exc)})
        _update(ctx, run_id, "REMOVE #ix.lease_until", {}, "#ix.#st = :claimed")
        return None
    except SubmissionError as exc:
        failed = IndexFailed(run_id=run_id, index_uri=run.index.uri, reason=f"the index job was not submitted: {exc}")
        _end(ctx, run, failed, None)
        return None
    expr, vals = "SET #ix.#st = :submitted, #ix.job_id = :job", dict[str, Any]({":job": job_id})
    if stages:
        expr, vals = expr + ", #ix.stages = :stages", {**vals, ":stages": stages}
    if _update(ctx, run_id, expr, vals, "#ix.#st = :claimed"):
        logger.info("index job submitted", extra={"run_id": run_id, "job_id": job_id, "stages": stages or None})
    return job_id


def _submit_stages(ctx: Context, run: RunItem) -> dict[str, str]:
    """Train, segments (dependsOn train) and commit (dependsOn segments), each submitted or adopted by name."""
    ids: dict[str, str] = {}
    for stage in INDEX_STAGES:
        before = ids[INDEX_STAGES[INDEX_STAGES.index(stage) - 1]] if ids else None
        ids[stage] = ctx.batch.submit_named(stage_request(run, ctx.settings, stage, before))
    return ids


def on_end(
    ctx: Context, run: RunItem, status: JobStatus, reason: str | None, job_id: str, name: str | None = None
) -> str | None:
    """An index job ended: "Run Indexed" or "Index Failed", once; the detail-type published, or None (stale).

    Fleet: commit's SUCCEEDED or any stage job's FAILED decides; `name` (the job's) tells the
    stage of an event that arrives before the stages' ids are recorded.
    """
    ix = run.index
    if ix is None or ix.state not in PENDING or not status.terminal or job_id in ix.retired:
        return None
    stage = _stage(run, job_id, name) if ix.mode == "fleet" else None
    if ix.mode == "fleet" and (stage is None or (status == JobStatus.SUCCEEDED and stage != "commit")):
        return None  # another attempt's job, or a stage whose success decides nothing
    if ix.mode != "fleet" and ix.job_id and job_id != ix.job_id:
        return None  # an earlier attempt's late event: a rerun's job decides now
    if run.outbox is not None:
        outbox.deliver(ctx, run.run_id)  # the outbox holds one event: what was pending goes out first
    end_id = job_id if stage in (None, "commit") else None
    if stage and status == JobStatus.FAILED:
        stage, job_id, reason = _first_failed(ctx, run, stage, (job_id, reason))
    return _end(ctx, run, outcome(ctx, run, status, reason, job_id, stage), end_id)


def _first_failed(ctx: Context, run: RunItem, stage: str, got: tuple[str, str | None]) -> tuple[str, str, str | None]:
    """The earliest stage that FAILED (stage, job id, reason): Batch fails the stages after it as well, and
    their events may come first; `got` (the event's job id and reason) when no earlier one did."""
    assert run.index is not None
    earlier = [s for s in INDEX_STAGES[: INDEX_STAGES.index(stage)] if s in run.index.stages]
    descs = _describe(ctx, [run.index.stages[s] for s in earlier]) if earlier else []
    first = next((d for d in descs if d.get("status") == JobStatus.FAILED.value), None)
    if first is None:
        return stage, got[0], got[1]
    name = next(s for s in earlier if run.index.stages[s] == first["jobId"])
    return name, str(first["jobId"]), first.get("statusReason")


def _stage(run: RunItem, job_id: str, name: str | None) -> str | None:
    """The fleet stage `job_id` is, by the recorded ids, else by its name (this attempt's jobs only)."""
    assert run.index is not None
    if run.index.stages:
        return next((s for s, j in run.index.stages.items() if j == job_id), None)
    parsed = parse_name(run.run_id, name or "")
    return parsed[1] if parsed is not None and parsed[0] == run.index.reruns else None


def outcome(
    ctx: Context, run: RunItem, status: JobStatus, reason: str | None, job_id: str, stage: str | None = None
) -> Outcome:
    """The stage's outcome: the result it wrote beside the index, or why there is none (naming a fleet stage)."""
    ix = run.index
    assert ix is not None
    uri = index_result(ix.uri, run.run_id)
    try:
        written = _read_outcome(ctx, uri)
    except AwsFatalError as exc:  # e.g. a manifest-named index the function may not read
        return IndexFailed(run_id=run.run_id, index_uri=ix.uri, reason=f"{exc}"[:1000])
    if status == JobStatus.SUCCEEDED and isinstance(written, RunIndexed):
        return written
    label = f"the index build's {stage} stage (job {job_id})" if stage else f"index job {job_id}"
    if isinstance(written, IndexFailed):
        return written.model_copy(update={"reason": f"{label} failed: {written.reason}"[:1000]}) if stage else written
    why = (
        f"{label} {status.value.lower()} ({reason or 'no reason given'})"
        if status == JobStatus.FAILED
        else f"{label} succeeded but wrote no readable outcome at {uri}"
    )
    if status == JobStatus.FAILED and TIMEOUT_REASON in (reason or ""):
        limit = stage_timeout_s(ix, stage) if stage else ix.timeout_s or TIMEOUT_S
        source = "SLUICE_INDEX_TIMEOUT_S" if ix.timeout_fixed else "derived from the rows it indexes"
        why = (
            f"{label} ran past its {limit} s timeout ({source}) and Batch ended it: it "
            "hung, or built slower than planned; the run's embeddings are intact: rerun it with "
            f"`sluice index rerun {run.run_id}` (--timeout-s N for a longer one)"
        )
    where = (
        "its log is the job's worker log on this machine (sluice local run: DIR/<run id>/logs/)"
        if ctx.settings.local_mode
        else "its log is in CloudWatch Logs, the worker log group, streams index/*"
    )
    return IndexFailed(run_id=run.run_id, index_uri=ix.uri, reason=f"{why}; {where}"[:1000])


def rerun(ctx: Context, run_id: str, timeout_s: int | None = None) -> str:
    """A failed index stage claimed again and submitted as jobs of their own names; its (commit's) job id.

    One conditional write (failed -> claimed, the failed jobs retired) decides, so two reruns at
    once submit one set of jobs; Rejection when the stage is not failed (nothing to rerun).
    """
    run = ctx.ledger.get(run_id)
    ix = run.index if run is not None else None
    if run is None or ix is None or ix.state != "failed":
        what = "no such run" if run is None else "no index stage" if ix is None else f"its index stage is {ix.state}"
        raise Rejection(f"sluice index rerun {run_id}: {what}: only a failed index stage is rerun")
    old = [*([ix.job_id] if ix.job_id else []), *ix.stages.values()]
    retired = [*ix.retired, *dict.fromkeys(j for j in old if j not in ix.retired)]
    vals: dict[str, Any] = {":n": ix.reruns + 1, ":old": retired, ":failed": "failed"}
    expr = "SET #ix.#st = :claimed, #ix.reruns = :n, #ix.retired = :old"
    t = timeout_s or (ix.timeout_s if ix.mode == "fleet" else ix.timeout_s or TIMEOUT_S)  # fleet: a floor, if any
    if t:
        expr, vals = expr + ", #ix.timeout_s = :t", {**vals, ":t": t}
    remove = " REMOVE #ix.job_id, #ix.reason, #ix.finished_at, #ix.stages"
    if timeout_s:  # replaces a SLUICE_INDEX_TIMEOUT_S fixed at the claim (in a fleet: a floor again)
        remove += ", #ix.timeout_fixed"
    if not _update(ctx, run_id, expr + remove, vals, "#ix.#st = :failed"):
        raise Rejection(f"sluice index rerun {run_id}: another rerun took it first")
    job_id = start(ctx, run_id)
    if job_id is None:
        raise Rejection(f"sluice index rerun {run_id}: claimed, not yet submitted: the sweep submits it")
    return job_id


def _read_outcome(ctx: Context, uri: str) -> Outcome | None:
    raw = ObjectStore(ctx.clients.s3).get_if_exists(uri)
    for model in (RunIndexed, IndexFailed):
        try:
            return model.model_validate_json(raw) if raw is not None else None
        except ValidationError:
            continue
    logger.warning("unreadable index outcome", extra={"uri": uri})
    return None


def sweep(ctx: Context, run: RunItem, *, now: float) -> list[str]:
    """The sweep's part: submit a claim whose submission was lost; end a job whose end event was lost."""
    ix = run.index
    if ix is None or ix.state not in PENDING:
        return []
    if ix.state == "claimed":
        if (ix.lease_until or 0) >= now:
            return []
        job_id = start(ctx, run.run_id, now=now)
        return [f"index job {job_id} submitted (its submission was lost)"] if job_id else []
    ids = [ix.stages[s] for s in INDEX_STAGES if s in ix.stages] if ix.stages else [str(ix.job_id)]
    descs = _describe(ctx, ids)
    # The first stage that FAILED says most (a later one failed because it did), else the last job's end.
    ended = next((d for d in descs if d.get("status") == JobStatus.FAILED.value), None)
    ended = ended or next((d for d in descs if d["jobId"] == ids[-1] and JobStatus(d["status"]).terminal), None)
    if ended is None:
        return []
    status = JobStatus(ended["status"])
    got = on_end(ctx, run, status, ended.get("statusReason"), ended["jobId"], ended.get("jobName"))
    return [f"index job {status.value} without its event: {got}"] if got else []


def _describe(ctx: Context, job_ids: list[str]) -> list[dict[str, Any]]:
    """DescribeJobs of the stage's jobs (at most 3; DescribeJobs takes up to 100), in their order."""
    try:
        jobs = ctx.clients.batch.describe_jobs(jobs=job_ids).get("jobs", [])
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, "AWS Batch describe_jobs") from exc
    by_id = {j["jobId"]: dict(j) for j in jobs}
    return [by_id[i] for i in job_ids if i in by_id]


def _end(ctx: Context, run: RunItem, detail: Outcome, job_id: str | None) -> str | None:
    """Claimed or submitted -> indexed | failed with its event in the outbox, then published; None if decided."""
    fields: dict[str, Any] = {
        ":state": "indexed" if isinstance(detail, RunIndexed) else "failed",
        ":out": staged(detail),
        ":now": int(time.time()),
    }
    sets = ["#ix.#st = :state", "outbox = :out", "#ix.finished_at = :now", "updated_at = :now"]
    if isinstance(detail, RunIndexed):
        fields.update({":rows": detail.rows, ":ann": detail.ann})
        sets += ["#ix.#rows = :rows", "#ix.ann = :ann"]
    else:
        fields[":reason"] = detail.reason
        sets.append("#ix.reason = :reason")
    if job_id:
        fields[":job"] = job_id
        sets.append("#ix.job_id = :job")
    done = _update(
        ctx,
        run.run_id,
        f"SET {', '.join(sets)} REMOVE #ix.lease_until",
        fields,
        "#ix.#st IN (:claimed, :submitted) AND attribute_not_exists(outbox)",
    )
    if not done:
        fresh = ctx.ledger.get(run.run_id)
        if fresh is not None and pending(fresh):  # another event's outbox is in the way: try again
            raise RetriableError(f"run {run.run_id}: its outbox is busy; the index stage's end will be retried")
        return None  # a duplicate or later delivery: the end is recorded already
    logger.info("index stage ended", extra={"run_id": run.run_id, "outcome": detail.detail_type})
    outbox.deliver(ctx, run.run_id)
    return detail.detail_type


def _lease(ctx: Context, run_id: str, now: float | None) -> bool:
    """Take the claim for LEASE_S: False when another submitter holds it or it is no longer claimed."""
    now = time.time() if now is None else now
    return _update(
        ctx,
        run_id,
        "SET #ix.lease_until = :until",
        {":until": int(now) + LEASE_S, ":t": int(now)},
        "#ix.#st = :claimed AND (attribute_not_exists(#ix.lease_until) OR #ix.lease_until < :t)",
    )


def _update(ctx: Context, run_id: str, expression: str, vals: dict[str, Any], condition: str) -> bool:
    """One conditional update of the RUN item's index record; False when the condition is lost."""
    names = {"#ix": "index", "#st": "state", "#rows": "rows"}
    states = {":claimed": "claimed", ":submitted": "submitted"}
    vals = {**vals, **{k: v for k, v in states.items() if k in condition or k in expression}}
    try:
        ctx.ledger.call(
            "update_item",
            Key=item({"pk": run_id, "sk": RUN_SK}),
            UpdateExpression=expression,
            ConditionExpression=condition,
            ExpressionAttributeNames={k: v for k, v in names.items() if k in expression or k in condition},
            ExpressionAttributeValues=item(vals),
        )
    except ClientError:  # only a lost condition stays a ClientError (Table.call)
        return False
    return True


__all__ = [
    "ATTEMPTS",
    "TIMEOUT_S",
    "claim",
    "is_index_job",
    "job_name",
    "on_end",
    "outcome",
    "pending",
    "request",
    "rerun",
    "stage_request",
    "start",
    "sweep",
]
