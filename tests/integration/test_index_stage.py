"""The index stage from the control plane (moto): submitted once after "Run Succeeded", its end published once.

A run is concluded through the real completion handler; the index job lands on the prepare
queue (moto accepts it and runs nothing), and its "Batch Job State Change" events are
real-shaped (sluice.local.emulator.events). Faults are AWS's: a botocore hook fails one call of the
injected boto3 client, as a throttled or lost request would, between two side effects.
"""

from __future__ import annotations

import io
import json
import time
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from sluice.aws.clients import Clients
from sluice.contracts.events import IndexedTable, IndexFailed, RunIndexed
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control.context import Context
from sluice.control.indexing import stage as indexing
from sluice.control.policy import index_timeout_s
from sluice.control.sweep.reconcile import reconcile
from sluice.control.table.ledger import Ledger
from sluice.errors import RetriableError
from sluice.local.emulator.events import JobChange, batch_job_state_change
from sluice.ops.status import cmd_status
from sluice.paths import index_result
from sluice.settings import Settings
from tests.integration.completion_support import deliver_job_event, job_event, submit_run, write_result
from tests.integration.helpers import INPUT_BUCKET, bus_events, invoke_manifest_handler, keys_manifest

CHILD = ["batch-array-child-running", "batch-array-child-succeeded"]


def _settings(stack: Any, monkeypatch: Any) -> Settings:
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    return Settings.from_env()


def _finish_shards(aws: Any, stack: Any, monkeypatch: Any, out: dict[str, Any], *, last: bool = True) -> None:
    """Every shard's worker result and events (the last shard's SUCCEEDED only when `last`)."""
    run_id, job_id, queue = out["run_id"], out["job_ids"][0], stack.names["GpuJobQueue"]
    for i in range(out["shards"]):
        write_result(aws, stack, run_id, i, processed=10)
        for sample in CHILD if (last or i < out["shards"] - 1) else CHILD[:1]:
            deliver_job_event(stack, job_event(sample, run_id=run_id, job_id=job_id, queue=queue, child=i), monkeypatch)
    parent = job_event("batch-array-parent-succeeded", run_id=run_id, job_id=job_id, queue=queue)
    deliver_job_event(stack, parent, monkeypatch)


def _succeeded(aws: Any, stack: Any, monkeypatch: Any, name: str) -> str:
    out = submit_run(aws, stack, monkeypatch, n_keys=20, keys_per_shard=10, name=name)
    _finish_shards(aws, stack, monkeypatch, out)
    return str(out["run_id"])


def _index_jobs(aws: Any, stack: Any, run_id: str) -> list[str]:
    """Every job named as the run's index job on the prepare queue (ListJobs with a JOB_NAME filter)."""
    resp = aws.batch.list_jobs(
        jobQueue=stack.names["PrepareJobQueue"],
        filters=[{"name": "JOB_NAME", "values": [indexing.job_name(run_id)]}],
    )
    return [j["jobId"] for j in resp["jobSummaryList"]]


def _index_event(stack: Any, run_id: str, job_id: str, status: JobStatus, reason: str | None = None) -> dict[str, Any]:
    change = JobChange(
        job_id=job_id,
        job_name=indexing.job_name(run_id),
        job_queue=stack.names["PrepareJobQueue"],
        status=status,
        run_id=run_id,
        status_reason=reason,
        exit_code=None if status != JobStatus.FAILED else 1,
    )
    return batch_job_state_change(change)


def _write_outcome(aws: Any, uri: str, outcome: RunIndexed | IndexFailed) -> None:
    bucket, _, key = index_result(uri, outcome.run_id)[5:].partition("/")
    aws.s3.put_object(Bucket=bucket, Key=key, Body=outcome.model_dump_json().encode())


def _indexed(run_id: str, uri: str) -> RunIndexed:
    table = IndexedTable(model="reference-cnn", model_id="builtin:reference-cnn@1", uri=uri + "reference-cnn.lance",
                         rows=20, ann="none")  # fmt: skip
    return RunIndexed(run_id=run_id, index_uri=uri, rows=20, seconds=3.5, ann="none", tables=[table])


def _published(aws: Any, stack: Any, kind: str) -> list[dict[str, Any]]:
    return [e["detail"] for e in bus_events(aws, stack) if e["detail-type"] == kind]


