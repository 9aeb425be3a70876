"""The prepare path end to end through the real handlers on moto: decide, prepare, submit once.

The manifest handler routes a key list to the prepare jobs (PREPARING, "Run Preparing");
the prepare workers' own code (sluice.prepare) runs in-process against moto S3 as the
container would; then the prepare jobs' events, in any order and duplicated, reach the real
completion handler, which writes plan.json and submits the inference jobs exactly once.
"""

from __future__ import annotations

import json
import random
import threading

import pytest

from sluice.aws import clients as sluice_aws
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import PrepareSpec
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control.batch import prepare_job_name
from sluice.control.sweep.reconcile import reconcile
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.events import JobChange, attempt, batch_job_state_change
from sluice.ops.status import run_status
from sluice.paths import RunPaths
from sluice.prepare import prepare_store
from sluice.prepare.mapper.worker import run_map
from sluice.prepare.reducer.worker import run_reduce
from tests.integration.completion_support import Atomic, deliver_job_event
from tests.integration.helpers import INPUT_BUCKET, all_jobs, bus_events, invoke_manifest_handler, shard_pairs

WORKERS = 3


def _keylist(aws, lines: list[str]) -> str:
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key="lists/keys.txt", Body="\n".join(lines).encode() + b"\n")
    return f"s3://{INPUT_BUCKET}/lists/keys.txt"


def _start(aws, stack, monkeypatch, lines: list[str], name: str = "big") -> tuple[dict, PrepareSpec]:
    uri = _keylist(aws, lines)
    body = json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"key_list": uri, "bucket": INPUT_BUCKET},
            "job": {"keys_per_shard": 40},
        }
    )
    out = invoke_manifest_handler(
        aws, stack, f"manifests/{name}.json", body, monkeypatch, {"SLUICE_PREPARE_WORKERS": str(WORKERS)}
    )
    assert out["status"] == "preparing", out
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.PREPARING and row.prepare is not None
    spec = PrepareSpec.model_validate_json(ObjectStore(aws.s3).get(row.prepare.spec_uri))
    return out, spec


def _run_workers(aws, spec: PrepareSpec) -> None:
    store = prepare_store(aws.s3)
    for w in range(spec.workers):
        run_map(spec, w, store)
    for r in range(spec.partitions):
        run_reduce(spec, r, store)


def _prepare_event(stack, run_id: str, job_id: str, stage: str, status: JobStatus, size: int, reason=None) -> dict:
    done = [attempt(1_000, 2_000, 0 if status == JobStatus.SUCCEEDED else 1, "Essential container in task exited")]
    return batch_job_state_change(
        JobChange(
            job_id=job_id,
            job_name=prepare_job_name(run_id, stage),
            job_queue=stack.names["PrepareJobQueue"],
            status=status,
            run_id=run_id,
            attempts=done if status.terminal else [],
            status_reason=reason,
            array_size=size if size >= 2 else None,
        )
    )


def _all_prepare_events(stack, out: dict, spec: PrepareSpec, final: JobStatus = JobStatus.SUCCEEDED) -> list[dict]:
    map_id, reduce_id = out["job_ids"]
    evs = []
    for jid, stage, size in ((map_id, "map", spec.workers), (reduce_id, "reduce", spec.partitions)):
        for st in (JobStatus.PENDING, JobStatus.RUNNING, final if stage == "reduce" else JobStatus.SUCCEEDED):
            evs.append(_prepare_event(stack, out["run_id"], jid, stage, st, size))
        for i in range(size):  # children: recorded nowhere, decide nothing
            ev = _prepare_event(stack, out["run_id"], f"{jid}:{i}", stage, JobStatus.SUCCEEDED, 1)
            ev["detail"]["arrayProperties"] = {"index": i}
            evs.append(ev)
    return evs


def _gpu_jobs(aws, stack) -> list[dict]:
    prepare_queue = stack.names["PrepareJobQueue"]
    return [j for j in all_jobs(aws) if not j["jobQueue"].endswith(prepare_queue.rsplit("/", 1)[-1])]


