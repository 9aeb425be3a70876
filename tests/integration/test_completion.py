"""The completion handler on moto: ledger state, progress and exactly one outcome."""

from __future__ import annotations

import copy
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.control.table.ledger import Ledger
from sluice.control.table.records import ShardRecords
from sluice.shards import ShardReader
from tests.conftest import load_event
from tests.integration.completion_support import Atomic, deliver_job_event, job_event, submit_run, write_result
from tests.integration.helpers import INPUT_BUCKET, all_jobs, bus_events
from tests.properties import examples

CHILD_OK = [
    "batch-array-child-runnable",
    "batch-array-child-starting",
    "batch-array-child-running",
    "batch-array-child-succeeded",
]


def _queue(stack):
    return stack.names["GpuJobQueue"]


def _outcomes(events):
    return [e for e in events if e["detail-type"] in ("Run Succeeded", "Run Failed")]


def _array_run(aws, stack, monkeypatch, n_shards=3, per_shard=10, name="run"):
    out = submit_run(aws, stack, monkeypatch, n_keys=n_shards * per_shard, keys_per_shard=per_shard, name=name)
    bus_events(aws, stack)  # drop "Run Submitted"
    return out["run_id"], out["job_ids"][0]


def _ev(run_id, job_id, stack, sample, child=None):
    return job_event(sample, run_id=run_id, job_id=job_id, queue=_queue(stack), child=child)


def test_array_run_succeeds_once_with_counts_from_the_workers(aws, stack, monkeypatch):
    run_id, job_id = _array_run(aws, stack, monkeypatch)
    for i in range(3):
        write_result(
            aws,
            stack,
            run_id,
            i,
            processed=9 if i == 1 else 10,
            failures=[(f"s3://{INPUT_BUCKET}/img/00011.jpg", "corrupt")] if i == 1 else [],
        )
    for i in range(3):
        for sample in CHILD_OK:
            deliver_job_event(stack, _ev(run_id, job_id, stack, sample, child=i), monkeypatch)
    out = deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-parent-succeeded"), monkeypatch)
    assert out["status"] == "finalized" and out["published"] == ["Run Succeeded"]

    events = bus_events(aws, stack)
    progress = [e["detail"] for e in events if e["detail-type"] == "Run Progress"]
    assert [p["shards_done"] for p in progress] == [1, 2, 3] and all(p["shards_total"] == 3 for p in progress)
    (done,) = _outcomes(events)
    d = done["detail"]
    assert done["detail-type"] == "Run Succeeded"
    assert (d["run_id"], d["processed"], d["failed"]) == (run_id, 29, 1)
    assert d["output_prefix"].endswith(f"/runs/{run_id}/output/") and d["duration_s"] >= 0
    assert d["failed_by_reason"] == {"corrupt": 1}

    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    counts = ShardRecords(aws.dynamodb, stack.names["RunsTable"]).counts(run_id)
    assert row.status == "SUCCEEDED" and counts.shards_succeeded == 3 and row.jobs_done == 1
    # A duplicate terminal event publishes nothing more.
    again = deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-parent-succeeded"), monkeypatch)
    assert again["status"] == "stale" and _outcomes(bus_events(aws, stack)) == []


def test_spot_reclaim_then_success_records_attempt_two(aws, stack, monkeypatch):
    run_id, job_id = _array_run(aws, stack, monkeypatch, n_shards=2)
    for i in range(2):
        write_result(aws, stack, run_id, i, processed=10, attempt=2 if i == 1 else 1)
    seq = [(0, s) for s in CHILD_OK] + [
        (1, "batch-array-child-running"),
        (1, "batch-array-child-spot-reclaimed"),
        (1, "batch-array-child-running"),  # late duplicate of attempt 1: must not win
        (1, "batch-array-child-succeeded-attempt2"),
    ]
    for child, sample in seq:
        deliver_job_event(stack, _ev(run_id, job_id, stack, sample, child=child), monkeypatch)
    deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-parent-succeeded"), monkeypatch)
    items = {i.shard: i for i in ShardRecords(aws.dynamodb, stack.names["RunsTable"]).shard_items(run_id)}
    assert items[1].status == "SUCCEEDED" and items[1].attempt == 2 and items[1].spot_reclaimed is True
    assert items[0].attempt == 1
    (done,) = _outcomes(bus_events(aws, stack))
    assert done["detail-type"] == "Run Succeeded" and done["detail"]["processed"] == 20


