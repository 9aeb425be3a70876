"""The fleet index build from the control plane (moto): three stage jobs submitted once, their end published once.

A run's RUN item is recorded SUCCEEDED with a fleet claim (sluice.control.indexing.stage.claim at a
low SLUICE_INDEX_FLEET_ROWS), then `start` submits train, segments (an array job) and commit
with a fault AWS could give injected between the three SubmitJob calls or at their record; the
sweep completes what the fault left. Each example then delivers a complete, realistic set of
the stage jobs' "Batch Job State Change" events (sluice.local.emulator.events), in a random order with
duplicates, to the real completion handler: exactly one "Run Indexed" or "Index Failed" comes out.
"""

from __future__ import annotations

import io
import itertools
import time
import uuid
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.aws.clients import Clients
from sluice.contracts.events import IndexedTable, IndexFailed, RunIndexed
from sluice.contracts.sections import ModelSpec
from sluice.contracts.status import JobStatus
from sluice.control.context import Context
from sluice.control.indexing import stage as indexing
from sluice.control.policy import INDEX_STAGES
from sluice.control.table.ddb import item
from sluice.control.table.items import IndexItem
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.events import JobChange, attempt, batch_job_state_change
from sluice.ops.status import cmd_status
from sluice.paths import RunPaths, index_result
from sluice.settings import Settings
from tests import pace
from tests.integration.completion_support import deliver_job_event
from tests.integration.helpers import bus_events
from tests.integration.incremental_support import earlier_plan, record_run
from tests.properties import examples

EXITED = "Essential container in task exited"
DEPENDENT = "Dependent Job failed"
ROWS, PER_CHILD = 20, 7  # 20 keys x 1 model: ceil(20 / 7) = 3 children
FLEET_ENV = {"SLUICE_INDEX_FLEET_ROWS": "10", "SLUICE_INDEX_ROWS_PER_CHILD": str(PER_CHILD)}


def _settings(stack: Any, monkeypatch: Any) -> Settings:
    for k, v in {**stack.env_for("HandleJobStateChangeFunction"), **FLEET_ENV}.items():
        monkeypatch.setenv(k, v)
    return Settings.from_env()


def _claimed(aws: Any, stack: Any, settings: Settings, run_id: str) -> IndexItem:
    """A SUCCEEDED run whose index stage is claimed, as "Run Succeeded" leaves it (claim's own fields)."""
    ctl = stack.names["ControlBucket"]
    root = RunPaths.in_bucket(ctl, run_id).root
    index = {"uri": f"s3://{ctl}/indexes/{run_id}/", "name": run_id}
    plan = earlier_plan(run_id, root, [(ModelSpec(), "builtin:reference-cnn@1")], 1, ROWS, output={"index": index})
    record_run(aws, stack, plan)
    claim = indexing.claim(plan, ROWS, settings)["index"]
    aws.dynamodb.update_item(
        TableName=stack.names["RunsTable"],
        Key=item({"pk": run_id, "sk": "RUN"}),
        UpdateExpression="SET #ix = :ix, plan_uri = :plan",
        ExpressionAttributeNames={"#ix": "index"},
        ExpressionAttributeValues=item({":ix": claim, ":plan": RunPaths.in_bucket(ctl, run_id).plan}),
    )
    return claim


def _fail_nth(client: Any, op: str, n: int, when: Any = lambda p: True) -> dict[str, int]:
    """The client's n-th `op` call (1-based) that `when` accepts fails once, throttled, as AWS may."""
    seen = {"calls": 0, "failed": 0}

    def hook(params: dict[str, Any], **_: Any) -> None:
        if when(params):
            seen["calls"] += 1
            if seen["calls"] == n:
                seen["failed"] += 1
                raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "injected"}}, op)

    client.meta.events.register(f"before-parameter-build.{client.meta.service_model.endpoint_prefix}.{op}", hook)
    return seen


