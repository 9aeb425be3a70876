"""Helpers for coordinator integration tests: upload, invoke the real handler, read results."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.events import parse_detail
from sluice.contracts.status import JobStatus
from sluice.local.emulator.lambda_context import LocalContext
from sluice.paths import RunPaths
from sluice.shards import ShardReader
from tests.conftest import load_event

INPUT_BUCKET = "images-in"
STAND_IN = "builtin:reference-cnn"  # named: a deployed run refuses a manifest without model.uri


def put_manifest(aws: Any, stack: Any, key: str, body: bytes | str) -> dict[str, Any]:
    """Upload body to `key` (manifests/...) in the control bucket; returns the upload's real-shaped S3 event.

    The one upload helper of the coordinator tests: deliver the event now (invoke_manifest_handler),
    later, several times, or to a handler set up to fail.
    """
    control = stack.names["ControlBucket"]
    data = body.encode() if isinstance(body, str) else body
    put = aws.s3.put_object(Bucket=control, Key=key, Body=data)
    return object_created_event(control, key, put, len(data))


# A stack that names the model of key lists and inventory drops (which cannot name one themselves).
DEFAULT_MODEL_ENV = {"SLUICE_DEFAULT_MODEL_URI": STAND_IN}


def invoke_manifest_handler(
    aws: Any, stack: Any, key: str, body: bytes | str, monkeypatch: Any, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Upload body to `key` and deliver the real-shaped S3 event to the real handler."""
    return deliver(stack, put_manifest(aws, stack, key, body), monkeypatch, extra_env)


def keys_manifest(n_keys: int, job: dict[str, Any] | None = None) -> str:
    """A manifest of n_keys keys img/00000.jpg... in INPUT_BUCKET (with `job` when given), on the named stand-in."""
    body: dict[str, Any] = {
        "version": 1,
        "input": {"keys": [f"img/{i:05d}.jpg" for i in range(n_keys)], "bucket": INPUT_BUCKET},
        "model": {"uri": STAND_IN},
    }
    if job is not None:
        body["job"] = job
    return json.dumps(body)


def submit_keys(
    aws: Any,
    stack: Any,
    monkeypatch: Any,
    name: str,
    *,
    n_keys: int,
    job: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """keys_manifest(n_keys, job) uploaded as manifests/<name>.json and delivered; the handler's outcome."""
    if INPUT_BUCKET not in [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]:
        aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    return invoke_manifest_handler(
        aws, stack, f"manifests/{name}.json", keys_manifest(n_keys, job), monkeypatch, extra_env
    )


def object_created_event(bucket: str, key: str, put: dict[str, Any], size: int) -> dict[str, Any]:
    event = copy.deepcopy(load_event("s3-object-created-manifest.json"))
    event["detail"]["bucket"]["name"] = bucket
    event["resources"] = [f"arn:aws:s3:::{bucket}"]
    obj = event["detail"]["object"]
    obj.update(key=key, size=size, etag=put["ETag"].strip('"'))
    if put.get("VersionId"):
        obj["version-id"] = put["VersionId"]
    else:
        obj.pop("version-id", None)
    return event


def deliver(
    stack: Any, event: dict[str, Any], monkeypatch: Any, extra_env: dict[str, str] | None = None
) -> dict[str, Any]:
    for k, v in {**stack.env_for("HandleManifestUploadFunction"), **(extra_env or {})}.items():
        monkeypatch.setenv(k, v)
    from functions.handle_manifest_upload import handler

    return handler(event, LocalContext(function_name="HandleManifestUploadFunction"))


def bus_events(aws: Any, stack: Any) -> list[dict[str, Any]]:
    """Every event published on the sluice bus so far (via the SQS observer target).

    Each detail is checked against its contract (sluice.contracts), so a test that reads an
    event also proves it is what subscribers were promised.
    """
    out = []
    while True:
        resp = aws.sqs.receive_message(QueueUrl=stack.observer_queue_url, MaxNumberOfMessages=10)
        msgs = resp.get("Messages", [])
        if not msgs:
            return out
        for m in msgs:
            event = json.loads(m["Body"])
            parse_detail(event["detail-type"], event["detail"])
            out.append(event)
            aws.sqs.delete_message(QueueUrl=stack.observer_queue_url, ReceiptHandle=m["ReceiptHandle"])


def run_objects(aws: Any, stack: Any) -> list[str]:
    resp = aws.s3.list_objects_v2(Bucket=stack.names["ControlBucket"], Prefix="runs/")
    return [o["Key"] for o in resp.get("Contents", [])]


def shard_pairs(aws: Any, stack: Any, run_id: str) -> list[list[tuple[str, str]]]:
    """Decoded keys of every shard of a run, in shard order."""
    paths = RunPaths.in_bucket(stack.names["ControlBucket"], run_id)
    plan = json.loads(_get(aws, paths.plan))
    return [ShardReader(_get(aws, paths.shard(i))).pairs() for i in range(plan["n_shards"])]


def _get(aws: Any, uri: str) -> bytes:
    bucket, key = parse_s3_uri(uri)
    return bytes(aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def all_jobs(aws: Any) -> list[dict[str, Any]]:
    jobs = []
    for q in aws.batch.describe_job_queues()["jobQueues"]:
        for status in JobStatus:
            jobs += aws.batch.list_jobs(jobQueue=q["jobQueueArn"], jobStatus=status)["jobSummaryList"]
    uniq = {j["jobId"]: j for j in jobs if ":" not in j["jobId"]}  # array children are "<parent>:<i>"
    return aws.batch.describe_jobs(jobs=list(uniq))["jobs"] if uniq else []


__all__ = [
    "INPUT_BUCKET",
    "STAND_IN",
    "all_jobs",
    "bus_events",
    "deliver",
    "invoke_manifest_handler",
    "keys_manifest",
    "object_created_event",
    "put_manifest",
    "run_objects",
    "shard_pairs",
    "submit_keys",
]
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
