"""The sweep redrives an upload stranded in PLANNING: one set of jobs and one "Run Submitted", whatever races.

moto's Lambda runs no code without Docker, so `LambdaService` stands in for the Lambda service
at the boto boundary: an asynchronous invoke queues the event, and `run_queued` runs the named
function's real handler on it, as Lambda would.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any

from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel

from sluice.aws import clients as sluice_aws
from sluice.aws.clients import Clients
from sluice.contracts.status import RunStatus
from sluice.control.context import Context
from sluice.control.intake.coordinator import handle_upload, run_id_for
from sluice.control.submit import WITHDRAWN
from sluice.control.sweep.reconcile import reconcile
from sluice.control.sweep.redrive import RELEASED_GRACE_S, stranded
from sluice.control.table.items import UploadItem
from sluice.control.table.ledger import RUN_SK, Ledger
from sluice.local.emulator.lambda_context import LocalContext
from sluice.settings import Settings
from tests.integration.completion_support import Atomic
from tests.integration.helpers import INPUT_BUCKET, bus_events, keys_manifest, put_manifest

MANIFEST_FUNCTION = "HandleManifestUploadFunction"


class LambdaService:
    """Lambda's asynchronous Invoke: the event is queued (202), then the function's real handler runs it."""

    meta = SimpleNamespace(region_name="us-east-1")

    def __init__(self) -> None:
        self.queued: list[tuple[str, dict[str, Any]]] = []

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> dict[str, Any]:
        assert InvocationType == "Event"
        self.queued.append((FunctionName, json.loads(Payload)))
        return {"StatusCode": 202}

    def run_queued(self, *, threads: bool = False) -> list[dict[str, Any]]:
        """Run every queued invocation (concurrently with `threads`); the handlers' outcomes."""
        from functions.handle_manifest_upload import handler

        work, self.queued = self.queued, []
        assert all(fn == MANIFEST_FUNCTION for fn, _ in work)
        outs: list[dict[str, Any]] = []

        def one(event: dict[str, Any]) -> None:
            S3EventNotificationEventBridgeModel.model_validate(event)  # what EventBridge would deliver
            outs.append(handler(event, LocalContext(function_name=MANIFEST_FUNCTION)))

        if not threads:
            for _, event in work:
                one(event)
            return outs
        pool = [threading.Thread(target=one, args=(e,)) for _, e in work]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert len(outs) == len(work)
        return outs


class Gate:
    """A Batch client whose first SubmitJob waits until the test opens the gate (an invocation that hangs)."""

    def __init__(self, client: Any) -> None:
        self._client, self.reached, self.open = client, threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._client, name)
        if name != "submit_job":
            return fn

        def call(**kw: Any) -> Any:
            self.reached.set()
            assert self.open.wait(60)
            return fn(**kw)

        return call


def _env(stack: Any, monkeypatch: Any) -> Settings:
    for k, v in stack.env_for(MANIFEST_FUNCTION).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLUICE_MANIFEST_FUNCTION", MANIFEST_FUNCTION)
    return Settings.from_env()


def _upload(aws: Any, stack: Any) -> tuple[str, UploadItem]:
    """A manifest uploaded (its event not delivered): the run id and upload its delivery would have."""
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    event = put_manifest(aws, stack, "manifests/stuck.json", keys_manifest(30, {"keys_per_shard": 10}))
    obj = event["detail"]["object"]
    upload = UploadItem(
        bucket=event["detail"]["bucket"]["name"],
        key=obj["key"],
        version_id=obj.get("version-id"),
        etag=obj["etag"],
        sequencer=obj.get("sequencer"),
    )
    version = upload.version_id or f"{upload.etag}:{upload.sequencer or ''}"
    return run_id_for(upload.bucket, upload.key, version), upload


def _stranded(aws: Any, stack: Any) -> tuple[str, UploadItem]:
    """An upload whose invocation claimed it and died: PLANNING, its lease long expired."""
    run_id, upload = _upload(aws, stack)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim(run_id, f"s3://{upload.bucket}/{upload.key}", upload=upload, now=time.time() - 2000)
    return run_id, upload


def _jobs_named(aws: Any, stack: Any, run_id: str) -> list[dict[str, Any]]:
    resp = aws.batch.list_jobs(
        jobQueue=stack.names["GpuJobQueue"], filters=[{"name": "JOB_NAME", "values": [f"sluice-{run_id}-0"]}]
    )
    ids = [j["jobId"] for j in resp["jobSummaryList"] if ":" not in j["jobId"]]  # not the array's children
    return [aws.batch.describe_jobs(jobs=[i])["jobs"][0] for i in ids]


def _submitted(aws: Any, stack: Any) -> list[dict[str, Any]]:
    return [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]


