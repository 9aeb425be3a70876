"""`sluice local run`: a run on a local moto server, through the real handler.

Today this covers the coordinator end to end: resources from template.yaml, a manifest
upload, the real S3 "Object Created" event routed to the real manifest handler, shards
and plan.json in S3, jobs in (moto) Batch, the ledger row and the "Run Submitted" event.
Running the submitted jobs on local worker processes is the local-executor stage.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Any

from sluice.local.events import matches, s3_object_created
from sluice.local.lambda_context import LocalContext
from sluice.local.server import FAKE_CREDENTIALS, MotoServer

DEMO_BUCKET = "sluice-demo-images"


def _clients() -> Any:
    import boto3

    from sluice.aws import reset_clients

    reset_clients()
    session = boto3.session.Session(region_name=os.environ["AWS_DEFAULT_REGION"])

    class _C:
        pass

    c = _C()
    for svc in ("s3", "dynamodb", "events", "sqs", "batch", "iam"):
        setattr(c, svc, session.client(svc))
    return c


def demo_keys(n: int) -> list[str]:
    """N deterministic demo keys in the layout of a real image bucket (plus 2% duplicates)."""
    keys = [f"demo/{i // 100:04d}/img-{i:06d}.jpg" for i in range(n)]
    return keys + keys[: n // 50]


def _invoke(stack: Any, function: str, event: dict[str, Any]) -> Any:
    """Call the real handler with the environment the template gives it."""
    env = stack.env_for(function)
    env["POWERTOOLS_LOG_LEVEL"] = os.environ.get("SLUICE_LOCAL_LOG_LEVEL", "WARNING")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        module, name = stack.function_handlers[function].rsplit(".", 1)
        handler = getattr(importlib.import_module(module), name)
        return handler(event, LocalContext(function_name=function))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _route(stack: Any, event: dict[str, Any]) -> list[Any]:
    """Deliver an event to every function whose template rule matches it."""
    return [
        _invoke(stack, stack.rule_function[rule], event)
        for rule, pattern in stack.rule_patterns.items()
        if matches(pattern, event)
    ]


def run_local(args: argparse.Namespace) -> int:
    """Start moto, create the stack, upload a manifest, route the event, report."""
    from sluice.infra import create_local

    started = time.perf_counter()
    os.environ.update({k: os.environ.get(k, v) for k, v in FAKE_CREDENTIALS.items()})
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    with MotoServer() as server:
        os.environ["AWS_ENDPOINT_URL"] = server.endpoint
        c = _clients()
        stack = create_local(c)
        control = stack.names["ControlBucket"]
        manifest: dict[str, Any] = {"version": 1, "input": {}}
        if args.manifest:
            with open(args.manifest, "rb") as fh:
                body = fh.read()
            name = os.path.basename(args.manifest)
        else:
            n = 200 if args.demo is None else args.demo
            c.s3.create_bucket(Bucket=DEMO_BUCKET)
            c.s3.put_object(Bucket=DEMO_BUCKET, Key="lists/demo.txt", Body="\n".join(demo_keys(n)).encode())
            manifest["input"] = {"key_list": f"s3://{DEMO_BUCKET}/lists/demo.txt", "bucket": DEMO_BUCKET}
            job: dict[str, Any] = {"mode": args.mode or "array"}
            if args.shards:
                job["keys_per_shard"] = max(1, -(-n // args.shards))
            elif job["mode"] == "array":
                job["keys_per_shard"] = max(1, -(-n // 4))
            if args.nodes:
                job["nodes"] = args.nodes
            manifest["job"] = job
            body, name = json.dumps(manifest, indent=2).encode(), "demo.json"
        key = f"manifests/{name}"
        put = c.s3.put_object(Bucket=control, Key=key, Body=body)
        event = s3_object_created(
            control,
            key,
            size=len(body),
            etag=put["ETag"],
            version_id=put.get("VersionId"),
            sequencer=f"{time.time_ns():X}",
        )
        results = _route(stack, event)
        outcome = results[0] if results else {"status": "ignored"}
        summary = _summary(c, stack, outcome, time.perf_counter() - started, server.endpoint)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0 if outcome.get("status") == "submitted" else 1


def _summary(c: Any, stack: Any, outcome: dict[str, Any], seconds: float, endpoint: str) -> dict[str, Any]:
    from sluice.ledger import Ledger
    from sluice.shards import ShardReader

    out: dict[str, Any] = {"outcome": outcome.get("status"), "run_id": outcome.get("run_id"), "endpoint": endpoint}
    if outcome.get("status") == "rejected":
        out["reasons"] = outcome.get("reasons", [])
    if outcome.get("run_id"):
        row = Ledger(c.dynamodb, stack.names["RunsTable"]).get(outcome["run_id"]) or {}
        out["ledger_status"] = row.get("status")
    if outcome.get("status") == "submitted":
        control = stack.names["ControlBucket"]
        jobs = c.batch.describe_jobs(jobs=outcome["job_ids"])["jobs"]
        out.update(
            unique_keys=outcome["total_keys"],
            duplicates_removed=outcome["duplicates"],
            shards=outcome["shards"],
            plan=outcome["plan_uri"],
            jobs=[
                {
                    "id": j["jobId"],
                    "name": j["jobName"],
                    "array_size": j.get("arrayProperties", {}).get("size"),
                    "queue": j["jobQueue"].rsplit("/", 1)[-1],
                }
                for j in jobs
            ],
        )
        first = c.s3.get_object(Bucket=control, Key=f"runs/{outcome['run_id']}/shards/0.shard")["Body"].read()
        reader = ShardReader(first)
        out["shard_0"] = {"keys": reader.n_keys, "bytes": len(first), "first_keys": list(reader.uris(0, 3))}
    msgs = c.sqs.receive_message(QueueUrl=stack.observer_queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    out["events"] = [json.loads(m["Body"])["detail-type"] for m in msgs.get("Messages", [])]
    out["seconds"] = round(seconds, 2)
    return out


def _print(s: dict[str, Any]) -> None:
    w = sys.stdout.write
    w(f"\nSluice local run  ({s['seconds']} s, moto at {s['endpoint']}, stopped)\n")
    w(f"  run id        {s['run_id']}\n  outcome       {s['outcome']}   ledger: {s.get('ledger_status')}\n")
    for r in s.get("reasons", []):
        w(f"  reason        {r}\n")
    if s["outcome"] == "submitted":
        w(f"  keys          {s['unique_keys']} unique ({s['duplicates_removed']} duplicates removed)\n")
        w(f"  shards        {s['shards']}   plan: {s['plan']}\n")
        for j in s["jobs"]:
            w(f"  batch job     {j['name']}  queue={j['queue']}  array size={j['array_size']}\n")
        sh = s["shard_0"]
        w(f"  shard 0       {sh['keys']} keys in {sh['bytes']} bytes; first: {', '.join(sh['first_keys'])}\n")
    w(f"  events        {', '.join(s['events']) or '(none)'}\n")
