"""Reconciliation: a run whose Batch events were lost still reaches its one true outcome."""

from __future__ import annotations

import json
import time

from sluice.contracts.status import RunStatus
from sluice.control.context import Context
from sluice.control.sweep.reconcile import reconcile
from sluice.control.table.ledger import Ledger
from sluice.settings import Settings
from tests.integration.completion_support import deliver_job_event, job_event, submit_run, write_result
from tests.integration.helpers import bus_events

CHILD = ["batch-array-child-runnable", "batch-array-child-running", "batch-array-child-succeeded"]


def _run_with_lost_events(aws, stack, monkeypatch):
    out = submit_run(aws, stack, monkeypatch, n_keys=30, keys_per_shard=10, name="lost")
    run_id, job_id = out["run_id"], out["job_ids"][0]
    bus_events(aws, stack)
    for i in range(3):
        write_result(aws, stack, run_id, i, processed=10)
    queue = stack.names["GpuJobQueue"]
    for i in range(3):
        for sample in CHILD if i != 1 else CHILD[:-1]:  # shard 1's SUCCEEDED is lost, so is the parent's
            deliver_job_event(stack, job_event(sample, run_id=run_id, job_id=job_id, queue=queue, child=i), monkeypatch)
    return run_id


def _ctx(stack, monkeypatch):
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    return Context.build(Settings.from_env())


def test_lost_events_are_settled_from_batch_after_the_grace(aws, stack, monkeypatch):
    run_id = _run_with_lost_events(aws, stack, monkeypatch)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.get(run_id).status is RunStatus.RUNNING
    ctx = _ctx(stack, monkeypatch)

    # Within the grace nothing is settled from Batch: the missing event may just be late.
    (early,) = reconcile(ctx, run_id, now=time.time())
    assert any("its event was missing" in a for a in early.actions)
    assert not any(a.startswith(("settled", "concluded")) for a in early.actions)
    assert ledger.get(run_id).status is RunStatus.RUNNING

    (late,) = reconcile(ctx, now=time.time() + 3600)  # the sweep: every run that is not final
    assert late.run_id == run_id
    assert any(a.startswith("settled 1 shard(s)") for a in late.actions)
    assert "concluded: Run Succeeded" in late.actions
    row = ledger.get(run_id)
    assert row.status is RunStatus.SUCCEEDED and row.processed == 30
    (done,) = [e for e in bus_events(aws, stack) if e["detail-type"] in ("Run Succeeded", "Run Failed")]
    assert done["detail-type"] == "Run Succeeded" and done["detail"]["processed"] == 30

    # Idempotent: a second sweep changes nothing of the run. It ends only the index stage's job, which
    # moto ends at once without running it (no outcome written: "Index Failed"); a third does nothing.
    (index,) = reconcile(ctx, now=time.time() + 7200)
    assert index.actions == ["index job SUCCEEDED without its event: Index Failed"]
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Index Failed"]
    assert reconcile(ctx, now=time.time() + 7200) == []
    assert ledger.get(run_id).status is RunStatus.SUCCEEDED
    queue = stack.names["GpuJobQueue"]
    late_event = job_event("batch-array-child-succeeded", run_id=run_id, job_id=row.job_ids[0], queue=queue, child=1)
    assert deliver_job_event(stack, late_event, monkeypatch)["status"] == "stale"
    assert bus_events(aws, stack) == []


def test_sluice_reconcile_command(aws, stack, monkeypatch, capsys):
    from sluice.cli import main

    run_id = _run_with_lost_events(aws, stack, monkeypatch)
    _ctx(stack, monkeypatch)
    assert main(["reconcile", run_id, "--grace-s", "0", "--json"]) == 0
    (rec,) = json.loads(capsys.readouterr().out)
    assert rec["run_id"] == run_id and "concluded: Run Succeeded" in rec["actions"]
    assert main(["reconcile", "no-such-run"]) == 1