def test_a_big_key_list_is_prepared_then_submitted_once_in_any_event_order(aws, stack, monkeypatch):
    keys = [f"img/{i:05d}.jpg" for i in range(500)]
    lines = keys + keys[:120]  # 120 duplicates, spread over the byte ranges of all workers
    random.Random(3).shuffle(lines)
    out, spec = _start(aws, stack, monkeypatch, lines)
    events = [e["detail-type"] for e in bus_events(aws, stack)]
    assert events == ["Run Preparing"]
    assert spec.workers == WORKERS and len(spec.tasks) == WORKERS
    assert not _gpu_jobs(aws, stack), "nothing runs on a GPU before prepare ends"
    shown = run_status(Ledger(aws.dynamodb, stack.names["RunsTable"]), out["run_id"])
    assert shown is not None and shown["status"] == "PREPARING" and shown["prepare"]["workers"] == WORKERS
    _run_workers(aws, spec)
    evs = _all_prepare_events(stack, out, spec)
    evs += random.Random(5).sample(evs, len(evs) // 2)  # duplicates
    random.Random(7).shuffle(evs)
    for ev in evs:
        deliver_job_event(stack, ev, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.SUBMITTED
    assert (row.total_keys, row.duplicates) == (500, 120)
    plan = RunPlan.model_validate_json(
        ObjectStore(aws.s3).get(RunPaths.in_bucket(stack.names["ControlBucket"], out["run_id"]).plan)
    )
    assert plan.total_keys == 500 and plan.n_shards == row.shards
    decoded = [k for shard in shard_pairs(aws, stack, out["run_id"]) for k in shard]
    assert sorted(decoded) == sorted((INPUT_BUCKET, k) for k in keys), "every unique key exactly once"
    assert len(_gpu_jobs(aws, stack)) == len(plan.jobs), "the inference jobs were submitted once"
    published = [e["detail-type"] for e in bus_events(aws, stack)]
    assert published == ["Run Submitted"]


def test_bad_lines_found_by_a_prepare_worker_reject_the_run_naming_the_line(aws, stack, monkeypatch):
    lines = [f"img/{i:05d}.jpg" for i in range(300)]
    lines[250] = "https://example.com/not-a-key.jpg"  # in the last worker's byte range
    out, spec = _start(aws, stack, monkeypatch, lines, name="bad")
    bus_events(aws, stack)
    _run_workers(aws, spec)
    for ev in _all_prepare_events(stack, out, spec):
        deliver_job_event(stack, ev, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.REJECTED
    assert row.reasons and "keys.txt line 251" in row.reasons[0] and "URL" in row.reasons[0], row.reasons
    (rejected,) = bus_events(aws, stack)
    assert rejected["detail-type"] == "Manifest Rejected" and rejected["detail"]["reasons"] == row.reasons
    assert not _gpu_jobs(aws, stack)


def test_a_failed_prepare_job_fails_the_run_at_stage_prepare(aws, stack, monkeypatch):
    out, spec = _start(aws, stack, monkeypatch, [f"k/{i}.jpg" for i in range(100)], name="crash")
    bus_events(aws, stack)
    map_id, reduce_id = out["job_ids"]
    fail = _prepare_event(stack, out["run_id"], map_id, "map", JobStatus.FAILED, spec.workers, "1 of 3 failed")
    dependent = _prepare_event(
        stack, out["run_id"], reduce_id, "reduce", JobStatus.FAILED, spec.partitions, "Dependent Job failed"
    )
    for ev in (dependent, fail, fail):
        deliver_job_event(stack, ev, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.FAILED
    (failed,) = bus_events(aws, stack)
    assert failed["detail-type"] == "Run Failed" and failed["detail"]["stage"] == "prepare"
    assert "prepare" in failed["detail"]["reason"] and "failed" in failed["detail"]["reason"]
    assert not _gpu_jobs(aws, stack)


def test_the_sweep_submits_a_prepared_run_whose_events_were_lost(aws, stack, monkeypatch):
    out, spec = _start(aws, stack, monkeypatch, [f"k/{i}.jpg" for i in range(200)], name="lost")
    bus_events(aws, stack)
    _run_workers(aws, spec)
    # No event arrives; moto reports the prepare jobs SUCCEEDED, as Batch would after they ran.
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    (done,) = reconcile(run_id=out["run_id"])
    assert any("Run Submitted" in a for a in done.actions), done
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.SUBMITTED and row.total_keys == 200
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Run Submitted"]


def test_concurrent_deliveries_of_the_reduce_end_submit_once(aws, stack, monkeypatch):
    out, spec = _start(aws, stack, monkeypatch, [f"k/{i}.jpg" for i in range(200)], name="race")
    bus_events(aws, stack)
    _run_workers(aws, spec)
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sluice_aws, "client", _atomic_dynamodb(sluice_aws.client))
    ev = _prepare_event(stack, out["run_id"], out["job_ids"][1], "reduce", JobStatus.SUCCEEDED, spec.partitions)
    errors: list[BaseException] = []

    def go() -> None:
        try:
            deliver_job_event(stack, ev, monkeypatch)
        except BaseException as exc:  # a loser may see a retriable error; it must not double-submit
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.SUBMITTED, errors
    assert len(_gpu_jobs(aws, stack)) == len(row.jobs or [])
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Run Submitted"]


def _atomic_dynamodb(real_client):
    cache: dict[str, Atomic] = {}

    def client(service: str, *a, **kw):
        c = real_client(service, *a, **kw)
        if service != "dynamodb":
            return c
        return cache.setdefault(service, Atomic(c))

    return client


@pytest.mark.parametrize("lines", [[f"k/{i}.jpg" for i in range(50)]])
def test_a_small_input_keeps_the_lambda_path(aws, stack, monkeypatch, lines):
    uri = _keylist(aws, lines)
    body = json.dumps(
        {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"key_list": uri, "bucket": INPUT_BUCKET}}
    )
    out = invoke_manifest_handler(aws, stack, "manifests/small.json", body, monkeypatch)
    assert out["status"] == "submitted" and out["total_keys"] == 50


def test_a_key_list_over_the_lambda_byte_limit_goes_to_prepare_not_to_a_rejection(aws, stack, monkeypatch):
    uri = _keylist(aws, [f"k/{i}.jpg" for i in range(40)])
    body = json.dumps(
        {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"key_list": uri, "bucket": INPUT_BUCKET}}
    )
    out = invoke_manifest_handler(
        aws, stack, "manifests/long.json", body, monkeypatch, {"SLUICE_MAX_KEYLIST_BYTES": "100"}
    )
    assert out["status"] == "preparing", out
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Run Preparing"]


class Died(Exception):
    """The Lambda died right after this AWS call succeeded."""


@pytest.mark.parametrize(
    ("service", "op"),
    [("s3", "PutObject"), ("batch", "SubmitJob"), ("dynamodb", "UpdateItem"), ("events", "PutEvents")],
)
def test_a_submit_step_killed_after_any_call_is_finished_by_the_redelivery_once(aws, stack, monkeypatch, service, op):
    out, spec = _start(aws, stack, monkeypatch, [f"k/{i}.jpg" for i in range(200)], name=f"die-{op.lower()}")
    bus_events(aws, stack)
    _run_workers(aws, spec)
    ev = _prepare_event(stack, out["run_id"], out["job_ids"][1], "reduce", JobStatus.SUCCEEDED, spec.partitions)
    client = sluice_aws.client(service)
    seen = {"n": 0}

    def die(**_: object) -> None:
        seen["n"] += 1
        # The submit step's first call of each kind after taking its lease: plan.json, the first
        # inference job, SUBMITTED (the lease is UpdateItem 1), "Run Submitted".
        if seen["n"] == (2 if op == "UpdateItem" else 1):
            raise Died(f"killed after {op}")

    client.meta.events.register(f"after-call.{service}.{op}", die, unique_id="die")
    try:
        with pytest.raises(Died):
            deliver_job_event(stack, ev, monkeypatch)
    finally:
        client.meta.events.unregister(f"after-call.{service}.{op}", unique_id="die")
    # A dead Lambda gives nothing back: its lease (and any outbox claim) runs out.
    table = stack.names["RunsTable"]
    key = {"pk": {"S": out["run_id"]}, "sk": {"S": "RUN"}}
    raw = aws.dynamodb.get_item(TableName=table, Key=key)["Item"]
    if "lease_until" in raw:
        aws.dynamodb.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET lease_until = :p",
            ExpressionAttributeValues={":p": {"N": "1"}},
        )
    if "outbox" in raw and "claimed_until" in raw["outbox"]["M"]:
        aws.dynamodb.update_item(TableName=table, Key=key, UpdateExpression="REMOVE outbox.claimed_until")
    deliver_job_event(stack, ev, monkeypatch)
    row = Ledger(aws.dynamodb, table).get(out["run_id"])
    assert row is not None and row.status == RunStatus.SUBMITTED and row.total_keys == 200
    assert len(_gpu_jobs(aws, stack)) == len(row.jobs or []) == len(row.job_ids)
    published = [e["detail-type"] for e in bus_events(aws, stack)]
    assert published.count("Run Submitted") >= 1 and set(published) == {"Run Submitted"}