def _stage_jobs(aws: Any, stack: Any, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every job named as one of the run's stage jobs on the prepare queue, by stage (DescribeJobs' view)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for stage in INDEX_STAGES:
        resp = aws.batch.list_jobs(
            jobQueue=stack.names["PrepareJobQueue"],
            filters=[{"name": "JOB_NAME", "values": [indexing.job_name(run_id, 0, stage)]}],
        )
        ids = [j["jobId"] for j in resp["jobSummaryList"] if ":" not in j["jobId"]]  # not an array's children
        out[stage] = aws.batch.describe_jobs(jobs=ids)["jobs"] if ids else []
    return out


def _clients(aws: Any) -> Clients:
    region = "us-east-1"
    return Clients(
        s3=aws.s3,
        dynamodb=boto3.client("dynamodb", region_name=region),
        batch=boto3.client("batch", region_name=region),
        events=boto3.client("events", region_name=region),
    )


@dataclass(frozen=True)
class Fleet:
    """One example's truth: where the submission is faulted, which stage fails, the event order."""

    fault: int  # 0: none; 1-3: the n-th SubmitJob is throttled; 4: recording the submission is
    fails: str | None  # the stage whose job FAILED (the later ones fail as their dependency did)
    written: bool  # the failed stage wrote its cause beside the index (a lost host writes none)
    retried_child: int | None  # a child whose first attempt failed and whose retry succeeded


def _events(stack: Any, run_id: str, ids: dict[str, str], fl: Fleet, children: int) -> list[dict[str, Any]]:
    """Every event Batch sends for the three stage jobs and the children, for this example's truth."""
    queue = stack.names["PrepareJobQueue"]

    def ev(stage: str, status: JobStatus, **kw: Any) -> dict[str, Any]:
        child = kw.pop("child", None)
        job_id = ids[stage] if child is None else f"{ids[stage]}:{child}"
        size = {"array_size": children} if stage == "segments" and child is None else {}
        change = JobChange(
            job_id=job_id, job_name=indexing.job_name(run_id, 0, stage), job_queue=queue, status=status,
            run_id=run_id, array_index=child, **size, **kw,
        )  # fmt: skip
        return batch_job_state_change(change)

    order = list(INDEX_STAGES)
    failed_at = order.index(fl.fails) if fl.fails else len(order)
    out = [ev(s, status) for s in order for status in (JobStatus.SUBMITTED, JobStatus.PENDING)]
    for i, stage in enumerate(order):
        if i > failed_at:  # its dependency failed: Batch fails it from PENDING
            out.append(ev(stage, JobStatus.FAILED, status_reason=DEPENDENT))
            continue
        ends = JobStatus.FAILED if i == failed_at else JobStatus.SUCCEEDED
        if stage != "segments":
            out += [ev(stage, status) for status in (JobStatus.RUNNABLE, JobStatus.STARTING, JobStatus.RUNNING)]
            out.append(ev(stage, ends, exit_code=1 if ends == JobStatus.FAILED else 0, status_reason=EXITED))
            continue
        out.append(ev(stage, JobStatus.RUNNING))
        for c in range(children):
            waiting = (JobStatus.RUNNABLE, JobStatus.STARTING, JobStatus.RUNNING)
            out += [ev(stage, status, child=c) for status in waiting]
            if c == fl.retried_child:  # attempt 1 failed, back to RUNNABLE for attempt 2
                first = [attempt(1, 2, 1, EXITED)]
                out.append(ev(stage, JobStatus.RUNNABLE, child=c, attempts=first, status_reason=EXITED))
            bad = ends == JobStatus.FAILED and c == 0  # child 0 fails for good: the array fails
            out.append(ev(stage, JobStatus.FAILED if bad else JobStatus.SUCCEEDED, child=c, exit_code=int(bad)))
        reason = f"1 of {children} failed" if ends == JobStatus.FAILED else None
        out.append(ev(stage, ends, status_reason=reason))
    return out