def test_a_succeeded_run_submits_its_index_job_once_and_publishes_run_indexed_once(aws, stack, monkeypatch):
    run_id = _succeeded(aws, stack, monkeypatch, "ix")
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    assert row.status is RunStatus.SUCCEEDED and row.index is not None
    assert row.index.state == "submitted" and row.index.uri.endswith("/indexes/ix/")
    (job_id,) = _index_jobs(aws, stack, run_id)
    assert row.index.job_id == job_id
    (desc,) = aws.batch.describe_jobs(jobs=[job_id])["jobs"]
    assert desc["container"]["command"][-4:] == ["--bucket", stack.names["ControlBucket"], "--run", run_id]
    assert desc["tags"]["sluice:run-id"] == run_id
    events = [e["detail-type"] for e in bus_events(aws, stack)]
    assert events.count("Run Succeeded") == 1 and "Run Indexed" not in events

    # A duplicated last event, the parent's again, a second start and the sweep submit nothing more.
    queue = stack.names["GpuJobQueue"]
    again = job_event("batch-array-child-succeeded", run_id=run_id, job_id=row.job_ids[0], queue=queue, child=1)
    assert deliver_job_event(stack, again, monkeypatch)["status"] == "stale"
    ctx = Context.build(_settings(stack, monkeypatch))
    assert indexing.start(ctx, run_id) is None
    assert _index_jobs(aws, stack, run_id) == [job_id]

    # The job's end: the stage's outcome beside the index becomes "Run Indexed", once.
    running = _index_event(stack, run_id, job_id, JobStatus.RUNNING)
    assert deliver_job_event(stack, running, monkeypatch)["status"] == "ignored"
    _write_outcome(aws, row.index.uri, _indexed(run_id, row.index.uri))
    for _ in range(2):  # EventBridge delivers at least once
        got = deliver_job_event(stack, _index_event(stack, run_id, job_id, JobStatus.SUCCEEDED), monkeypatch)
    assert got["status"] == "stale"
    (indexed,) = _published(aws, stack, "Run Indexed")
    assert (indexed["run_id"], indexed["index_uri"], indexed["rows"], indexed["ann"]) == (
        run_id, row.index.uri, 20, "none",
    )  # fmt: skip
    assert indexed["seconds"] == 3.5 and indexed["tables"][0]["model_id"] == "builtin:reference-cnn@1"
    done = ledger.get(run_id)
    assert (done.index.state, done.index.rows, done.index.ann, done.outbox) == ("indexed", 20, "none", None)
    # ... and the run's outcome is untouched; a late FAILED of the same job changes nothing.
    assert (done.status, done.processed, done.finished_at) == (RunStatus.SUCCEEDED, 20, row.finished_at)
    late = _index_event(stack, run_id, job_id, JobStatus.FAILED, "Essential container in task exited")
    assert deliver_job_event(stack, late, monkeypatch)["status"] == "stale"
    assert bus_events(aws, stack) == []
    assert reconcile(ctx, now=time.time() + 3600) == []  # nothing pending: the sweep skips it
    # `sluice status` shows it.
    buf = io.StringIO()
    assert cmd_status(ledger, run_id, watch=False, as_json=True, out=buf) == 0
    assert json.loads(buf.getvalue())["index"] == {
        "uri": row.index.uri, "state": "indexed", "job_id": job_id, "rows": 20, "ann": "none",
        "finished_at": done.index.finished_at, "timeout_s": index_timeout_s(20),
    }  # fmt: skip
    buf = io.StringIO()
    cmd_status(ledger, run_id, watch=False, as_json=False, out=buf)
    assert f"index     {row.index.uri}  indexed: 20 rows, ANN none\n" in buf.getvalue()


def test_a_failed_index_job_publishes_index_failed_with_its_reason(aws, stack, monkeypatch):
    run_id = _succeeded(aws, stack, monkeypatch, "ixfail")
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    bus_events(aws, stack)
    why = "mixed dimensions: reference-cnn has 256-d rows, this run 512-d"
    _write_outcome(aws, row.index.uri, IndexFailed(run_id=run_id, index_uri=row.index.uri, reason=why))
    event = _index_event(stack, run_id, str(row.index.job_id), JobStatus.FAILED, "Essential container in task exited")
    assert deliver_job_event(stack, event, monkeypatch)["status"] == "indexed"
    (failed,) = _published(aws, stack, "Index Failed")
    assert failed["reason"] == why and failed["index_uri"] == row.index.uri
    done = ledger.get(run_id)
    assert (done.index.state, done.index.reason) == ("failed", why)
    assert done.status is RunStatus.SUCCEEDED and done.processed == 20
    buf = io.StringIO()
    assert cmd_status(ledger, run_id, watch=False, as_json=False, out=buf) == 0  # the run itself succeeded
    assert f"index     {row.index.uri}  failed: {why}\n" in buf.getvalue()


