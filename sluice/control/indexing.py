"""The index stage from the control plane's side: submit it once after "Run Succeeded", publish its end.

A run whose plan names an index (output.index, RunPlan.index) is claimed for the index stage
in the write that decides "Run Succeeded" (sluice.control.conclude: `claim`), so the claim is
never lost between the two. `start` then submits the stage, an AWS Batch CPU job on the
prepare queue (`python -m sluice.index build --bucket --run`, docs/index.md), under a lease on
the claim and adopted by name (sluice.control.batch), so a duplicated event, the sweep and a
delivery that died between SubmitJob and recording it submit one job between them. The job's
end (its "Batch Job State Change", or the sweep's DescribeJobs when that event is lost) reads
the outcome the stage wrote beside the index (sluice.paths.index_result) and moves the claim,
once, to "indexed" with "Run Indexed" or to "failed" with "Index Failed", through the RUN
item's outbox (sluice.control.outbox). The run's status and its output are never touched.
"""

from __future__ import annotations

import re
import time
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from sluice.aws.errors import AwsFatalError, translate
from sluice.aws.s3io import read_if_exists
from sluice.contracts import IndexFailed, IndexItem, JobStatus, RunIndexed, RunItem
from sluice.control import outbox
from sluice.control.batch import RUN_TAG
from sluice.control.context import Context, control_bucket
from sluice.control.ddb import item
from sluice.control.ledger import RUN_SK, staged
from sluice.control.policy import INDEX_ROWS_PER_KEY, TIMEOUT_REASON, index_retry_strategy, index_timeout_s
from sluice.errors import Rejection, RetriableError, SubmissionError
from sluice.log import logger
from sluice.models import RunPlan
from sluice.paths import index_result

LEASE_S = 300  # a submitter holds the claim this long; the sweep takes over after it
ATTEMPTS = 2  # a lost host is retried; a failed build is not (its outcome is written, the index left as it was)
TIMEOUT_S = 4 * 3600  # a claim written before timeouts were derived from the rows
PENDING = ("claimed", "submitted")
Outcome = RunIndexed | IndexFailed


def claim(plan: RunPlan, processed: int) -> dict[str, Any]:
    """The RUN item's fields that claim the index stage, written with "Run Succeeded"; none when the index is off.

    The job's timeout is decided here, once, from the rows it will index: `processed` keys, each
    a row a model (a text's chunks, a video's frames: sluice.control.policy's guess a key).
    """
    if plan.index is None:
        return {}
    c = plan.content
    per_key = c.frames_per_video if c.kind == "video" and c.frames_per_video else INDEX_ROWS_PER_KEY[c.kind]
    rows = processed * len(plan.models) * per_key
    return {"index": IndexItem(uri=plan.index.uri, state="claimed", timeout_s=index_timeout_s(rows))}


def job_name(run_id: str, rerun: int = 0) -> str:
    """The index job's name: deterministic, so a second submission adopts the first; a rerun's is its own."""
    suffix = f"-index-r{rerun}" if rerun else "-index"
    return f"sluice-{run_id}"[: 128 - len(suffix)] + suffix


def is_index_job(run_id: str, name: str) -> bool:
    """True when a Batch job named `name` is one of the run's index jobs (the first, or a rerun's)."""
    return name == job_name(run_id) or re.fullmatch(re.escape(job_name(run_id)) + r"-r[1-9][0-9]*", name) is not None


def pending(run: RunItem) -> bool:
    """The run's index stage is claimed or running: the sweep looks at it."""
    return run.index is not None and run.index.state in PENDING


def request(run: RunItem, settings: Any) -> dict[str, Any]:
    """The SubmitJob request of the run's index stage: one CPU job on the prepare queue."""
    bucket = control_bucket(run)
    ix = run.index
    return {
        "jobName": job_name(run.run_id, ix.reruns if ix else 0),
        "jobQueue": settings.prepare_job_queue,
        "jobDefinition": settings.index_job_definition,
        "retryStrategy": index_retry_strategy(ATTEMPTS),
        "timeout": {"attemptDurationSeconds": (ix.timeout_s if ix else None) or TIMEOUT_S},
        "tags": {RUN_TAG: run.run_id},
        "propagateTags": True,
        "containerOverrides": {
            "command": ["python", "-m", "sluice.index", "build", "--bucket", bucket, "--run", run.run_id],
            "environment": [{"name": "SLUICE_RUN_ID", "value": run.run_id}],
        },
    }


def start(ctx: Context, run_id: str, *, now: float | None = None) -> str | None:
    """Submit the claimed index stage once; its job id, or None (nothing claimed, or another holds the claim).

    A refusal that a retry cannot fix ends the stage with "Index Failed"; a transient one gives
    the lease back, so the sweep submits it (adopting the job if SubmitJob went through).
    """
    run = ctx.ledger.get(run_id)
    if run is None or run.index is None or run.index.state != "claimed" or not _lease(ctx, run_id, now):
        return None
    try:
        job_id = ctx.batch.submit_named(request(run, ctx.settings))
    except RetriableError as exc:
        logger.warning("index job not submitted; the sweep retries", extra={"run_id": run_id, "error": str(exc)})
        _update(ctx, run_id, "REMOVE #ix.lease_until", {}, "#ix.#st = :claimed")
        return None
    except SubmissionError as exc:
        failed = IndexFailed(run_id=run_id, index_uri=run.index.uri, reason=f"the index job was not submitted: {exc}")
        _end(ctx, run, failed, None)
        return None
    if _update(ctx, run_id, "SET #ix.#st = :submitted, #ix.job_id = :job", {":job": job_id}, "#ix.#st = :claimed"):
        logger.info("index job submitted", extra={"run_id": run_id, "job_id": job_id, "index": run.index.uri})
    return job_id


