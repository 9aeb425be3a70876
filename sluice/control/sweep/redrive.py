"""Redrive an upload stranded in PLANNING: the sweep hands it to the manifest function again.

A manifest invocation that died past its claim's lease (the function's timeout), or whose
retried deliveries all failed after it released the claim, leaves the run PLANNING (or
RELEASED) with no one to finish it. The sweep (sluice.control.sweep.reconcile) re-invokes the
manifest function asynchronously with the upload's own "Object Created" event, rebuilt from
the RUN item: the function plans with its own role, memory, timeout and settings, exactly as
the first delivery would, and its dead-letter queue catches a redrive that fails again.

Idempotent: the redriven invocation must win the conditional claim (a second redrive, or the
original invocation resuming, finds the claim held and stops); jobs are adopted by their
deterministic names; the PLANNING -> SUBMITTED transition is conditional, so one "Run
Submitted" goes out, and an invocation that submitted jobs but lost that transition withdraws
the jobs the recorded submission does not name (sluice.control.submit).
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.contracts.status import RunStatus
from sluice.control.context import Context
from sluice.control.table.items import RunItem, UploadItem
from sluice.log import logger

# A RELEASED run waits for the manifest function's own retried delivery (EventInvokeConfig:
# 2 retries, minutes apart); the sweep redrives it only once those are surely over.
RELEASED_GRACE_S = 900


def stranded(run: RunItem, now: float) -> bool:
    """PLANNING past its claim's lease, or RELEASED and not claimed again within the grace."""
    if run.status == RunStatus.PLANNING:
        return (run.lease_until or 0) < now
    return run.status == RunStatus.RELEASED and run.updated_at + RELEASED_GRACE_S < now


def upload_event(upload: UploadItem, region: str) -> dict[str, Any]:
    """The upload's S3 "Object Created" event as EventBridge delivers it to the manifest function."""
    obj: dict[str, Any] = {"key": upload.key, "etag": upload.etag, "sequencer": upload.sequencer}
    if upload.version_id:
        obj["version-id"] = upload.version_id
    detail = {
        "version": "0",
        "bucket": {"name": upload.bucket},
        "object": {k: v for k, v in obj.items() if v is not None},
        "request-id": "sluice-redrive",
        "requester": "sluice-reconcile",
        "reason": "PutObject",
    }
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": "000000000000",
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:s3:::{upload.bucket}"],
        "detail": detail,
    }


def redrive_planning(ctx: Context, run: RunItem, *, now: float | None = None) -> str | None:
    """Re-invoke the manifest function for a stranded upload; what the sweep did, or None if not stranded."""
    now = time.time() if now is None else now
    if not stranded(run, now):
        return None
    function = ctx.settings.manifest_function
    if run.upload is None or not function:
        logger.warning("upload stranded in planning, nothing to redrive through", extra={"run_id": run.run_id})
        return "stranded in planning (no upload or manifest function: redrive the manifest dead-letter queue)"
    client = ctx.clients.lambda_
    payload = upload_event(run.upload, client.meta.region_name or "us-east-1")
    try:
        client.invoke(FunctionName=function, InvocationType="Event", Payload=json.dumps(payload).encode())
    except (ClientError, BotoCoreError) as exc:  # the next sweep tries again
        logger.warning("redrive failed", extra={"run_id": run.run_id, "error": str(exc)[:500]})
        return f"stranded in planning; redrive failed: {str(exc)[:200]}"
    logger.warning("upload stranded in planning: redriven", extra={"run_id": run.run_id, "function": function})
    return f"stranded in planning: redriven to {function}"


__all__ = ["RELEASED_GRACE_S", "redrive_planning", "stranded", "upload_event"]
