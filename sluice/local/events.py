"""Real-shaped EventBridge events for the local router (same shape AWS delivers)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sluice.contracts import JobStatus
from sluice.control.policy import retry_strategy
from sluice.local.infra import ACCOUNT


def s3_object_created(
    bucket: str, key: str, *, size: int, etag: str, version_id: str | None, sequencer: str, region: str = "us-east-1"
) -> dict[str, Any]:
    """An S3 "Object Created" event as EventBridge delivers it to a rule target."""
    obj: dict[str, Any] = {"key": key, "size": size, "etag": etag.strip('"'), "sequencer": sequencer}
    if version_id:
        obj["version-id"] = version_id
    detail = {
        "version": "0",
        "bucket": {"name": bucket},
        "object": obj,
        "request-id": uuid.uuid4().hex[:16].upper(),
        "requester": ACCOUNT,
        "source-ip-address": "127.0.0.1",
        "reason": "PutObject",
    }
    return envelope("Object Created", "aws.s3", detail, resources=[f"arn:aws:s3:::{bucket}"], region=region)


def envelope(
    detail_type: str,
    source: str,
    detail: dict[str, Any],
    *,
    resources: list[str],
    region: str,
    time_ms: int | None = None,
) -> dict[str, Any]:
    """The EventBridge envelope AWS wraps every event in."""
    when = datetime.fromtimestamp(time_ms / 1000, UTC) if time_ms is not None else datetime.now(UTC)
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": ACCOUNT,
        "time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": resources,
        "detail": detail,
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
    status: JobStatus,
    run_id: str | None,
    attempts: list[dict[str, Any]] | None = None,
    status_reason: str | None = None,
    exit_code: int | None = None,
    array_index: int | None = None,
    array_size: int | None = None,
    node_index: int | None = None,
    num_nodes: int | None = None,
    max_attempts: int = 3,
    region: str = "us-east-1",
    now_ms: int | None = None,
) -> dict[str, Any]:
    """A "Batch Job State Change" event in the shape AWS Batch emits (container jobs)."""
    status = JobStatus(status)
    now_ms = now_ms or int(datetime.now(UTC).timestamp() * 1000)
    arn = f"arn:aws:batch:{region}:{ACCOUNT}:job/{job_id}"
    detail: dict[str, Any] = {
        "jobArn": arn,
        "jobName": job_name,
        "jobId": job_id,
        "jobQueue": job_queue,
        "status": status.value,
        "attempts": attempts or [],
        "createdAt": now_ms - 60_000,
        "retryStrategy": retry_strategy(max_attempts),
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
    if status in (JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED):
        detail["startedAt"] = now_ms - 30_000
    if status.terminal:
        detail["stoppedAt"] = now_ms
    detail.update(_job_shape(exit_code, array_index, array_size, node_index, num_nodes))
    return envelope("Batch Job State Change", "aws.batch", detail, resources=[arn], region=region, time_ms=now_ms)


def _job_shape(
    exit_code: int | None,
    array_index: int | None,
    array_size: int | None,
    node_index: int | None,
    num_nodes: int | None,
) -> dict[str, Any]:
    """The detail's container, arrayProperties and node fields: plain, array parent/child, MNP job/node."""
    out: dict[str, Any] = {}
    if node_index is None and num_nodes is None:
        container: dict[str, Any] = {
            "image": "sluice-worker:latest",
            "command": ["python", "-m", "gpu_worker"],
            "environment": [],
            "resourceRequirements": [{"value": "1", "type": "GPU"}],
        }
        if exit_code is not None:
            container["exitCode"] = exit_code
        out["container"] = container
    if array_index is not None:
        out["arrayProperties"] = {"index": array_index}
    elif array_size is not None:
        out["arrayProperties"] = {"size": array_size, "statusSummary": {}}
    if node_index is not None:
        out["nodeDetails"] = {"nodeIndex": node_index, "isMainNode": node_index == 0}
        out["container"] = {"exitCode": exit_code} if exit_code is not None else {}
    elif num_nodes is not None:
        out["nodeProperties"] = {"numNodes": num_nodes, "mainNode": 0, "nodeRangeProperties": []}
    return out


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
