"""Jobs left RUNNABLE too long are reported once per cause ("Run Waiting", `sluice status`).

moto (use_docker false) runs every job to SUCCEEDED at once and never leaves one RUNNABLE, so
the test puts moto's own job records into the state Batch leaves them in when no capacity
comes (status RUNNABLE, a statusReason, created an hour ago), and the sweep reads them through
the Batch API (ListJobs, DescribeJobs) as it would on AWS.
"""

from __future__ import annotations

import io
import time
from datetime import datetime, timedelta

from moto.batch.models import batch_backends
from moto.core import DEFAULT_ACCOUNT_ID

from sluice.control.context import Context
from sluice.control.sweep.reconcile import reconcile
from sluice.ops.status import render, run_status
from sluice.settings import Settings
from tests import pace
from tests.integration.completion_support import submit_run
from tests.integration.helpers import bus_events

CAPACITY = "CAPACITY:INSUFFICIENT_INSTANCE_CAPACITY - Not enough g6e.xlarge capacity in us-east-1a"


def _hold_runnable(job_id: str, reason: str | None, waited_s: float) -> None:
    """Leave moto's record of a job or child as Batch does without capacity."""
    backend = batch_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
    job = backend.get_job_by_id(job_id)
    assert job is not None, job_id
    deadline = time.monotonic() + pace.scaled(10)  # a guard against a hang (tests/pace.py)
    while job.status not in ("SUCCEEDED", "FAILED") and time.monotonic() < deadline:
        time.sleep(0.05)  # moto's job thread finishes first, so it does not write over what is set here
    job.status = "RUNNABLE"
    job.job_stopped_reason = reason
    job.job_created_at = datetime.now() - timedelta(seconds=waited_s)


def test_runnable_children_are_reported_once_per_cause(aws, stack, monkeypatch):
    out = submit_run(aws, stack, monkeypatch, n_keys=40, keys_per_shard=10, name="waiting")
    run_id, job_id = out["run_id"], out["job_ids"][0]
    _hold_runnable(f"{job_id}:0", CAPACITY, 3600)
    _hold_runnable(f"{job_id}:1", CAPACITY, 3000)
    _hold_runnable(f"{job_id}:2", CAPACITY, 60)  # not long enough yet
    _hold_runnable(f"{job_id}:3", None, 3600)  # no reason given: a cause of its own
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLUICE_RUNNABLE_AFTER_S", "1800")
    ctx = Context.build(Settings.from_env())
    bus_events(aws, stack)

    (rec,) = reconcile(ctx, run_id, now=time.time())
    waiting = [a for a in rec.actions if a.startswith("waiting")]
    assert len(waiting) == 2 and any(a.startswith("waiting: 2 job(s) RUNNABLE for 3600 s: CAPACITY:") for a in waiting)
    (event,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Waiting"]  # one event, not one a child
    causes = {c["reason"]: c for c in event["detail"]["causes"]}
    assert causes[CAPACITY]["jobs"] == 2 and causes[CAPACITY]["job_ids"] == sorted([f"{job_id}:0", f"{job_id}:1"])
    assert 3590 <= causes[CAPACITY]["waiting_s"] <= 3610
    assert len(causes) == 2  # the capacity cause and the one without a reason

    # Once per cause: the next sweep, still waiting, says nothing new.
    (again,) = reconcile(ctx, run_id, now=time.time() + 300)
    assert not [a for a in again.actions if a.startswith("waiting")]
    assert [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Waiting"] == []

    s = run_status(ctx.ledger, run_id)
    assert s is not None and {w["reason"] for w in s["waiting"]} == set(causes)
    text = io.StringIO()
    render(s, text)
    assert "waiting   2 job(s) RUNNABLE for 36" in text.getvalue() and CAPACITY in text.getvalue()