def _outcome(run_id: str, uri: str, fl: Fleet) -> RunIndexed | IndexFailed | None:
    """What the stages wrote at index_result: commit's RunIndexed, or the failed stage's cause."""
    if fl.fails is None:
        table = IndexedTable(model="reference-cnn", model_id="builtin:reference-cnn@1", uri=uri + "reference-cnn.lance",
                             rows=ROWS, ann="IVF_PQ")  # fmt: skip
        return RunIndexed(run_id=run_id, index_uri=uri, rows=ROWS, seconds=9.0, ann="IVF_PQ", tables=[table])
    if not fl.written:
        return None
    cause = {"train": "train: no vectors", "segments": "segment child 0 of 3: out of disk", "commit": "commit: lost"}
    return IndexFailed(run_id=run_id, index_uri=uri, reason=cause[fl.fails])


FLEETS = st.builds(
    Fleet,
    fault=st.integers(0, 4),
    fails=st.sampled_from([None, "train", "segments", "commit"]),
    written=st.booleans(),
    retried_child=st.one_of(st.none(), st.integers(0, 2)),
)
EXAMPLES = examples(4)  # ~3 s each; SLUICE_PROPERTY_EXAMPLES=40 passed (168 s)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(FLEETS, st.permutations(range(48)), st.lists(st.integers(1, 3), min_size=1, max_size=48))
def test_stage_jobs_submit_once_and_end_once_in_any_order(aws, stack, monkeypatch, fl, perm, copies):
    settings = _settings(stack, monkeypatch)
    run_id = f"fl-{uuid.uuid4().hex[:12]}"
    claim = _claimed(aws, stack, settings, run_id)
    assert (claim.mode, claim.children, claim.planned_rows) == ("fleet", 3, ROWS)
    ctx = Context.build(settings, _clients(aws))  # clients of its own: the faults stay in this example
    if 1 <= fl.fault <= 3:  # the n-th SubmitJob throttled: the jobs before it exist, the lease is given back
        _fail_nth(
            ctx.clients.batch, "SubmitJob", fl.fault, lambda p: p.get("jobName", "").startswith(f"sluice-{run_id}")
        )
    elif fl.fault == 4:  # every SubmitJob went through; recording them is throttled
        _fail_nth(
            ctx.clients.dynamodb, "UpdateItem", 1, lambda p: ":submitted" in p.get("ExpressionAttributeValues", {})
        )
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    try:
        first = indexing.start(ctx, run_id)
    except Exception as exc:  # the record's throttle reaches the caller (the event is redelivered)
        assert fl.fault == 4 and "ThrottlingException" in str(exc)
        first = None
    assert (first is None) == (fl.fault != 0)
    events_first = fl.fault == 4 and fl.retried_child is not None  # events before the sweep records the ids
    if fl.fault and not events_first:  # the sweep submits what is missing, adopting the rest by name
        later = time.time() + indexing.LEASE_S + 1
        (swept,) = indexing.sweep(ctx, ledger.get(run_id), now=later)
        assert (
            swept
            == f"index job {_stage_jobs(aws, stack, run_id)['commit'][0]['jobId']} submitted (its submission was lost)"
        )

    # One job a stage, ordered by dependsOn; the segments an array of 3, every child retried.
    jobs = _stage_jobs(aws, stack, run_id)
    assert [len(jobs[s]) for s in INDEX_STAGES] == [1, 1, 1], {s: len(j) for s, j in jobs.items()}
    ids = {s: jobs[s][0]["jobId"] for s in INDEX_STAGES}
    assert jobs["segments"][0]["arrayProperties"]["size"] == 3
    assert jobs["segments"][0]["dependsOn"] == [{"jobId": ids["train"]}]
    assert jobs["commit"][0]["dependsOn"] == [{"jobId": ids["segments"]}] and not jobs["train"][0]["dependsOn"]
    assert jobs["train"][0]["container"]["command"][-2:] == ["--children", "3"]

    row = ledger.get(run_id)
    written = _outcome(run_id, row.index.uri, fl)
    if written is not None:
        bucket, _, key = index_result(row.index.uri, run_id)[5:].partition("/")
        aws.s3.put_object(Bucket=bucket, Key=key, Body=written.model_dump_json().encode())
    bus_events(aws, stack)
    evs = _events(stack, run_id, ids, fl, 3)
    order = [evs[i % len(evs)] for i in perm]  # 48 >= the event set's size: every event at least once
    for ev, n in zip(order, itertools.cycle(copies)):
        for _ in range(n):
            deliver_job_event(stack, ev, monkeypatch)
    if events_first:
        indexing.sweep(ctx, ledger.get(run_id), now=time.time() + indexing.LEASE_S + 1)
    _check(aws, stack, ledger, run_id, fl, ids)


