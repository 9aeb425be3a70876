"""The sweep's stall guard on moto: a stalled attempt is ended once and its shard re-submitted; moving ones are not."""

from __future__ import annotations

import copy
import io
import time

from sluice.contracts.status import RunStatus
from sluice.control.context import Context
from sluice.control.policy import STALLED_REASON
from sluice.control.sweep.reconcile import reconcile
from sluice.control.sweep.stall import stalled_attempts, sweep_stalls
from sluice.control.table.ledger import Ledger
from sluice.ops.status import render, run_status
from sluice.settings import Settings
from tests.integration.completion_support import deliver_job_event, job_event, submit_run, write_result
from tests.integration.helpers import all_jobs, bus_events


def _ctx(stack, monkeypatch) -> Context:
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    return Context.build(Settings.from_env())


def _beat(
    aws, stack, run_id: str, job_id: str, shard: int, *, still_s: float, attempt: int = 1, now: float | None = None
) -> None:
    """A beat as gpu_worker.watchdog writes it: rank 0 of the attempt, last moved `still_s` before `now`.

    A test that sweeps at the same `now` sees exactly `still_s`, however long the calls between take.
    """
    now = time.time() if now is None else now
    aws.dynamodb.put_item(
        TableName=stack.names["BeatsTable"],
        Item={
            "pk": {"S": run_id},
            "sk": {"S": f"{shard:06d}#{attempt:03d}#000"},
            "job_id": {"S": job_id},
            "shard": {"N": str(shard)},
            "attempt": {"N": str(attempt)},
            "rank": {"N": "0"},
            "processed": {"N": "4"},
            "moved_at": {"N": str(now - still_s)},
            "stall_after_s": {"N": "60"},
            "expires_at": {"N": str(int(now) + 86400)},
        },
    )


def _event(sample: str, run_id: str, job_id: str, queue: str, child: int | None, **detail):
    ev = job_event(sample, run_id=run_id, job_id=job_id, queue=queue, child=child)
    ev["detail"].update(copy.deepcopy(detail))
    return ev