def test_a_failed_index_job_without_an_outcome_names_the_job_and_batchs_reason(aws, stack, monkeypatch):
    run_id = _succeeded(aws, stack, monkeypatch, "ixlost")
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    bus_events(aws, stack)
    reason = "Task failed to start: CannotPullContainerError"
    deliver_job_event(stack, _index_event(stack, run_id, str(row.index.job_id), JobStatus.FAILED, reason), monkeypatch)
    (failed,) = _published(aws, stack, "Index Failed")
    assert str(row.index.job_id) in failed["reason"] and reason in failed["reason"]
    assert "streams index/*" in failed["reason"]


def _fail_once(client: Any, op: str, when: Any, code: str = "ThrottlingException") -> dict[str, int]:
    """Make the client's next `op` call that `when(params)` accepts fail with `code` (AWS's fault, not ours)."""
    seen = {"failed": 0}

    def hook(params: dict[str, Any], **_: Any) -> None:
        if not seen["failed"] and when(params):
            seen["failed"] += 1
            raise ClientError({"Error": {"Code": code, "Message": "injected"}}, op)

    client.meta.events.register(f"before-parameter-build.{client.meta.service_model.endpoint_prefix}.{op}", hook)
    return seen


def _clients(aws: Any) -> Clients:
    return Clients(
        s3=aws.s3,
        dynamodb=boto3.client("dynamodb", region_name="us-east-1"),
        batch=boto3.client("batch", region_name="us-east-1"),
        events=boto3.client("events", region_name="us-east-1"),
    )


def _conclude_with(aws: Any, stack: Any, monkeypatch: Any, name: str, clients: Clients) -> tuple[str, Settings]:
    """A run whose last shard event is handled with `clients` (where the fault is injected)."""
    from sluice.control.completion.batch_events import BatchJobStateChangeDetail
    from sluice.control.completion.state_change import handle_job_event

    out = submit_run(aws, stack, monkeypatch, n_keys=20, keys_per_shard=10, name=name)
    _finish_shards(aws, stack, monkeypatch, out, last=False)
    settings = _settings(stack, monkeypatch)
    queue = stack.names["GpuJobQueue"]
    last = job_event(
        "batch-array-child-succeeded", run_id=out["run_id"], job_id=out["job_ids"][0], queue=queue, child=1
    )
    detail = BatchJobStateChangeDetail.model_validate(last["detail"])
    assert handle_job_event(detail, settings=settings, clients=clients).status == "finalized"
    return str(out["run_id"]), settings


def test_a_submission_whose_record_was_lost_is_adopted_by_the_sweep_and_its_end_is_not_lost(aws, stack, monkeypatch):
    clients = _clients(aws)
    # SubmitJob goes through, then recording it fails: the claim stays, leased, and one job exists.
    lost = _fail_once(clients.dynamodb, "UpdateItem", lambda p: ":submitted" in p.get("ExpressionAttributeValues", {}))
    with pytest.raises(RetriableError, match="ThrottlingException"):
        _conclude_with(aws, stack, monkeypatch, "ixfault", clients)
    assert lost["failed"] == 1
    run_id = next(r.run_id for r in Ledger(aws.dynamodb, stack.names["RunsTable"]).recent_runs(5))
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    assert row.status is RunStatus.SUCCEEDED and row.index.state == "claimed" and row.index.job_id is None
    (job_id,) = _index_jobs(aws, stack, run_id)
    assert [e["detail-type"] for e in bus_events(aws, stack)].count("Run Succeeded") == 1

    ctx = Context.build(_settings(stack, monkeypatch))
    # Within the lease the sweep leaves the claim to its holder; after it, it adopts the job by name.
    (early,) = reconcile(ctx, run_id, now=time.time())
    assert early.actions == [] and ledger.get(run_id).index.state == "claimed"
    (late,) = reconcile(ctx, now=time.time() + indexing.LEASE_S + 1)
    assert late.actions == [f"index job {job_id} submitted (its submission was lost)"]
    assert ledger.get(run_id).index.job_id == job_id and _index_jobs(aws, stack, run_id) == [job_id]

    # The job's end event is lost too: the sweep reads Batch (moto ends jobs at once) and the outcome.
    _write_outcome(aws, row.index.uri, _indexed(run_id, row.index.uri))
    (ended,) = reconcile(ctx, now=time.time() + 2 * indexing.LEASE_S)
    assert ended.actions == ["index job SUCCEEDED without its event: Run Indexed"]
    assert len(_published(aws, stack, "Run Indexed")) == 1
    assert reconcile(ctx, now=time.time() + 3 * indexing.LEASE_S) == []


