"""Helpers for completion tests: a submitted run, worker outputs, real-shaped Batch events."""

from __future__ import annotations

import copy
import json
from typing import Any

from sluice.local.lambda_context import LocalContext
from tests.conftest import load_event
from tests.integration.helpers import INPUT_BUCKET, invoke_manifest_handler

FUNCTION = "HandleJobStateChangeFunction"


def submit_run(
    aws: Any,
    stack: Any,
    monkeypatch: Any,
    *,
    n_keys: int = 40,
    keys_per_shard: int = 10,
    mode: str = "array",
    nodes: int = 2,
    name: str = "run",
) -> dict[str, Any]:
    """A real run submitted through the manifest handler; returns its outcome dict."""
    if INPUT_BUCKET not in [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]:
        aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    job: dict[str, Any] = {"mode": mode, "keys_per_shard": keys_per_shard, "nodes": nodes}
    body = {
        "version": 1,
        "input": {"keys": [f"img/{i:05d}.jpg" for i in range(n_keys)], "bucket": INPUT_BUCKET},
        "job": job,
    }
    out = invoke_manifest_handler(aws, stack, f"manifests/{name}.json", json.dumps(body), monkeypatch)
    assert out["status"] == "submitted", out
    return out


def write_result(
    aws: Any,
    stack: Any,
    run_id: str,
    shard: int,
    processed: int,
    failures: list[tuple[str, str]] = (),
    attempt: int = 1,
) -> None:  # type: ignore[assignment]
    """What a worker leaves behind for a shard: result.json and failures/<i>.jsonl."""
    control = stack.names["ControlBucket"]
    by_reason: dict[str, int] = {}
    for _, reason in failures:
        by_reason[reason] = by_reason.get(reason, 0) + 1
    result = {
        "shard": shard,
        "processed": processed,
        "failed": len(failures),
        "seconds": 1.5,
        "attempt": attempt,
        "failed_by_reason": by_reason,
    }
    aws.s3.put_object(Bucket=control, Key=f"runs/{run_id}/shards/{shard}.result.json", Body=json.dumps(result))
    if failures:
        lines = "".join(json.dumps({"key": k, "reason": r, "attempt": attempt}) + "\n" for k, r in failures)
        aws.s3.put_object(Bucket=control, Key=f"runs/{run_id}/failures/{shard}.jsonl", Body=lines.encode())


def job_event(
    sample: str,
    *,
    run_id: str,
    job_id: str,
    queue: str,
    job_index: int = 0,
    child: int | None = None,
    node: int | None = None,
) -> dict[str, Any]:
    """events/<sample>.json re-pointed at this run's job (and child index or node)."""
    ev = copy.deepcopy(load_event(f"{sample}.json"))
    d = ev["detail"]
    jid = (
        job_id if child is None and node is None else (f"{job_id}:{child}" if child is not None else f"{job_id}#{node}")
    )
    d["jobId"] = jid
    d["jobArn"] = f"arn:aws:batch:us-east-1:123456789012:job/{jid}"
    ev["resources"] = [d["jobArn"]]
    d["jobName"] = f"sluice-{run_id}-{job_index}"
    d["tags"] = {"sluice:run-id": run_id}
    d["jobQueue"] = queue
    if child is not None:
        d["arrayProperties"] = {"index": child}
    if node is not None:
        d["nodeDetails"] = {"nodeIndex": node, "isMainNode": node == 0}
    return ev


def deliver_job_event(stack: Any, event: dict[str, Any], monkeypatch: Any) -> dict[str, Any]:
    fn = FUNCTION if FUNCTION in stack.function_env else "HandleManifestUploadFunction"
    for k, v in stack.env_for(fn).items():
        monkeypatch.setenv(k, v)
    from functions.handle_job_state_change import handler

    return handler(event, LocalContext(function_name=FUNCTION))