def test_a_child_failing_for_good_fails_the_run_naming_the_shard(aws, stack, monkeypatch):
    run_id, job_id = _array_run(aws, stack, monkeypatch, n_shards=3)
    write_result(aws, stack, run_id, 0, processed=10)
    write_result(aws, stack, run_id, 1, processed=10)
    for child, sample in [
        (0, "batch-array-child-succeeded"),
        (1, "batch-array-child-succeeded"),
        (2, "batch-array-child-running"),
        (2, "batch-array-child-failed"),
    ]:
        deliver_job_event(stack, _ev(run_id, job_id, stack, sample, child=child), monkeypatch)
    deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-parent-failed"), monkeypatch)
    (done,) = _outcomes(bus_events(aws, stack))
    d = done["detail"]
    assert done["detail-type"] == "Run Failed" and d["shards_failed"] == [2]
    assert d["reason"] == "1 of 3 shards failed: shard 2 (exit code 1: Essential container in task exited)"
    assert d["failed_keys_uri"].endswith(f"/runs/{run_id}/failures/")
    assert Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id).status == "FAILED"


def test_a_failed_childs_own_last_words_are_the_shards_reason(aws, stack, monkeypatch):
    """The worker's shards/<i>.error.json of that attempt, not Batch's "Essential container in task exited"."""
    from sluice.aws.s3uri import parse_s3_uri
    from sluice.contracts.results import ShardError
    from sluice.paths import RunPaths

    run_id, job_id = _array_run(aws, stack, monkeypatch, n_shards=3)
    write_result(aws, stack, run_id, 0, processed=10)
    paths = RunPaths.in_bucket(stack.names["ControlBucket"], run_id)
    said = "configuration error: model m.pt: chunk_tokens 300 is over the 254 tokens its context holds"
    for shard, attempt in ((1, 1), (2, 5)):  # shard 2's words are of another attempt: Batch's reason stands
        err = ShardError(run_id=run_id, shard=shard, attempt=attempt, exit_code=2, reason=said)
        bucket, key = parse_s3_uri(paths.error(shard))
        aws.s3.put_object(Bucket=bucket, Key=key, Body=err.model_dump_json().encode())
    failed = "batch-array-child-failed"
    for child, sample in [(0, "batch-array-child-succeeded"), (1, failed), (2, failed)]:
        deliver_job_event(stack, _ev(run_id, job_id, stack, sample, child=child), monkeypatch)
    deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-parent-failed"), monkeypatch)
    (done,) = _outcomes(bus_events(aws, stack))
    exited = "exit code 1: Essential container in task exited"
    assert done["detail"]["reason"] == f"2 of 3 shards failed: shard 1 (exit code 1: {said}), shard 2 ({exited})"


def test_multinode_run_completes_from_node_and_job_events(aws, stack, monkeypatch):
    out = submit_run(aws, stack, monkeypatch, n_keys=20, mode="multinode", nodes=2, name="mnp")
    bus_events(aws, stack)
    run_id, job_id = out["run_id"], out["job_ids"][0]
    q = stack.names["MnpJobQueue"]
    for i in range(2):
        write_result(aws, stack, run_id, i, processed=10)
    for node, sample in [
        (0, "batch-mnp-main-node-running"),
        (1, "batch-mnp-node-succeeded"),
        (0, "batch-mnp-node-succeeded"),
    ]:
        deliver_job_event(stack, job_event(sample, run_id=run_id, job_id=job_id, queue=q, node=node), monkeypatch)
    deliver_job_event(stack, job_event("batch-mnp-job-succeeded", run_id=run_id, job_id=job_id, queue=q), monkeypatch)
    (done,) = _outcomes(bus_events(aws, stack))
    assert done["detail-type"] == "Run Succeeded" and done["detail"]["processed"] == 20