def test_an_index_end_that_arrives_before_its_submission_was_recorded_still_counts_once(aws, stack, monkeypatch):
    clients = _clients(aws)
    _fail_once(clients.dynamodb, "UpdateItem", lambda p: ":submitted" in p.get("ExpressionAttributeValues", {}))
    with pytest.raises(RetriableError, match="ThrottlingException"):
        _conclude_with(aws, stack, monkeypatch, "ixorder", clients)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    run_id = next(r.run_id for r in ledger.recent_runs(5))
    (job_id,) = _index_jobs(aws, stack, run_id)
    row = ledger.get(run_id)
    bus_events(aws, stack)
    _write_outcome(aws, row.index.uri, _indexed(run_id, row.index.uri))
    # Reordered: the job's SUCCEEDED comes while the claim still says "claimed".
    deliver_job_event(stack, _index_event(stack, run_id, job_id, JobStatus.SUCCEEDED), monkeypatch)
    done = ledger.get(run_id)
    assert (done.index.state, done.index.job_id) == ("indexed", job_id)
    assert len(_published(aws, stack, "Run Indexed")) == 1
    ctx = Context.build(_settings(stack, monkeypatch))
    assert reconcile(ctx, now=time.time() + 3600) == [] and indexing.start(ctx, run_id) is None
    assert _index_jobs(aws, stack, run_id) == [job_id]


def test_a_throttled_submission_is_retried_by_the_sweep(aws, stack, monkeypatch):
    clients = _clients(aws)
    throttled = _fail_once(clients.batch, "SubmitJob", lambda p: p.get("jobName", "").endswith("-index"))
    run_id, settings = _conclude_with(aws, stack, monkeypatch, "ixthrottle", clients)
    assert throttled["failed"] == 1
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    assert row.status is RunStatus.SUCCEEDED and row.index.state == "claimed" and row.index.lease_until is None
    assert _index_jobs(aws, stack, run_id) == []
    (swept,) = reconcile(Context.build(settings), now=time.time())  # the lease was given back: at once
    (job_id,) = _index_jobs(aws, stack, run_id)
    assert swept.actions == [f"index job {job_id} submitted (its submission was lost)"]


def test_a_refused_submission_ends_the_stage_with_index_failed(aws, stack, monkeypatch):
    clients = _clients(aws)
    _fail_once(clients.batch, "SubmitJob", lambda p: p.get("jobName", "").endswith("-index"), "ClientException")
    run_id, _ = _conclude_with(aws, stack, monkeypatch, "ixrefused", clients)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    assert row.status is RunStatus.SUCCEEDED and row.index.state == "failed"
    (failed,) = _published(aws, stack, "Index Failed")
    assert "the index job was not submitted" in failed["reason"] and "SLUICE_" in failed["reason"]


def test_index_off_claims_nothing_and_submits_nothing(aws, stack, monkeypatch):
    body = json.loads(keys_manifest(20, {"keys_per_shard": 10}))
    body["output"] = {"index": False}
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    out = invoke_manifest_handler(aws, stack, "manifests/noindex.json", json.dumps(body), monkeypatch)
    assert out["status"] == "submitted", out
    _finish_shards(aws, stack, monkeypatch, out)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row.status is RunStatus.SUCCEEDED and row.index is None
    assert _index_jobs(aws, stack, out["run_id"]) == []
    assert "Run Indexed" not in [e["detail-type"] for e in bus_events(aws, stack)]


def test_an_incremental_run_updates_its_lineages_index_unless_it_names_its_own(aws, stack, monkeypatch):
    from sluice.aws.store import ObjectStore
    from sluice.contracts.manifest import IndexTarget
    from sluice.contracts.plan import RunPlan
    from sluice.contracts.prepare import PrepareSpec
    from sluice.contracts.sections import ModelSpec
    from sluice.paths import RunPaths
    from sluice.prepare import prepare_store
    from tests.integration.incremental_support import earlier_plan, prepare_events, record_run, run_prepare

    ctl = stack.names["ControlBucket"]
    earlier = IndexTarget(uri=f"s3://{ctl}/indexes/photos/", name="photos")
    a = earlier_plan("full-a", RunPaths.in_bucket(ctl, "full-a").root, [(ModelSpec(), "builtin:reference-cnn@1")], 1, 2)
    record_run(aws, stack, a.model_copy(update={"index": earlier}))
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key="x/1.jpg", Body=b"1")

    def plan_of(name: str, **output: Any) -> RunPlan:
        body = {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"keys": ["x/1.jpg"], "bucket": INPUT_BUCKET, "since_run": "full-a"},
        }
        out = invoke_manifest_handler(aws, stack, f"manifests/{name}.json", json.dumps({**body, **output}), monkeypatch)
        assert out["status"] == "preparing", out
        row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
        spec = PrepareSpec.model_validate_json(ObjectStore(aws.s3).get(row.prepare.spec_uri))
        run_prepare(prepare_store(aws.s3), spec)
        for ev in prepare_events(stack, out["run_id"], out["job_ids"], spec):
            deliver_job_event(stack, ev, monkeypatch)
        return RunPlan.model_validate_json(ObjectStore(aws.s3).get(RunPaths.in_bucket(ctl, out["run_id"]).plan))

    assert plan_of("more").index == earlier  # the lineage's one index, updated
    own = plan_of("mine", output={"index": {"name": "mine"}}).index
    assert own == IndexTarget(uri=f"s3://{ctl}/indexes/mine/", name="mine")
    assert plan_of("none", output={"index": False}).index is None


