"""Jobs left RUNNABLE: the sweep tells why, once per cause (docs/architecture.md "Waiting").

When no capacity comes (no Spot, MaxVcpus reached, an instance type not offered in the
subnets' zones), Batch leaves jobs RUNNABLE with a statusReason and tells nobody. The sweep
lists the run's RUNNABLE jobs and children (ListJobs on each array job, DescribeJobs for plain
and MNP jobs), groups those waiting longer than SLUICE_RUNNABLE_AFTER_S by Batch's statusReason,
records each cause once per run (a WAIT# item, a conditional put) and publishes the new ones as
one "Run Waiting" event: a run of 10,000 children held back by one cause is one event, not
10,000. `sluice status` lists the recorded causes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.contracts.events import RunWaiting, WaitingCause
from sluice.contracts.status import RunStatus
from sluice.control.context import Context
from sluice.control.table.ddb import item, prefixed
from sluice.control.table.items import JobLayoutItem, RunItem

WAIT_PREFIX = "WAIT#"
SWEPT = (RunStatus.SUBMITTED, RunStatus.RUNNING, RunStatus.RETRYING)
MAX_PAGES = 10  # RUNNABLE children read per array job and sweep: enough to name the causes
NO_REASON = "no status reason from Batch (queued behind other jobs, or capacity still being requested)"
SHOWN_IDS = 10


def wait_sk(reason: str) -> str:
    return WAIT_PREFIX + hashlib.sha256(reason.encode()).hexdigest()[:16]


def _since_ms(job: Mapping[str, Any]) -> int:
    """When the job (or child) became RUNNABLE as far as Batch says: its last attempt's end, else its creation."""
    stops = [int(a.get("stoppedAt") or 0) for a in job.get("attempts") or []]
    return max([int(job.get("createdAt") or 0), *stops])


def causes(jobs: Iterable[Mapping[str, Any]], now: float, after_s: float) -> list[WaitingCause]:
    """RUNNABLE jobs waiting at least `after_s`, grouped by their statusReason (pure)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for j in jobs:
        waited = now - _since_ms(j) / 1000
        if j.get("status") == "RUNNABLE" and waited >= after_s:
            groups.setdefault(str(j.get("statusReason") or NO_REASON), []).append(j)
    return [
        WaitingCause(
            reason=reason,
            jobs=len(group),
            waiting_s=round(max(now - _since_ms(j) / 1000 for j in group), 1),
            job_ids=sorted(str(j["jobId"]) for j in group)[:SHOWN_IDS],
        )
        for reason, group in sorted(groups.items())
    ]


def runnable_jobs(ctx: Context, jobs: list[JobLayoutItem]) -> list[dict[str, Any]]:
    """The RUNNABLE children of the array jobs, and the plain or MNP jobs that are RUNNABLE."""
    out: list[dict[str, Any]] = []
    for job in jobs:
        if job.kind == "array":
            out += _runnable_children(ctx, job.id)
    whole = [j.id for j in jobs if j.kind != "array"]
    for i in range(0, len(whole), 100):  # DescribeJobs takes at most 100 ids
        described = ctx.clients.batch.describe_jobs(jobs=whole[i : i + 100])["jobs"]
        out += [dict(j) for j in described if j["status"] == "RUNNABLE"]
    return out


def _runnable_children(ctx: Context, job_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"arrayJobId": job_id, "jobStatus": "RUNNABLE"}
    for _ in range(MAX_PAGES):
        resp = ctx.clients.batch.list_jobs(**kwargs)
        out += [{**j, "status": j.get("status") or "RUNNABLE"} for j in resp.get("jobSummaryList", [])]
        if not resp.get("nextToken"):
            break
        kwargs["nextToken"] = resp["nextToken"]
    return out


def sweep_waiting(ctx: Context, run: RunItem, *, now: float) -> list[str]:
    """Announce the causes that keep the run's jobs RUNNABLE too long, each once; the sweep's actions."""
    if run.status not in SWEPT or not run.jobs:
        return []
    found = causes(runnable_jobs(ctx, run.jobs), now, ctx.settings.runnable_after_s)
    new = [c for c in found if _record(ctx, run.run_id, c, now)]
    if not new:
        return []
    ctx.events.publish(RunWaiting(run_id=run.run_id, causes=new))
    return [f"waiting: {c.jobs} job(s) RUNNABLE for {c.waiting_s:.0f} s: {c.reason}" for c in new]


def _record(ctx: Context, run_id: str, cause: WaitingCause, now: float) -> bool:
    """True the first time this cause is seen for the run."""
    fields = cause.model_dump(mode="json", exclude={"waiting_s"})
    try:
        ctx.clients.dynamodb.put_item(
            TableName=ctx.settings.runs_table,
            # DynamoDB's serializer takes no float: waiting_s goes as a number string.
            Item=item({"pk": run_id, "sk": wait_sk(cause.reason), **fields, "at": int(now)})
            | {"waiting_s": {"N": str(cause.waiting_s)}},
            ConditionExpression="attribute_not_exists(sk)",
        )
    except ctx.clients.dynamodb.exceptions.ConditionalCheckFailedException:
        return False
    return True


def waiting_causes(dynamodb: Any, table: str, run_id: str) -> list[WaitingCause]:
    """The causes recorded for the run (WAIT# items), as first seen."""
    fields = set(WaitingCause.model_fields)
    found = prefixed(dynamodb, table, run_id, WAIT_PREFIX)
    return [WaitingCause(**{k: v for k, v in i.items() if k in fields}) for i in found]


__all__ = ["causes", "sweep_waiting", "wait_sk", "waiting_causes"]