def _check(aws: Any, stack: Any, ledger: Ledger, run_id: str, fl: Fleet, ids: dict[str, str]) -> None:
    published = [e for e in bus_events(aws, stack) if e["detail"].get("run_id") == run_id]
    kinds = [e["detail-type"] for e in published]
    done = ledger.get(run_id).index
    assert done is not None
    if fl.fails is None:
        assert kinds == ["Run Indexed"] and (done.state, done.rows) == ("indexed", ROWS)
        assert done.job_id == ids["commit"]
        return
    assert kinds == ["Index Failed"], kinds
    reason = published[0]["detail"]["reason"]
    assert done.state == "failed" and done.reason == reason
    # It names a stage that FAILED, and its job; the cause the stage wrote when it wrote one.
    named = [s for s in INDEX_STAGES if f"{s} stage (job {ids[s]})" in reason]
    assert len(named) == 1 and INDEX_STAGES.index(named[0]) >= INDEX_STAGES.index(fl.fails), reason
    if fl.written:
        assert str(_outcome(run_id, "", fl).reason) in reason  # type: ignore[union-attr]
    elif named[0] == fl.fails:
        assert EXITED in reason or "1 of 3 failed" in reason
    else:
        assert DEPENDENT in reason
    # Nothing more: the sweep finds the stage decided.
    assert indexing.sweep(Context.build(Settings.from_env()), ledger.get(run_id), now=time.time() + 3600) == []


@pytest.mark.parametrize("stage", INDEX_STAGES)
def test_a_failed_stage_ends_index_failed_naming_it_once_and_a_rerun_submits_all_three_anew(
    aws, stack, monkeypatch, stage
):
    settings = _settings(stack, monkeypatch)
    run_id = f"fl-{stage}"
    _claimed(aws, stack, settings, run_id)
    ctx = Context.build(settings)
    commit = indexing.start(ctx, run_id)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    assert row.index.state == "submitted" and row.index.job_id == commit and set(row.index.stages) == set(INDEX_STAGES)
    buf = io.StringIO()
    cmd_status(ledger, run_id, watch=False, as_json=False, out=buf)
    assert f"submitted on the fleet: train, 3 segment children, commit (job {commit})" in buf.getvalue()
    bus_events(aws, stack)
    fl = Fleet(fault=0, fails=stage, written=False, retried_child=None)
    for ev in _events(stack, run_id, dict(row.index.stages), fl, 3) * 2:
        deliver_job_event(stack, ev, monkeypatch)
    (failed,) = [e["detail"] for e in bus_events(aws, stack) if e["detail-type"] == "Index Failed"]
    assert f"the index build's {stage} stage (job {row.index.stages[stage]}) failed" in failed["reason"]

    # The rerun: three new jobs of the rerun's names; the first attempt's late events are stale.
    again = indexing.rerun(ctx, run_id)
    fresh = ledger.get(run_id).index
    assert again == fresh.stages["commit"] and fresh.reruns == 1 and fresh.state == "submitted"
    assert set(fresh.retired) == set(row.index.stages.values())
    for s, job_id in fresh.stages.items():
        (desc,) = aws.batch.describe_jobs(jobs=[job_id])["jobs"]
        assert desc["jobName"] == indexing.job_name(run_id, 1, s) and job_id not in row.index.stages.values()
    for ev in _events(stack, run_id, dict(row.index.stages), fl, 3):
        assert deliver_job_event(stack, ev, monkeypatch)["status"] in ("ignored", "stale")
    assert ledger.get(run_id).index.state == "submitted"