def test_a_hung_index_build_ends_at_its_timeout_as_index_failed_and_a_rerun_builds_the_index(aws, stack, monkeypatch):
    from sluice.control.policy import TIMEOUT_REASON

    run_id = _succeeded(aws, stack, monkeypatch, "ixhang")
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    row = ledger.get(run_id)
    first = str(row.index.job_id)
    # Its timeout comes from the rows it indexes (20 keys, one model), and reaches Batch with the job.
    (job,) = aws.batch.describe_jobs(jobs=[first])["jobs"]
    assert row.index.timeout_s == index_timeout_s(20) == job["timeout"]["attemptDurationSeconds"]
    bus_events(aws, stack)
    # Batch ends a hung attempt at its timeout, FAILED with its own reason, and does not retry it.
    hung = _index_event(stack, run_id, first, JobStatus.FAILED, TIMEOUT_REASON)
    deliver_job_event(stack, hung, monkeypatch)
    (failed,) = _published(aws, stack, "Index Failed")
    assert f"ran past its {index_timeout_s(20)} s timeout" in failed["reason"]
    assert f"sluice index rerun {run_id}" in failed["reason"]
    assert ledger.get(run_id).index.state == "failed"

    # The rerun: a job of its own name (the failed one would be adopted by name), a longer timeout.
    settings = _settings(stack, monkeypatch)
    second = indexing.rerun(Context.build(settings), run_id, timeout_s=7200)
    assert second != first
    (job2,) = aws.batch.describe_jobs(jobs=[second])["jobs"]
    assert job2["jobName"] == indexing.job_name(run_id, 1) and job2["timeout"]["attemptDurationSeconds"] == 7200
    assert indexing.is_index_job(run_id, job2["jobName"]) and not indexing.is_index_job(run_id, job2["jobName"] + "x")
    with pytest.raises(Exception, match="its index stage is submitted"):
        indexing.rerun(Context.build(settings), run_id)  # one rerun at a time
    deliver_job_event(stack, hung, monkeypatch)  # the hung job's event again, late: stale, changes nothing
    assert ledger.get(run_id).index.state == "submitted" and _published(aws, stack, "Index Failed") == []

    _write_outcome(aws, row.index.uri, _indexed(run_id, row.index.uri))
    change = JobChange(
        job_id=second,
        job_name=indexing.job_name(run_id, 1),
        job_queue=stack.names["PrepareJobQueue"],
        status=JobStatus.SUCCEEDED,
        run_id=run_id,
        exit_code=0,
    )
    deliver_job_event(stack, batch_job_state_change(change), monkeypatch)
    (indexed,) = _published(aws, stack, "Run Indexed")
    assert indexed["rows"] == 20
    done = ledger.get(run_id).index
    assert (done.state, done.job_id, done.retired, done.reruns) == ("indexed", second, [first], 1)


def test_a_local_runs_failed_index_job_points_at_its_log_on_disk(aws, stack, monkeypatch):
    monkeypatch.setenv("SLUICE_LOCAL_MODE", "1")  # as `sluice local run`'s router runs the handlers
    run_id = _succeeded(aws, stack, monkeypatch, "ixlocal")
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    bus_events(aws, stack)
    reason = "interrupted: the local run was stopped (Ctrl-C, SIGTERM or SIGHUP) and its workers with it"
    deliver_job_event(stack, _index_event(stack, run_id, str(row.index.job_id), JobStatus.FAILED, reason), monkeypatch)
    (failed,) = _published(aws, stack, "Index Failed")
    assert reason in failed["reason"] and "CloudWatch" not in failed["reason"]
    assert failed["reason"].endswith(
        "its log is the job's worker log on this machine (sluice local run: DIR/<run id>/logs/)"
    )