def test_a_stalled_child_is_ended_once_resubmitted_and_the_run_still_succeeds(aws, stack, monkeypatch):
    out = submit_run(aws, stack, monkeypatch, n_keys=30, keys_per_shard=10, name="stall")
    run_id, job_id = out["run_id"], out["job_ids"][0]
    queue = stack.names["GpuJobQueue"]
    for i in range(3):
        deliver_job_event(
            stack,
            job_event("batch-array-child-running", run_id=run_id, job_id=job_id, queue=queue, child=i),
            monkeypatch,
        )
    write_result(aws, stack, run_id, 2, processed=10)
    deliver_job_event(
        stack, job_event("batch-array-child-succeeded", run_id=run_id, job_id=job_id, queue=queue, child=2), monkeypatch
    )
    now = time.time()
    _beat(aws, stack, run_id, f"{job_id}:0", 0, still_s=100, now=now)  # stalled: still for longer than its 60 s
    _beat(aws, stack, run_id, f"{job_id}:1", 1, still_s=10, now=now)  # slow but moving: never ended
    _beat(aws, stack, run_id, f"{job_id}:2", 2, still_s=500, now=now)  # finished: its beat ages, the ledger says done
    bus_events(aws, stack)
    ctx = _ctx(stack, monkeypatch)

    (rec,) = reconcile(ctx, run_id, now=now)
    assert [a for a in rec.actions if a.startswith("stalled")] == ["stalled: shard 0 attempt 1 after 100 s, ended"]
    child = aws.batch.describe_jobs(jobs=[f"{job_id}:0"])["jobs"][0]
    assert child["statusReason"].startswith(STALLED_REASON)  # TerminateJob, with Sluice's reason
    (stalled,) = stalled_attempts(aws.dynamodb, stack.names["RunsTable"], run_id)
    assert (stalled.shard, stalled.attempt, stalled.job_id) == (0, 1, f"{job_id}:0") and stalled.after_s == 100
    # Re-submitted as a plain job for shard 0 whose attempts follow the terminated one.
    redo = next(j for j in all_jobs(aws) if j["jobId"] == stalled.redo_job_id)
    env = {e["name"]: e["value"] for e in redo["container"]["environment"]}
    assert env["SLUICE_SHARD_INDEX"] == "0" and env["SLUICE_ATTEMPT_BASE"] == "1"
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    entry = row.jobs[-1]
    assert (entry.id, entry.kind, entry.shard_offset, entry.attempt_base, entry.replaces) == (
        redo["jobId"],
        "single",
        0,
        1,
        job_id,
    )
    text = io.StringIO()
    render(run_status(ctx.ledger, run_id), text)  # sluice status
    assert f"stalled   shard 0 attempt 1: no progress for 100 s, resumed by job {redo['jobId']}" in text.getvalue()
    (progress,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Progress"]
    assert progress["detail"]["stalled"][0]["shard"] == 0 and progress["detail"]["shards_done"] == 1

    # Counted once: the next sweep (the beat is still old) ends nothing and submits nothing.
    n_jobs = len(all_jobs(aws))
    # (The stall step alone: moto marks every job SUCCEEDED at once, which the rest of the sweep would count.)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    assert sweep_stalls(ctx, row, now=time.time() + 30) == [] and len(all_jobs(aws)) == n_jobs

    # Batch's view: the terminated child FAILED (not retried), the array FAILED; the re-submitted job runs shard 0.
    reason = child["statusReason"]
    dead = {"statusReason": reason, "attempts": [{"startedAt": 1, "stoppedAt": 2, "statusReason": reason}]}
    deliver_job_event(stack, _event("batch-array-child-failed", run_id, job_id, queue, 0, **dead), monkeypatch)
    write_result(aws, stack, run_id, 1, processed=10)
    deliver_job_event(
        stack, job_event("batch-array-child-succeeded", run_id=run_id, job_id=job_id, queue=queue, child=1), monkeypatch
    )
    deliver_job_event(
        stack, job_event("batch-array-parent-failed", run_id=run_id, job_id=job_id, queue=queue), monkeypatch
    )
    assert Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id).status is RunStatus.RUNNING  # the redo runs
    write_result(aws, stack, run_id, 0, processed=10, attempt=2)
    one = [
        {
            "startedAt": 3,
            "stoppedAt": 4,
            "statusReason": "Essential container in task exited",
            "container": {"exitCode": 0},
        }
    ]
    redo_id = redo["jobId"]
    for sample, attempts in (("batch-array-child-running", []), ("batch-array-child-succeeded", one)):
        ev = _event(sample, run_id, redo_id, queue, None, attempts=attempts)
        ev["detail"].pop("arrayProperties", None)
        deliver_job_event(stack, ev, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    assert row.status is RunStatus.SUCCEEDED and row.processed == 30  # the stalled child's FAILED does not count
    shard0 = ctx.records.shard(run_id, 0)
    assert shard0.attempt == 2 and shard0.job_id == redo_id


def test_a_shard_stalled_on_its_last_attempt_is_ended_and_not_resubmitted(aws, stack, monkeypatch):
    out = submit_run(aws, stack, monkeypatch, n_keys=20, keys_per_shard=10, name="stall-last")
    run_id, job_id = out["run_id"], out["job_ids"][0]
    queue = stack.names["GpuJobQueue"]
    deliver_job_event(
        stack, job_event("batch-array-child-running", run_id=run_id, job_id=job_id, queue=queue, child=0), monkeypatch
    )
    now = time.time()
    _beat(aws, stack, run_id, f"{job_id}:0", 0, still_s=100, attempt=3, now=now)  # the plan's 3rd and last attempt
    n_jobs = len(all_jobs(aws))
    (rec,) = reconcile(_ctx(stack, monkeypatch), run_id, now=now)
    assert "stalled: shard 0 attempt 3 after 100 s, ended" in rec.actions
    assert len(all_jobs(aws)) == n_jobs  # bounded: no attempt left, nothing re-submitted
    (stalled,) = stalled_attempts(aws.dynamodb, stack.names["RunsTable"], run_id)
    assert stalled.redo_job_id is None


def test_a_stalled_mnp_node_ends_the_mnp_job_and_resubmits_it_whole(aws, stack, monkeypatch):
    out = submit_run(aws, stack, monkeypatch, n_keys=20, mode="multinode", nodes=2, name="stall-mnp")
    run_id, job_id = out["run_id"], out["job_ids"][0]
    queue = stack.names["MnpJobQueue"]
    for node in (0, 1):
        ev = job_event("batch-mnp-main-node-running", run_id=run_id, job_id=job_id, queue=queue, node=node)
        deliver_job_event(stack, ev, monkeypatch)
    now = time.time()
    _beat(aws, stack, run_id, f"{job_id}#1", 1, still_s=100, now=now)
    _beat(aws, stack, run_id, f"{job_id}#0", 0, still_s=5, now=now)
    (rec,) = reconcile(_ctx(stack, monkeypatch), run_id, now=now)
    assert "stalled: shard 1 attempt 1 after 100 s, ended" in rec.actions
    mnp = aws.batch.describe_jobs(jobs=[job_id])["jobs"][0]
    assert mnp["statusReason"].startswith(STALLED_REASON)  # the whole MNP job: its nodes cannot run alone
    entry = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id).jobs[-1]
    assert (entry.kind, entry.shard_offset, entry.shard_count, entry.attempt_base, entry.replaces) == (
        "multinode",
        0,
        2,
        1,
        job_id,
    )
    (stalled,) = stalled_attempts(aws.dynamodb, stack.names["RunsTable"], run_id)
    assert stalled.redo_job_id == entry.id