def test_the_sweep_ends_the_stage_from_describe_jobs_when_the_commit_event_is_lost(aws, stack, monkeypatch):
    settings = _settings(stack, monkeypatch)
    run_id = "fl-swept"
    _claimed(aws, stack, settings, run_id)
    ctx = Context.build(settings)
    commit = indexing.start(ctx, run_id)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    written = _outcome(run_id, row.index.uri, Fleet(0, None, True, None))
    assert written is not None
    bucket, _, key = index_result(row.index.uri, run_id)[5:].partition("/")
    aws.s3.put_object(Bucket=bucket, Key=key, Body=written.model_dump_json().encode())
    bus_events(aws, stack)
    # moto ends every job SUCCEEDED at once and sends no event: DescribeJobs of the three tells the end.
    assert indexing.sweep(ctx, row, now=time.time()) == ["index job SUCCEEDED without its event: Run Indexed"]
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Run Indexed"]
    assert ledger.get(run_id).index.job_id == commit
    assert indexing.sweep(ctx, ledger.get(run_id), now=time.time()) == []


def test_single_mode_below_the_threshold_and_old_items_read_as_single(aws, stack, monkeypatch):
    settings = _settings(stack, monkeypatch).model_copy(update={"index_fleet_rows": ROWS + 1})
    run_id = "fl-single"
    claim = _claimed(aws, stack, settings, run_id)
    assert (claim.mode, claim.children, claim.stages) == ("single", None, {})
    job_id = indexing.start(Context.build(settings), run_id)
    (desc,) = aws.batch.describe_jobs(jobs=[job_id])["jobs"]
    assert desc["jobName"] == indexing.job_name(run_id) and "arrayProperties" not in desc
    assert IndexItem.model_validate({"uri": "s3://b/i/", "state": "submitted", "job_id": "j"}).mode == "single"


def _batch_says_failed(job_id: str, reason: str) -> None:
    """moto's record of a job, as Batch would describe a failed one (moto runs nothing: it ends SUCCEEDED)."""
    from moto.batch.models import batch_backends
    from moto.batch.utils import JobStatus as MotoStatus
    from moto.core import DEFAULT_ACCOUNT_ID

    job = batch_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]._jobs[job_id]
    deadline = time.monotonic() + pace.scaled(10)  # a guard against a hang (tests/pace.py)
    while job.status != MotoStatus.SUCCEEDED and time.monotonic() < deadline:  # moto's own end first
        time.sleep(0.05)
    job.status, job.job_stopped_reason = MotoStatus.FAILED, reason


def test_a_dependent_stages_failure_arriving_first_is_told_as_the_stage_that_failed(aws, stack, monkeypatch):
    settings = _settings(stack, monkeypatch)
    run_id = "fl-first"
    _claimed(aws, stack, settings, run_id)
    indexing.start(Context.build(settings), run_id)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    stages = dict(ledger.get(run_id).index.stages)
    oom = "OutOfMemoryError: Container killed due to memory usage"
    _batch_says_failed(stages["train"], oom)  # train was killed, writing no cause
    bus_events(aws, stack)
    evs = _events(stack, run_id, stages, Fleet(0, "train", False, None), 3)
    commit_failed = next(
        e for e in evs if e["detail"]["jobId"] == stages["commit"] and e["detail"]["status"] == "FAILED"
    )
    for ev in [commit_failed, *evs]:  # Batch failed commit as well; its event comes first
        deliver_job_event(stack, ev, monkeypatch)
    (failed,) = [e["detail"] for e in bus_events(aws, stack) if e["detail-type"] == "Index Failed"]
    assert f"the index build's train stage (job {stages['train']}) failed ({oom})" in failed["reason"]
    assert DEPENDENT not in failed["reason"]