def test_a_key_list_underestimated_by_its_sample_is_rerouted_to_prepare_by_the_lambda_cap(aws, stack, monkeypatch):
    long = [f"long/{i:04d}/" + "x" * 990 + ".jpg" for i in range(70)]  # the 64 KiB sample: ~1,000 bytes a line
    lines = long + [f"s/{i}.jpg" for i in range(5_000)]  # then short lines: ~110 keys estimated, 5,070 there
    uri = _keylist(aws, lines)
    body = json.dumps(
        {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"key_list": uri, "bucket": INPUT_BUCKET}}
    )
    env = {"SLUICE_PREPARE_OVER_KEYS": "500"}  # the Lambda's scan stops at 4 x 500 keys
    out = invoke_manifest_handler(aws, stack, "manifests/skewed.json", body, monkeypatch, env)
    assert out["status"] == "preparing", out
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.prepare is not None and row.prepare.input_keys_estimate >= 2_000
    assert not [o for o in run_objects_under(aws, stack, out["run_id"], "shards/")], "the Lambda wrote no shard"


def run_objects_under(aws, stack, run_id: str, sub: str) -> list[str]:
    resp = aws.s3.list_objects_v2(Bucket=stack.names["ControlBucket"], Prefix=f"runs/{run_id}/{sub}")
    return [o["Key"] for o in resp.get("Contents", [])]


def test_a_prepared_run_warns_about_input_in_another_region_at_submit(aws, stack, monkeypatch):
    # A key list's keys name their buckets only inside the file: the prepare workers report them, the plan
    # carries them (input_buckets), and the submit step's preflight asks their Region.
    from sluice.preflight import locality

    monkeypatch.setattr(locality, "_REGIONS", {})
    aws.s3.create_bucket(Bucket="photos-far", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    out, spec = _start(aws, stack, monkeypatch, [f"s3://photos-far/img/{i:04d}.jpg" for i in range(300)], "far")
    _run_workers(aws, spec)
    for ev in _all_prepare_events(stack, out, spec):
        deliver_job_event(stack, ev, monkeypatch)
    plan = RunPlan.model_validate_json(
        ObjectStore(aws.s3).get(RunPaths.in_bucket(stack.names["ControlBucket"], out["run_id"]).plan)
    )
    assert plan.input_buckets == ["photos-far"]
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    far = [w for w in ev["detail"]["warnings"] if w.startswith("preflight: data locality")]
    assert len(far) == 1 and "input bucket photos-far is in eu-west-1" in far[0], ev["detail"]["warnings"]
