"""Real-shaped EventBridge events for the local router (same shape AWS delivers)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sluice.infra import ACCOUNT


def s3_object_created(
    bucket: str, key: str, *, size: int, etag: str, version_id: str | None, sequencer: str, region: str = "us-east-1"
) -> dict[str, Any]:
    """An S3 "Object Created" event as EventBridge delivers it to a rule target."""
    obj: dict[str, Any] = {"key": key, "size": size, "etag": etag.strip('"'), "sequencer": sequencer}
    if version_id:
        obj["version-id"] = version_id
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": obj,
            "request-id": uuid.uuid4().hex[:16].upper(),
            "requester": ACCOUNT,
            "source-ip-address": "127.0.0.1",
            "reason": "PutObject",
        },
    }


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge pattern matching for the subset Sluice's rules use (values, prefix)."""
    for field, want in pattern.items():
        have = event.get(field)
        if isinstance(want, dict):
            if not isinstance(have, dict) or not matches(want, have):
                return False
            continue
        if not any(_match_one(w, have) for w in want):
            return False
    return True


def _match_one(want: Any, have: Any) -> bool:
    if isinstance(want, dict):
        if "prefix" in want:
            return isinstance(have, str) and have.startswith(want["prefix"])
        if "anything-but" in want:
            bad = want["anything-but"]
            return have not in (bad if isinstance(bad, list) else [bad])
        if "exists" in want:
            return (have is not None) == bool(want["exists"])
        return False
    return bool(want == have)


def batch_job_state_change(
    *,
    job_id: str,
    job_name: str,
    job_queue: str,
    status: str,
    run_id: str | None,
    attempts: list[dict[str, Any]] | None = None,
    status_reason: str | None = None,
    exit_code: int | None = None,
    array_index: int | None = None,
    array_size: int | None = None,
    node_index: int | None = None,
    num_nodes: int | None = None,
    region: str = "us-east-1",
    now_ms: int | None = None,
) -> dict[str, Any]:
    """A "Batch Job State Change" event in the shape AWS Batch emits (container jobs)."""
    now_ms = now_ms or int(datetime.now(UTC).timestamp() * 1000)
    arn = f"arn:aws:batch:{region}:{ACCOUNT}:job/{job_id}"
    detail: dict[str, Any] = {
        "jobArn": arn,
        "jobName": job_name,
        "jobId": job_id,
        "jobQueue": job_queue,
        "status": status,
        "attempts": attempts or [],
        "createdAt": now_ms - 60_000,
        "retryStrategy": {
            "attempts": 3,
            "evaluateOnExit": [{"onStatusReason": "Host EC2*", "action": "RETRY"}, {"onReason": "*", "action": "EXIT"}],
        },
        "dependsOn": [],
        "jobDefinition": f"arn:aws:batch:{region}:{ACCOUNT}:job-definition/sluice-worker:1",
        "parameters": {},
        "timeout": {"attemptDurationSeconds": 21600},
        "tags": {"sluice:run-id": run_id} if run_id else {},
        "propagateTags": True,
        "platformCapabilities": ["EC2"],
        "eksAttempts": [],
    }
    if status_reason:
        detail["statusReason"] = status_reason
    if status in ("RUNNING", "SUCCEEDED", "FAILED"):
        detail["startedAt"] = now_ms - 30_000
    if status in ("SUCCEEDED", "FAILED"):
        detail["stoppedAt"] = now_ms
    if node_index is None and num_nodes is None:
        container: dict[str, Any] = {
            "image": "sluice-worker:latest",
            "command": ["python", "-m", "gpu_worker"],
            "environment": [],
            "resourceRequirements": [{"value": "1", "type": "GPU"}],
        }
        if exit_code is not None:
            container["exitCode"] = exit_code
        detail["container"] = container
    if array_index is not None:
        detail["arrayProperties"] = {"index": array_index}
    elif array_size is not None:
        detail["arrayProperties"] = {"size": array_size, "statusSummary": {}}
    if node_index is not None:
        detail["nodeDetails"] = {"nodeIndex": node_index, "isMainNode": node_index == 0}
        detail["container"] = {"exitCode": exit_code} if exit_code is not None else {}
    elif num_nodes is not None:
        detail["nodeProperties"] = {"numNodes": num_nodes, "mainNode": 0, "nodeRangeProperties": []}
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Batch Job State Change",
        "source": "aws.batch",
        "account": ACCOUNT,
        "time": datetime.fromtimestamp(now_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [arn],
        "detail": detail,
    }


def attempt(started_ms: int, stopped_ms: int | None, exit_code: int | None, reason: str) -> dict[str, Any]:
    """One entry of a Batch job's attempts[] (stoppedAt absent while it runs)."""
    a: dict[str, Any] = {
        "container": {
            "taskArn": "arn:aws:ecs:us-east-1:123456789012:task/sluice/0",
            "logStreamName": "sluice-worker/default/0",
        },
        "startedAt": started_ms,
        "statusReason": reason,
    }
    if stopped_ms is not None:
        a["stoppedAt"] = stopped_ms
    if exit_code is not None:
        a["container"]["exitCode"] = exit_code
    return a
