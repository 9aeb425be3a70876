"""Submission is idempotent and its announcement lossless, whatever step the Lambda dies after.

Faults are injected at the AWS boundary: a botocore hook on the real (moto) client raises
right after a call succeeded, as a Lambda that dies or times out there would see it. A
"kill" also leaves the claim as a dead Lambda leaves it (PLANNING, lease expired later); a
"raise" lets the handler release what it can. Then the event is redelivered, as Lambda's
async retries and EventBridge do: one set of Batch jobs, the run SUBMITTED, and "Run
Submitted" published.
"""

from __future__ import annotations

import json

import pytest

from sluice.aws import clients as sluice_aws
from sluice.control.table.ledger import RUN_SK, Ledger
from tests.integration.helpers import INPUT_BUCKET, all_jobs, bus_events, deliver, put_manifest


class Died(Exception):
    """The Lambda died right after this AWS call succeeded."""


# (service, operation): after which successful call the invocation dies.
FAULT_POINTS = [
    ("batch", "SubmitJob"),  # jobs exist, the ledger does not know them
    ("dynamodb", "UpdateItem"),  # SUBMITTED recorded (with its outbox), nothing published
    ("events", "PutEvents"),  # published, the outbox not cleared
]


def _upload(aws, stack):
    keys = [f"img/{i:03d}.jpg" for i in range(30)]
    body = json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"keys": keys, "bucket": INPUT_BUCKET},
            "job": {"keys_per_shard": 10},
        }
    )
    return put_manifest(aws, stack, "manifests/faulty.json", body)


def _die_after(service: str, op: str, nth: int):
    client = sluice_aws.client(service)
    seen = {"n": 0}

    def hook(**_: object) -> None:
        seen["n"] += 1
        if seen["n"] == nth:
            raise Died(f"killed after {op}")

    client.meta.events.register(f"after-call.{service}.{op}", hook, unique_id="die")
    return client


@pytest.mark.parametrize(("service", "op"), FAULT_POINTS)
@pytest.mark.parametrize("kill", [False, True], ids=["raised", "killed"])
def test_redelivery_after_a_fault_submits_once_and_announces(aws, stack, monkeypatch, service, op, kill):
    event = _upload(aws, stack)
    # The first UpdateItem of a delivery is SUBMITTED; the first PutEvents is "Run Submitted".
    client = _die_after(service, op, 1)
    try:
        with pytest.raises(Died):
            deliver(stack, event, monkeypatch)
    finally:
        client.meta.events.unregister(f"after-call.{service}.{op}", unique_id="die")
    table = stack.names["RunsTable"]
    (raw,) = [i for i in aws.dynamodb.scan(TableName=table)["Items"] if i["sk"]["S"] == RUN_SK]
    run_id = raw["pk"]["S"]
    if kill and raw["status"]["S"] in ("PLANNING", "RELEASED"):
        # A dead Lambda releases nothing: its claim stays PLANNING until the lease runs out.
        aws.dynamodb.update_item(
            TableName=table,
            Key={"pk": {"S": run_id}, "sk": {"S": RUN_SK}},
            UpdateExpression="SET #s = :p, lease_until = :past",
            ExpressionAttributeNames={"#s": "status"},
            ExpressionAttributeValues={":p": {"S": "PLANNING"}, ":past": {"N": "1"}},
        )
    if kill and "outbox" in raw and "claimed_until" in raw["outbox"]["M"]:
        # ... and the outbox claim it held runs out the same way.
        aws.dynamodb.update_item(
            TableName=table,
            Key={"pk": {"S": run_id}, "sk": {"S": RUN_SK}},
            UpdateExpression="SET outbox.claimed_until = :past",
            ExpressionAttributeValues={":past": {"N": "1"}},
        )
    first = bus_events(aws, stack)
    for _ in range(2):  # Lambda's async retries
        deliver(stack, event, monkeypatch)
    announced = first + bus_events(aws, stack)
    row = Ledger(aws.dynamodb, table).get(run_id)
    assert row is not None and row.status == "SUBMITTED" and row.outbox is None
    jobs = all_jobs(aws)
    assert len(jobs) == 1 and [j["jobId"] for j in jobs] == row.job_ids  # one set of Batch jobs
    submitted = [e for e in announced if e["detail-type"] == "Run Submitted"]
    assert submitted and all(e["detail"]["job_ids"] == row.job_ids for e in submitted)
    # Exactly once, unless the publisher died between publishing and clearing the outbox.
    assert len(submitted) == (2 if op == "PutEvents" else 1)


def test_a_failed_publish_is_not_hidden_and_is_published_by_the_redelivery(aws, stack, monkeypatch):
    event = _upload(aws, stack)
    client = sluice_aws.client("events")

    def refuse(**_: object) -> None:
        from botocore.exceptions import ClientError

        raise ClientError(
            {"Error": {"Code": "InternalFailure"}, "ResponseMetadata": {"HTTPStatusCode": 500}}, "PutEvents"
        )

    client.meta.events.register("before-call.events.PutEvents", refuse, unique_id="refuse")
    try:
        from sluice.errors import RetriableError

        with pytest.raises(RetriableError, match="InternalFailure"):  # the real error, not the release's
            deliver(stack, event, monkeypatch)
    finally:
        client.meta.events.unregister("before-call.events.PutEvents", unique_id="refuse")
    assert bus_events(aws, stack) == []
    out = deliver(stack, event, monkeypatch)
    assert out["status"] == "duplicate"
    (ev,) = bus_events(aws, stack)
    assert ev["detail-type"] == "Run Submitted" and ev["detail"]["run_id"] == out["run_id"]
    assert len(all_jobs(aws)) == 1
