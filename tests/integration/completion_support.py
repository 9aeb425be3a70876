"""Helpers for completion tests: a submitted run, worker outputs, real-shaped Batch events."""

from __future__ import annotations

import copy
import threading
from typing import Any

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.results import FailureLine, ShardResult, over_threshold
from sluice.contracts.status import TRANSIENT_FAILURE_REASONS, FailureReason
from sluice.local.emulator.lambda_context import LocalContext
from sluice.paths import RunPaths
from tests.conftest import load_event
from tests.integration.helpers import submit_keys

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
    job = {"mode": mode, "keys_per_shard": keys_per_shard, "nodes": nodes}
    out = submit_keys(aws, stack, monkeypatch, name, n_keys=n_keys, job=job)
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
    max_failed_fraction: float = 0.5,
    device: str = "cpu",
    world: int = 1,
    seconds: float = 1.5,
    parts: int | None = None,
    media_s: float = 0.0,
) -> None:  # type: ignore[assignment]
    """What a worker leaves behind for a shard: result.json and failures/<i>.jsonl (the real contracts)."""
    paths = RunPaths.in_bucket(stack.names["ControlBucket"], run_id)
    by_reason: dict[FailureReason, int] = {}
    for _, reason in failures:
        by_reason[FailureReason(reason)] = by_reason.get(FailureReason(reason), 0) + 1
    n_keys = processed + len(failures)
    transient = sum(1 for _, r in failures if FailureReason(r) in TRANSIENT_FAILURE_REASONS)
    fraction = round((len(failures) - transient) / n_keys, 6) if n_keys else 0.0
    result = ShardResult(
        run_id=run_id,
        shard=shard,
        node=shard,
        attempt=attempt,
        kind="array",
        device=device,
        world=world,
        seconds=seconds,
        pipeline_seconds=1.0,
        pipeline_window=[1_700_000_000.0, 1_700_000_001.0],
        resumed_chunks=0,
        stats={"images": float(processed)},
        n_keys=n_keys,
        processed=processed,
        failed=len(failures),
        failed_transient=transient,
        failed_fraction=fraction,
        max_failed_fraction=max_failed_fraction,
        ok=fraction <= max_failed_fraction,
        failed_by_reason=by_reason,
        chunks=1,
        parts=processed if parts is None else parts,
        media_s=media_s,
    )
    if not result.ok:  # the worker's one-line verdict (gpu_worker.output.sink)
        data = {str(r): n for r, n in by_reason.items() if r not in TRANSIENT_FAILURE_REASONS}
        result.reason = over_threshold(len(failures) - transient, n_keys, fraction, max_failed_fraction, data)
    _put(aws, paths.result(shard), result.model_dump_json().encode())
    if failures:
        lines = [FailureLine(key=k, reason=FailureReason(r), attempt=attempt) for k, r in failures]
        _put(aws, paths.failures(shard), "".join(line.model_dump_json() + "\n" for line in lines).encode())


def _put(aws: Any, uri: str, body: bytes) -> None:
    bucket, key = parse_s3_uri(uri)
    aws.s3.put_object(Bucket=bucket, Key=key, Body=body)


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


class Atomic:
    """moto's DynamoDB does not serialise conditional writes: one request at a time, as DynamoDB is atomic."""

    def __init__(self, client: Any) -> None:
        self._client, self._lock = client, threading.Lock()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._client, name)
        if not callable(fn):
            return fn

        def call(*a: Any, **kw: Any) -> Any:
            with self._lock:
                return fn(*a, **kw)

        return call