def test_an_attempt_that_never_beat_is_ended_after_the_plans_load_grace(aws, stack, monkeypatch):
    # Hung before its first beat (plan read, model download, a stuck GET): no beat to age, the ledger says RUNNING.
    import json

    out = submit_run(aws, stack, monkeypatch, n_keys=20, keys_per_shard=10, name="no-beat")
    run_id, job_id = out["run_id"], out["job_ids"][0]
    queue = stack.names["GpuJobQueue"]
    for i in range(2):
        deliver_job_event(
            stack,
            job_event("batch-array-child-running", run_id=run_id, job_id=job_id, queue=queue, child=i),
            monkeypatch,
        )
    ctx = _ctx(stack, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    bucket, key = str(row.plan_uri).removeprefix("s3://").split("/", 1)
    grace = json.loads(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())["load_grace_s"]
    assert 60 <= grace <= 30 + 300  # derived: 30 s + 300 s for its one model, at most a quarter of the timeout
    started = ctx.records.shard(run_id, 0).updated_at
    _beat(aws, stack, run_id, f"{job_id}:1", 1, still_s=-grace)  # child 1 beat (and keeps moving): never ended
    # Batch's view: moto ends jobs at once; on AWS child 0 is RUNNING (a SUCCEEDED one whose event was
    # lost is settled from Batch instead: tests/integration/test_reconcile.py).
    from moto.batch.models import batch_backends
    from moto.core import DEFAULT_ACCOUNT_ID

    batch_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_job_by_id(f"{job_id}:0").status = "RUNNING"

    assert sweep_stalls(ctx, row, now=started + grace - 5) == []  # within the grace: nothing
    n_jobs = len(all_jobs(aws))
    (rec,) = reconcile(ctx, run_id, now=started + grace + 10)
    assert [a for a in rec.actions if a.startswith("stalled")] == [
        f"stalled: shard 0 attempt 1 after {grace + 10} s, ended"
    ]
    (stalled,) = stalled_attempts(aws.dynamodb, stack.names["RunsTable"], run_id)
    assert (stalled.shard, stalled.attempt, stalled.cause) == (0, 1, "no_beat") and stalled.redo_job_id
    child = aws.batch.describe_jobs(jobs=[f"{job_id}:0"])["jobs"][0]
    assert "no progress beat since it started" in child["statusReason"]
    assert len(all_jobs(aws)) == n_jobs + 1  # shard 0 re-submitted, once
    text = io.StringIO()
    render(run_status(ctx.ledger, run_id), text)
    assert f"stalled   shard 0 attempt 1: no first progress beat for {grace + 10} s, resumed by job" in text.getvalue()
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    assert sweep_stalls(ctx, row, now=started + grace + 60) == [] and len(all_jobs(aws)) == n_jobs + 1