def test_a_stranded_upload_is_redriven_once(aws, stack, monkeypatch):
    settings = _env(stack, monkeypatch)
    run_id, _ = _stranded(aws, stack)
    service = LambdaService()
    ctx = Context.build(settings, Clients().inject("lambda", service))
    (swept,) = reconcile(ctx, run_id)
    assert swept.actions == [f"stranded in planning: redriven to {MANIFEST_FUNCTION}"]
    (out,) = service.run_queued()
    assert out["status"] == "submitted" and out["run_id"] == run_id
    run = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    assert run is not None and run.status is RunStatus.SUBMITTED and run.job_ids == out["job_ids"]
    # The next sweep finds nothing stranded: no second invocation, no second job, one announcement.
    (again,) = reconcile(ctx, run_id)
    assert not any("stranded" in a for a in again.actions) and service.queued == []
    assert [j["jobId"] for j in _jobs_named(aws, stack, run_id)] == out["job_ids"]
    (announced,) = _submitted(aws, stack)
    assert announced["detail"]["run_id"] == run_id and announced["detail"]["job_ids"] == out["job_ids"]


def test_duplicate_sweeps_redrive_concurrently_to_one_set_of_jobs(aws, stack, monkeypatch):
    settings = _env(stack, monkeypatch)
    run_id, _ = _stranded(aws, stack)
    service = LambdaService()
    ctx = Context.build(settings, Clients().inject("lambda", service))
    # Two sweeps each see the run stranded before either redriven invocation has run.
    for _ in range(2):
        (swept,) = reconcile(ctx, run_id)
        assert swept.actions == [f"stranded in planning: redriven to {MANIFEST_FUNCTION}"]
    # Both invocations run at once, DynamoDB atomic per request as it is (moto's is not).
    sluice_aws.reset_clients()
    sluice_aws._clients[("dynamodb", "default", None)] = Atomic(aws.dynamodb)
    outs = service.run_queued(threads=True)
    assert sorted(o["status"] for o in outs) == ["duplicate", "submitted"]
    (won,) = [o for o in outs if o["status"] == "submitted"]
    assert [j["jobId"] for j in _jobs_named(aws, stack, run_id)] == won["job_ids"]
    assert len(_submitted(aws, stack)) == 1


def test_the_redrive_racing_the_original_leaves_one_set_of_jobs(aws, stack, monkeypatch):
    settings = _env(stack, monkeypatch)
    run_id, upload = _upload(aws, stack)
    table = stack.names["RunsTable"]
    gate = Gate(aws.batch)
    original: dict[str, Any] = {}

    def hang_then_resume() -> None:
        original.update(handle_upload(upload, settings=settings, clients=Clients(batch=gate)).as_dict())

    thread = threading.Thread(target=hang_then_resume)
    thread.start()
    assert gate.reached.wait(60)  # the original planned, found no job by name, and hangs before SubmitJob
    # ... past its lease (the function's timeout): the sweep sees the upload stranded.
    aws.dynamodb.update_item(
        TableName=table,
        Key={"pk": {"S": run_id}, "sk": {"S": RUN_SK}},
        UpdateExpression="SET lease_until = :past",
        ExpressionAttributeValues={":past": {"N": str(int(time.time()) - 1)}},
    )
    service = LambdaService()
    reconcile(Context.build(settings, Clients().inject("lambda", service)), run_id)
    (redriven,) = service.run_queued()
    assert redriven["status"] == "submitted"
    gate.open.set()  # the original resumes: it submits its own job, then loses the transition
    thread.join(60)
    assert original["status"] == "duplicate"
    run = Ledger(aws.dynamodb, table).get(run_id)
    assert run is not None and run.status is RunStatus.SUBMITTED and run.job_ids == redriven["job_ids"]
    jobs = {j["jobId"]: j for j in _jobs_named(aws, stack, run_id)}
    assert len(jobs) == 2  # both reached SubmitJob before either's job was listed ...
    (extra,) = set(jobs) - set(redriven["job_ids"])
    assert jobs[extra]["statusReason"] == WITHDRAWN  # ... and the loser withdrew its own
    (announced,) = _submitted(aws, stack)
    assert announced["detail"]["job_ids"] == redriven["job_ids"]


def test_released_runs_wait_for_the_functions_own_retries():
    now = 10_000.0
    base = {
        "pk": "r",
        "sk": "RUN",
        "gsi1pk": "RUNS",
        "run_id": "r",
        "manifest_uri": "s3://b/manifests/m.json",
        "expires_at": 0,
    }
    from sluice.control.table.items import RunItem

    def run(status: RunStatus, **kw: Any) -> RunItem:
        return RunItem(**base, status=status, created_at=0, **kw)

    assert stranded(run(RunStatus.PLANNING, updated_at=0, lease_until=int(now) - 1), now)
    assert not stranded(run(RunStatus.PLANNING, updated_at=0, lease_until=int(now) + 1), now)
    assert not stranded(run(RunStatus.RELEASED, updated_at=int(now) - RELEASED_GRACE_S + 5), now)
    assert stranded(run(RunStatus.RELEASED, updated_at=int(now) - RELEASED_GRACE_S - 5), now)
    assert not stranded(run(RunStatus.SUBMITTED, updated_at=0), now)