def test_retry_pass_reruns_transient_failures_once_and_publishes_after_it(aws, stack, monkeypatch):
    run_id, job_id = _array_run(aws, stack, monkeypatch, n_shards=2)
    b = f"s3://{INPUT_BUCKET}/img"
    write_result(
        aws,
        stack,
        run_id,
        0,
        processed=8,
        failures=[(f"{b}/00001.jpg", "s3_error_transient"), (f"{b}/00002.jpg", "corrupt")],
    )
    write_result(aws, stack, run_id, 1, processed=9, failures=[(f"{b}/00013.jpg", "s3_error_transient")])
    for i in range(2):
        deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-child-succeeded", child=i), monkeypatch)
    out = deliver_job_event(stack, _ev(run_id, job_id, stack, "batch-array-parent-succeeded"), monkeypatch)
    assert out["status"] == "retrying"
    assert _outcomes(bus_events(aws, stack)) == []

    jobs = {j["jobId"]: j for j in all_jobs(aws)}
    assert len(jobs) == 2
    retry_id = next(j for j in jobs if j != job_id)
    env = {e["name"]: e["value"] for e in jobs[retry_id]["container"]["environment"]}
    assert env["SLUICE_SHARD_INDEX"] == "2" and env["SLUICE_PLAN_URI"].endswith("/plan-retry-1.json")
    control = stack.names["ControlBucket"]
    shard = ShardReader(aws.s3.get_object(Bucket=control, Key=f"runs/{run_id}/shards/2.shard")["Body"].read())
    assert sorted(shard.uris()) == [f"{b}/00001.jpg", f"{b}/00013.jpg"]  # the corrupt key is never retried

    # The retry shard: one key recovers, one is still throttled. No second pass (retry_failed=1).
    write_result(aws, stack, run_id, 2, processed=1, failures=[(f"{b}/00013.jpg", "s3_error_transient")])
    single = job_event("batch-array-child-succeeded", run_id=run_id, job_id=retry_id, queue=_queue(stack), job_index=1)
    single["detail"].pop("arrayProperties")
    final = deliver_job_event(stack, single, monkeypatch)
    assert final["published"][-1] == "Run Succeeded"
    (done,) = _outcomes(bus_events(aws, stack))
    assert done["detail"]["processed"] == 18 and done["detail"]["failed"] == 2  # 8+9+1; corrupt + still-throttled
    gpu = [j for j in all_jobs(aws) if not j["jobName"].endswith("-index")]  # and the index stage's job, after it
    assert done["detail"]["retry_passes"] == 1 and len(gpu) == 2 and len(all_jobs(aws)) == 3


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda e: e["detail"].pop("jobId"), "missing detail field"),
        (lambda e: e["detail"].update(status="EXPLODED"), "unknown status"),
        (lambda e: e.update(detail="{not json"), "malformed detail"),
        (lambda e: e.update(detail=None), "null detail"),
    ],
)
def test_bad_events_are_logged_and_ignored(aws, stack, monkeypatch, mutate, why):
    ev = copy.deepcopy(load_event("batch-array-child-succeeded.json"))
    mutate(ev)
    assert deliver_job_event(stack, ev, monkeypatch)["status"] == "ignored", why


