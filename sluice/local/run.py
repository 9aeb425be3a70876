"""`sluice local run`: the whole pipeline on this machine, against a local AWS emulator.

1. a moto server on 127.0.0.1 (or --endpoint-url), resources created from template.yaml;
2. images uploaded (--images DIR or --demo N), a manifest uploaded under manifests/;
3. the S3 "Object Created" event routed to the real manifest handler (shards, plan, jobs);
4. the local executor runs the submitted Batch jobs as real worker processes and routes the
   "Batch Job State Change" events to the real completion handler;
5. a progress line while it runs, then a summary; output copied to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sluice.local.events import matches, s3_object_created
from sluice.local.lambda_context import LocalContext
from sluice.local.server import FAKE_CREDENTIALS, MotoServer, configure

INPUT_BUCKET = "sluice-local-images"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
FINAL = ("SUCCEEDED", "FAILED", "REJECTED")


class Clients:
    """boto3 clients on the emulator; attribute access like sluice.aws.Clients."""

    s3: Any
    dynamodb: Any
    events: Any
    sqs: Any
    batch: Any
    iam: Any

    def __init__(self) -> None:
        import boto3

        from sluice.aws import reset_clients

        reset_clients()
        session = boto3.session.Session(region_name=os.environ["AWS_DEFAULT_REGION"])
        for svc in ("s3", "dynamodb", "events", "sqs", "batch", "iam"):
            setattr(self, svc, session.client(svc))


class Router:
    """Delivers events to the functions whose template rules match (the real handlers)."""

    def __init__(self, stack: Any) -> None:
        self._stack = stack
        self.delivered = Counter[str]()

    def __call__(self, event: dict[str, Any]) -> list[Any]:
        out = []
        for rule, pattern in self._stack.rule_patterns.items():
            if matches(pattern, event):
                out.append(self._invoke(self._stack.rule_function[rule], event))
                self.delivered[rule] += 1
        return out

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        env = self._stack.env_for(function)
        env["POWERTOOLS_LOG_LEVEL"] = os.environ.get("SLUICE_LOCAL_LOG_LEVEL", "WARNING")
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            module, name = self._stack.function_handlers[function].rsplit(".", 1)
            handler = getattr(importlib.import_module(module), name)
            return handler(event, LocalContext(function_name=function))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _upload_images(c: Any, args: argparse.Namespace) -> tuple[str, int]:
    """Upload --images DIR or --demo N images; returns (key prefix, count)."""
    with contextlib.suppress(c.s3.exceptions.BucketAlreadyOwnedByYou):
        c.s3.create_bucket(Bucket=INPUT_BUCKET)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.images:
        root = Path(args.images)
        if not root.is_dir():
            raise SystemExit(f"sluice: --images {root}: not a directory")
        prefix = f"images/{root.resolve().name}-{stamp}/"
        files = sorted(p for p in root.rglob("*") if p.is_file())
        for p in files:  # subfolders are kept as key prefixes; every file is uploaded (bad ones too)
            c.s3.put_object(Bucket=INPUT_BUCKET, Key=prefix + p.relative_to(root).as_posix(), Body=p.read_bytes())
        if not files:
            raise SystemExit(f"sluice: --images {root}: no files")
        return prefix, len(files)
    from sluice.local.demo import demo_images

    n = 200 if args.demo is None else args.demo
    prefix = f"demo-{stamp}/"
    for key, data in demo_images(n):
        c.s3.put_object(Bucket=INPUT_BUCKET, Key=prefix + key, Body=data)
    return prefix, n


def _manifest(args: argparse.Namespace, prefix: str, count: int) -> tuple[str, bytes]:
    if args.manifest:
        path = Path(args.manifest)
        return path.name, path.read_bytes()
    job: dict[str, Any] = {"mode": args.mode or "array"}
    if job["mode"] == "multinode":
        job["nodes"] = args.nodes or 2
    else:
        shards = args.shards or max(1, min(4, os.cpu_count() or 1))
        job["keys_per_shard"] = max(1, -(-count // shards))
    manifest = {
        "version": 1,
        "name": "local-demo" if args.images is None else "local-images",
        "input": {"prefix": f"s3://{INPUT_BUCKET}/{prefix}"},
        "model": {"uri": "builtin:reference-cnn", "batch_size": 32, "image_size": args.image_size},
        "job": job,
    }
    return "local-run.json", json.dumps(manifest, indent=2).encode()


class Progress:
    """One status line on stderr: shards, images, images/s (from commit markers and the ledger)."""

    def __init__(self, c: Any, enabled: bool) -> None:
        self._c = c
        self._enabled = enabled and sys.stderr.isatty()
        self._seen: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._last = 0.0

    def images_done(self, output_prefix: str) -> int:
        from sluice.s3uri import parse_s3_uri

        bucket, prefix = parse_s3_uri(output_prefix, allow_empty_key=True)
        for page in self._c.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                k = o["Key"]
                if "/_commits/" in k and k.endswith(".json") and k not in self._seen:
                    m = json.loads(self._c.s3.get_object(Bucket=bucket, Key=k)["Body"].read())
                    self._seen[k] = int(m.get("rows", 0)) + len(m.get("failed", []))
        return sum(self._seen.values())

    def show(self, row: dict[str, Any], running: int, force: bool = False) -> None:
        if not self._enabled or (not force and time.monotonic() - self._last < 0.5):
            return
        self._last = time.monotonic()
        total = int(row.get("total_keys") or 0)
        shards = int(row.get("shards") or 0) + sum(int(p["n_shards"]) for p in (row.get("passes") or [])[1:])
        done = int(row.get("shards_succeeded") or 0) + int(row.get("shards_failed") or 0)
        images = self.images_done(str(row["output_prefix"])) if row.get("output_prefix") else 0
        rate = images / max(1e-6, time.monotonic() - self._t0)
        sys.stderr.write(
            f"\r  {row.get('status', ''):<10} shards {done}/{shards}  images {images}/{total}  "
            f"{rate:6.1f} img/s  workers {running}   "
        )
        sys.stderr.flush()

    def end(self) -> None:
        if self._enabled:
            sys.stderr.write("\n")


def run_local(args: argparse.Namespace) -> int:
    """Run the pipeline locally; exit code 0 only when the run succeeded."""
    for k, v in FAKE_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    started = time.monotonic()
    pids: list[int] = []

    def note_pid(pid: int) -> None:
        pids.append(pid)
        if args.pid_file:
            with open(args.pid_file, "a", encoding="ascii") as fh:
                fh.write(f"{pid}\n")

    server: MotoServer | None = None
    prom: Any = None
    executors: list[Any] = []
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    signal.signal(signal.SIGTERM, lambda *_: interrupted.set())
    try:
        if args.endpoint_url:
            endpoint = args.endpoint_url.rstrip("/")
            with contextlib.suppress(OSError):  # moto: Batch without Docker; others have no such API
                configure(endpoint)
        else:
            server = MotoServer().start()
            note_pid(server.pid or 0)
            endpoint = server.endpoint
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        metrics_url = os.environ.get("SLUICE_REMOTE_WRITE_URL", "")
        if not metrics_url and not args.no_prometheus:
            from sluice.local.prometheus import LocalPrometheus

            if LocalPrometheus.available():
                prom = LocalPrometheus().start()
                note_pid(prom.pid or 0)
                metrics_url = prom.write_url
                if not args.json:
                    print(f"sluice: metrics: Prometheus at {prom.url} (remote-write receiver)", file=sys.stderr)
        return _run(args, endpoint, started, note_pid, interrupted, executors.append, metrics_url,
                    prom.url if prom else None)
    except KeyboardInterrupt:
        interrupted.set()
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        for ex in executors:
            n = ex.stop()
            if interrupted.is_set():
                print(f"\nsluice: interrupted: stopped {n} running worker(s)", file=sys.stderr)
        if prom is not None:
            if args.keep and not interrupted.is_set():
                print(f"Prometheus left running at {prom.url} (pid {prom.pid}); "
                      f"sluice metrics RUN_ID --url {prom.url}", file=sys.stderr)
            else:
                prom.stop()
        if server is not None:
            if args.keep and not interrupted.is_set():
                print(
                    f"moto server left running at {server.endpoint} (pid {server.pid}); "
                    f"export AWS_ENDPOINT_URL={server.endpoint} AWS_ACCESS_KEY_ID=sluice-local "
                    "AWS_SECRET_ACCESS_KEY=sluice-local AWS_DEFAULT_REGION=us-east-1",
                    file=sys.stderr,
                )
            else:
                server.stop()
        if interrupted.is_set():
            print("sluice: interrupted: the emulator and all workers are stopped", file=sys.stderr)


def _run(
    args: argparse.Namespace,
    endpoint: str,
    started: float,
    note_pid: Any,
    interrupted: threading.Event,
    register: Any,
    metrics_url: str = "",
    prometheus_url: str | None = None,
) -> int:
    from sluice.infra import create_local
    from sluice.ledger import Ledger
    from sluice.local.executor import LocalExecutor

    c = Clients()
    stack = create_local(c)
    router = Router(stack)
    control = stack.names["ControlBucket"]
    prefix, count = _upload_images(c, args)
    name, body = _manifest(args, prefix, count)
    put = c.s3.put_object(Bucket=control, Key=f"manifests/{name}", Body=body)
    results = router(
        s3_object_created(
            control,
            f"manifests/{name}",
            size=len(body),
            etag=put["ETag"],
            version_id=put.get("VersionId"),
            sequencer=f"{time.time_ns():X}",
        )
    )
    outcome = results[0] if results else {"status": "ignored"}
    ledger = Ledger(c.dynamodb, stack.names["RunsTable"])
    if outcome.get("status") != "submitted":
        summary = {
            "outcome": outcome.get("status"),
            "run_id": outcome.get("run_id"),
            "reasons": outcome.get("reasons", []),
            "endpoint": endpoint,
        }
        _report(args, summary)
        return 1
    run_id = outcome["run_id"]
    worker_env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": os.environ["AWS_DEFAULT_REGION"],
        "SLUICE_WORKER_CPU_RANKS": str(args.ranks),
        "SLUICE_WORKER_DEVICE": os.environ.get("SLUICE_WORKER_DEVICE", "auto"),
        # Several workers share this host: no fixed /metrics port; metrics go by remote write.
        "SLUICE_WORKER_METRICS_PORT": os.environ.get("SLUICE_WORKER_METRICS_PORT", "0"),
    }
    if metrics_url:
        worker_env["SLUICE_REMOTE_WRITE_URL"] = metrics_url
        worker_env.setdefault("SLUICE_WORKER_PUSH_INTERVAL_S", os.environ.get("SLUICE_WORKER_PUSH_INTERVAL_S", "1"))
    log_dir = tempfile.mkdtemp(prefix=f"sluice-{run_id}-logs-")
    executor = LocalExecutor(
        c.batch,
        ledger,
        [stack.names["GpuJobQueue"], stack.names["MnpJobQueue"]],
        lambda e: router(e),
        slots=args.slots or os.cpu_count() or 1,
        worker_env=worker_env,
        log_dir=log_dir,
        on_pid=note_pid,
    )
    register(executor)
    progress = Progress(c, enabled=not args.json)
    if not args.json:
        print(
            f"sluice: run {run_id}: {outcome['total_keys']} images in {outcome['shards']} shard(s) "
            f"({'multinode' if args.mode == 'multinode' else 'array'}); emulator {endpoint}",
            file=sys.stderr,
        )
    row: dict[str, Any] = {}
    while not interrupted.is_set():
        executor.discover()
        executor.step()
        row = ledger.get(run_id) or {}
        progress.show(row, executor.running())
        if row.get("status") in FINAL and executor.idle:
            break
        if executor.idle and row.get("status") not in FINAL and not executor.discover():
            time.sleep(0.2)  # the completion handler may still submit a retry pass
        time.sleep(0.1)
    if interrupted.is_set():
        progress.end()
        return 130
    progress.show(row, 0, force=True)
    progress.end()
    summary = _summary(c, stack, row, time.monotonic() - started, endpoint, log_dir)
    summary["output_dir"] = _copy_output(c, row, args.out, run_id)
    summary["metrics"] = prometheus_url or (metrics_url or None)
    _report(args, summary)
    return 0 if row.get("status") == "SUCCEEDED" else 1


def _summary(c: Any, stack: Any, row: dict[str, Any], seconds: float, endpoint: str, log_dir: str) -> dict[str, Any]:
    from sluice.status import _plain

    row = _plain(row)
    events = []
    while True:
        msgs = c.sqs.receive_message(QueueUrl=stack.observer_queue_url, MaxNumberOfMessages=10).get("Messages", [])
        if not msgs:
            break
        events += [json.loads(m["Body"]) for m in msgs]
        for m in msgs:
            c.sqs.delete_message(QueueUrl=stack.observer_queue_url, ReceiptHandle=m["ReceiptHandle"])
    outcomes = [e["detail"] for e in events if e["detail-type"] in ("Run Succeeded", "Run Failed")]
    final: dict[str, Any] = outcomes[0] if outcomes else {}
    processed = int(final.get("processed", row.get("processed", 0)) or 0)
    failed = int(final.get("failed", row.get("failed_keys", 0)) or 0)
    reasons = _failure_reasons(c, row)
    return {
        "run_id": row.get("run_id"),
        "outcome": {"SUCCEEDED": "succeeded", "FAILED": "failed"}.get(str(row.get("status")), row.get("status")),
        "processed": processed,
        "failed": failed,
        "failed_by_reason": reasons,
        "reason": final.get("reason"),
        "shards": int(row.get("shards", 0)),
        "retry_passes": len(row.get("passes") or [1]) - 1,
        "wall_s": round(seconds, 1),
        "images_per_s": round(processed / seconds, 1) if seconds else 0.0,
        "output_prefix": row.get("output_prefix"),
        "events": [e["detail-type"] for e in events],
        "endpoint": endpoint,
        "logs": log_dir,
    }


def _failure_reasons(c: Any, row: dict[str, Any]) -> dict[str, int]:
    """Reasons of the keys that finally failed (last record per key)."""
    from sluice.s3uri import parse_s3_uri

    if not row.get("plan_uri"):
        return {}
    bucket, _ = parse_s3_uri(str(row["plan_uri"]))
    last: dict[str, str] = {}
    resp = c.s3.list_objects_v2(Bucket=bucket, Prefix=f"runs/{row['run_id']}/failures/")
    for o in sorted(resp.get("Contents", []), key=lambda o: int(o["Key"].rsplit("/", 1)[-1].split(".")[0])):
        for line in c.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].iter_lines():
            if line.strip():
                d = json.loads(line)
                last[d["key"]] = d["reason"]
    return dict(Counter(last.values()))


def _copy_output(c: Any, row: dict[str, Any], out: str | None, run_id: str) -> str | None:
    """Copy Parquet output and failures to OUT (default ./sluice-output/<run>/)."""
    from sluice.s3uri import parse_s3_uri

    if not row.get("output_prefix"):
        return None
    dest = Path(out or Path("sluice-output") / run_id)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    bucket, prefix = parse_s3_uri(str(row["output_prefix"]), allow_empty_key=True)
    ctl, _ = parse_s3_uri(str(row["plan_uri"]))
    for b, p, sub in ((bucket, prefix, "output"), (ctl, f"runs/{run_id}/failures/", "failures")):
        for page in c.s3.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=p):
            for o in page.get("Contents", []):
                rel = o["Key"][len(p) :]
                if "_commits/" in rel:
                    continue
                target = dest / sub / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(c.s3.get_object(Bucket=b, Key=o["Key"])["Body"].read())
    return str(dest)


def _report(args: argparse.Namespace, s: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(s, indent=2))
        return
    w = sys.stdout.write
    w("\nSluice local run\n")
    rows = [("run id", s.get("run_id")), ("outcome", s.get("outcome"))]
    if s.get("reasons"):
        rows += [("reason", r) for r in s["reasons"]]
    if "processed" in s:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(s.get("failed_by_reason", {}).items()))
        rows += [("processed", s["processed"]), ("failed", f"{s['failed']}" + (f"  ({fails})" if fails else ""))]
        if s.get("reason"):
            rows.append(("reason", s["reason"]))
        rows += [
            ("shards", s["shards"]),
            ("retry passes", s["retry_passes"]),
            ("wall time", f"{s['wall_s']} s"),
            ("images/s", s["images_per_s"]),
            ("output (S3)", s.get("output_prefix")),
            ("output (local)", s.get("output_dir")),
            ("worker logs", s.get("logs")),
        ]
        if s.get("metrics"):
            rows.append(("metrics", s["metrics"]))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        w(f"  {k:<{width}}  {v}\n")
