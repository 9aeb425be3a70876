"""Real-shaped EventBridge events for the local router (same shape AWS delivers)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluice.contracts.status import JobStatus
from sluice.control.policy import retry_strategy
from sluice.local.emulator.template import ACCOUNT

REGION = "us-east-1"  # the local stack's region (sluice.local.emulator.server.FAKE_CREDENTIALS)


def s3_object_created(
    bucket: str, key: str, *, size: int, etag: str, version_id: str | None, sequencer: str
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
    return envelope("Object Created", "aws.s3", detail, resources=[f"arn:aws:s3:::{bucket}"], region=REGION)


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


@dataclass(frozen=True)
class JobChange:
    """What a "Batch Job State Change" event says about one job, array child or MNP node."""

    job_id: str
    job_name: str
    job_queue: str
    status: JobStatus
    run_id: str | None
    attempts: list[dict[str, Any]] | None = None
    status_reason: str | None = None
    exit_code: int | None = None
    array_index: int | None = None  # an array child
    array_size: int | None = None  # an array parent
    node_index: int | None = None  # an MNP node
    num_nodes: int | None = None  # an MNP job
    max_attempts: int = 3
    region: str = REGION
    now_ms: int | None = None  # default: now


def batch_job_state_change(change: JobChange) -> dict[str, Any]:
    """A "Batch Job State Change" event in the shape AWS Batch emits (container jobs)."""
    c = change
    status = JobStatus(c.status)
    now_ms = c.now_ms or int(datetime.now(UTC).timestamp() * 1000)
    arn = f"arn:aws:batch:{c.region}:{ACCOUNT}:job/{c.job_id}"
    detail: dict[str, Any] = {
        "jobArn": arn,
        "jobName": c.job_name,
        "jobId": c.job_id,
        "jobQueue": c.job_queue,
        "status": status.value,
        "attempts": c.attempts or [],
        "createdAt": now_ms - 60_000,
        "retryStrategy": retry_strategy(c.max_attempts),
        "dependsOn": [],
        "jobDefinition": f"arn:aws:batch:{c.region}:{ACCOUNT}:job-definition/sluice-worker:1",
        "parameters": {},
        "timeout": {"attemptDurationSeconds": 21600},
        "tags": {"sluice:run-id": c.run_id} if c.run_id else {},
        "propagateTags": True,
        "platformCapabilities": ["EC2"],
        "eksAttempts": [],
    }
    if c.status_reason:
        detail["statusReason"] = c.status_reason
    if status in (JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.FAILED):
        detail["startedAt"] = now_ms - 30_000
    if status.terminal:
        detail["stoppedAt"] = now_ms
    detail.update(_job_shape(c))
    return envelope("Batch Job State Change", "aws.batch", detail, resources=[arn], region=c.region, time_ms=now_ms)


def _job_shape(c: JobChange) -> dict[str, Any]:
    """The detail's container, arrayProperties and node fields: plain, array parent/child, MNP job/node."""
    out: dict[str, Any] = {}
    if c.node_index is None and c.num_nodes is None:
        container: dict[str, Any] = {
            "image": "sluice-worker:latest",
            "command": ["python", "-m", "gpu_worker"],
            "environment": [],
            "resourceRequirements": [{"value": "1", "type": "GPU"}],
        }
        if c.exit_code is not None:
            container["exitCode"] = c.exit_code
        out["container"] = container
    if c.array_index is not None:
        out["arrayProperties"] = {"index": c.array_index}
    elif c.array_size is not None:
        out["arrayProperties"] = {"size": c.array_size, "statusSummary": {}}
    if c.node_index is not None:
        out["nodeDetails"] = {"nodeIndex": c.node_index, "isMainNode": c.node_index == 0}
        out["container"] = {"exitCode": c.exit_code} if c.exit_code is not None else {}
    elif c.num_nodes is not None:
        out["nodeProperties"] = {"numNodes": c.num_nodes, "mainNode": 0, "nodeRangeProperties": []}
    return out


def attempt(
    started_ms: int, stopped_ms: int | None, exit_code: int | None, reason: str, said: str | None = None
) -> dict[str, Any]:
    """One entry of a Batch job's attempts[] (stoppedAt absent while it runs; `said`: container.reason)."""
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
    if said:
        a["container"]["reason"] = said[:255]  # Batch's container.reason holds at most 255 characters
    return a