def on_end(ctx: Context, run: RunItem, status: JobStatus, reason: str | None, job_id: str) -> str | None:
    """The index job ended: "Run Indexed" or "Index Failed", once; the detail-type published, or None (stale)."""
    if run.index is None or run.index.state not in PENDING or not status.terminal:
        return None
    if job_id in run.index.retired or (run.index.job_id and job_id != run.index.job_id):
        return None  # an earlier attempt's late event: a rerun's job decides now
    if run.outbox is not None:
        outbox.deliver(ctx, run.run_id)  # the outbox holds one event: what was pending goes out first
    return _end(ctx, run, outcome(ctx, run, status, reason, job_id), job_id)


def outcome(ctx: Context, run: RunItem, status: JobStatus, reason: str | None, job_id: str) -> Outcome:
    """The stage's outcome: the result it wrote beside the index, or why there is none."""
    assert run.index is not None
    uri = index_result(run.index.uri, run.run_id)
    try:
        written = _read_outcome(ctx, uri)
    except AwsFatalError as exc:  # e.g. a manifest-named index the function may not read
        return IndexFailed(run_id=run.run_id, index_uri=run.index.uri, reason=f"{exc}"[:1000])
    if status == JobStatus.SUCCEEDED and isinstance(written, RunIndexed):
        return written
    if isinstance(written, IndexFailed):
        return written
    why = (
        f"index job {job_id} {status.value.lower()} ({reason or 'no reason given'})"
        if status == JobStatus.FAILED
        else f"index job {job_id} succeeded but wrote no readable outcome at {uri}"
    )
    if status == JobStatus.FAILED and TIMEOUT_REASON in (reason or ""):
        why = (
            f"index job {job_id} ran past its {run.index.timeout_s or TIMEOUT_S} s timeout (derived from the rows "
            "it indexes) and Batch ended it: it hung, or built slower than planned; the run's embeddings are "
            f"intact: rerun it with `sluice index rerun {run.run_id}` (--timeout-s N for a longer one)"
        )
    where = "its log is in CloudWatch Logs, the worker log group, streams index/*"
    return IndexFailed(run_id=run.run_id, index_uri=run.index.uri, reason=f"{why}; {where}"[:1000])


def rerun(ctx: Context, run_id: str, timeout_s: int | None = None) -> str:
    """A failed index stage claimed again and submitted as a job of its own name; its job id.

    One conditional write (failed -> claimed, the failed job retired) decides, so two reruns at
    once submit one job; Rejection when the stage is not failed (nothing to rerun).
    """
    run = ctx.ledger.get(run_id)
    ix = run.index if run is not None else None
    if run is None or ix is None or ix.state != "failed":
        what = "no such run" if run is None else "no index stage" if ix is None else f"its index stage is {ix.state}"
        raise Rejection(f"sluice index rerun {run_id}: {what}: only a failed index stage is rerun")
    retired = [*ix.retired, *([ix.job_id] if ix.job_id else [])]
    vals = {":n": ix.reruns + 1, ":old": retired, ":failed": "failed", ":t": timeout_s or ix.timeout_s or TIMEOUT_S}
    expr = "SET #ix.#st = :claimed, #ix.reruns = :n, #ix.retired = :old, #ix.timeout_s = :t"
    if not _update(ctx, run_id, expr + " REMOVE #ix.job_id, #ix.reason, #ix.finished_at", vals, "#ix.#st = :failed"):
        raise Rejection(f"sluice index rerun {run_id}: another rerun took it first")
    job_id = start(ctx, run_id)
    if job_id is None:
        raise Rejection(f"sluice index rerun {run_id}: claimed, not yet submitted: the sweep submits it")
    return job_id


def _read_outcome(ctx: Context, uri: str) -> Outcome | None:
    raw = read_if_exists(ctx.clients.s3, uri)
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
    desc = _describe(ctx, str(ix.job_id))
    status = JobStatus(desc["status"]) if desc else None
    if desc is None or status is None or not status.terminal:
        return []
    got = on_end(ctx, run, status, desc.get("statusReason"), str(ix.job_id))
    return [f"index job {status.value} without its event: {got}"] if got else []


def _describe(ctx: Context, job_id: str) -> dict[str, Any] | None:
    try:
        jobs = ctx.clients.batch.describe_jobs(jobs=[job_id]).get("jobs", [])
    except (ClientError, BotoCoreError) as exc:
        raise translate(exc, "AWS Batch describe_jobs") from exc
    return dict(jobs[0]) if jobs else None


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
    names = {"#ix": "index", "#st": "state"}
    if "#rows" in expression:
        names["#rows"] = "rows"
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


__all__ = ["claim", "is_index_job", "job_name", "on_end", "outcome", "pending", "request", "rerun", "start", "sweep"]