def test_foreign_and_unknown_jobs_are_ignored(aws, stack, monkeypatch):
    out = deliver_job_event(stack, load_event("batch-foreign-job-succeeded.json"), monkeypatch)
    assert out == {**out, "status": "ignored", "reason": "not a Sluice job"}
    unknown = job_event("batch-array-child-running", run_id="nope-0000", job_id="x", queue=_queue(stack), child=0)
    assert deliver_job_event(stack, unknown, monkeypatch)["reason"] == "unknown run"
    other_queue = job_event(
        "batch-array-child-running",
        run_id="nope-0000",
        job_id="x",
        queue="arn:aws:batch:us-east-1:123456789012:job-queue/etl",
        child=0,
    )
    assert deliver_job_event(stack, other_queue, monkeypatch)["reason"] == "not a Sluice job"


def test_racing_invocations_lose_no_count(aws, stack, monkeypatch):
    run_id, job_id = _array_run(aws, stack, monkeypatch, n_shards=8, per_shard=2)
    for i in range(8):
        write_result(aws, stack, run_id, i, processed=2)
    for k, v in stack.env_for("HandleManifestUploadFunction").items():
        monkeypatch.setenv(k, v)
    # Distinct shards finishing at once: a read-modify-write counter would lose increments here.
    # moto does not serialise conditional writes (or transactions) the way DynamoDB does, so each
    # request is made atomic, as DynamoDB's are; duplicates are raced in test_completion_order.
    from sluice.aws import clients as sluice_aws
    from sluice.aws.clients import Clients
    from sluice.control.completion.batch_events import BatchJobStateChangeEvent
    from sluice.control.completion.state_change import handle_job_event
    from sluice.settings import Settings

    clients = Clients(dynamodb=Atomic(sluice_aws.client("dynamodb")))
    settings = Settings.from_env()
    events = [
        BatchJobStateChangeEvent.model_validate(_ev(run_id, job_id, stack, "batch-array-child-succeeded", child=i))
        for i in range(8)
    ]
    errors = []

    def worker(part):
        try:
            for e in part:
                handle_job_event(e.detail, settings=settings, clients=clients)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(events[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    counts = ShardRecords(aws.dynamodb, stack.names["RunsTable"]).counts(run_id)
    assert counts.shards_succeeded == 8 and counts.shards_failed == 0


# ---- property: any order, any duplicates -> same ledger state, exactly one outcome ------------

N_SHARDS = 3


def _all_events():
    evs = [("parent", s) for s in ("batch-array-parent-pending", "batch-array-parent-succeeded")]
    return evs + [(i, s) for i in range(N_SHARDS) for s in CHILD_OK]


@settings(max_examples=examples(10), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.permutations(_all_events()), st.lists(st.integers(0, 4 * N_SHARDS + 1), max_size=6))
def test_any_order_and_duplicates_give_the_same_state_and_one_outcome(monkeypatch, order, dup_positions):
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local
    from tests.conftest import AwsClients, local_template

    with mock_aws(config={"batch": {"use_docker": False}}):
        sluice_aws.reset_clients()
        aws = AwsClients()
        stack = create_local(aws, template=local_template())
        run_id, job_id = _array_run(aws, stack, monkeypatch, n_shards=N_SHARDS, per_shard=4)
        for i in range(N_SHARDS):
            write_result(aws, stack, run_id, i, processed=4)
        seq = list(order) + [order[p % len(order)] for p in dup_positions]
        for who, sample in seq:
            child = None if who == "parent" else who
            deliver_job_event(stack, _ev(run_id, job_id, stack, sample, child=child), monkeypatch)
        ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
        row = ledger.get(run_id)
        shards = sorted(
            (i.shard, i.status, i.seq) for i in ShardRecords(aws.dynamodb, stack.names["RunsTable"]).shard_items(run_id)
        )
        counts = ShardRecords(aws.dynamodb, stack.names["RunsTable"]).counts(run_id)
        outcomes = _outcomes(bus_events(aws, stack))
    assert row.status == "SUCCEEDED" and counts.shards_succeeded == N_SHARDS and row.jobs_done == 1
    assert shards == [(i, "SUCCEEDED", 15) for i in range(N_SHARDS)]
    assert len(outcomes) == 1 and outcomes[0]["detail"]["processed"] == 4 * N_SHARDS
