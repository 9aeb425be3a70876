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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.aws import Clients, reset_clients
from sluice.contracts import FailureLine, RunFailed, RunItem, RunStatus, RunSucceeded, parse_detail
from sluice.local.events import matches, s3_object_created
from sluice.local.lambda_context import LocalContext
from sluice.local.server import FAKE_CREDENTIALS, MotoServer, configure
from sluice.paths import MANIFESTS_PREFIX, RunPaths, is_commit_marker
from sluice.s3uri import parse_s3_uri
from sluice.tally import Tally

INPUT_BUCKET = "sluice-local-images"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")
NotePid = Callable[[int], None]


class Router:
    """Delivers events to the functions whose template rules match (the real handlers)."""

    def __init__(self, stack: Any, env: dict[str, str] | None = None) -> None:
        self._stack = stack
        self._env = env or {}  # on top of every function's template environment
        self.delivered = Counter[str]()

    def __call__(self, event: dict[str, Any]) -> list[Any]:
        out = []
        for rule, pattern in self._stack.rule_patterns.items():
            if matches(pattern, event):
                out.append(self._invoke(self._stack.rule_function[rule], event))
                self.delivered[rule] += 1
        return out

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        env = {**self._stack.env_for(function), **self._env}
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

    def __init__(self, c: Any, table: str, enabled: bool) -> None:
        self._c = c
        self._table = table
        self._enabled = enabled and sys.stderr.isatty()
        self._seen: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._last = 0.0

    def images_done(self, output_prefix: str) -> int:
        bucket, prefix = parse_s3_uri(output_prefix, allow_empty_key=True)
        for page in self._c.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                k = o["Key"]
                if is_commit_marker(k) and k not in self._seen:
                    m = json.loads(self._c.s3.get_object(Bucket=bucket, Key=k)["Body"].read())
                    self._seen[k] = int(m.get("rows", 0)) + len(m.get("failed", []))
        return sum(self._seen.values())

    def show(self, row: RunItem | None, running: int, force: bool = False) -> None:
        if row is None or not self._enabled or (not force and time.monotonic() - self._last < 0.5):
            return
        self._last = time.monotonic()
        done = Tally(self._c.dynamodb, self._table).counts(row.run_id).shards_done
        images = self.images_done(row.output_prefix) if row.output_prefix else 0
        rate = images / max(1e-6, time.monotonic() - self._t0)
        sys.stderr.write(
            f"\r  {row.status.value:<10} shards {done}/{row.total_shards}  "
            f"images {images}/{row.total_keys or 0}  {rate:6.1f} img/s  workers {running}   "
        )
        sys.stderr.flush()

    def end(self) -> None:
        if self._enabled:
            sys.stderr.write("\n")


@dataclass
class _Services:
    """What `sluice local run` starts, and stops at the end: emulator, Prometheus, executors."""

    endpoint: str = ""
    server: MotoServer | None = None
    prom: Any = None  # sluice.local.prometheus.LocalPrometheus
    metrics_url: str = ""
    executors: list[Any] = field(default_factory=list)


def run_local(args: argparse.Namespace) -> int:
    """Run the pipeline locally; exit code 0 only when the run succeeded."""
    for k, v in FAKE_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    started = time.monotonic()

    def note_pid(pid: int) -> None:
        if args.pid_file:
            with open(args.pid_file, "a", encoding="ascii") as fh:
                fh.write(f"{pid}\n")

    svc = _Services()
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
    signal.signal(signal.SIGTERM, lambda *_: interrupted.set())
    try:
        _start_services(args, svc, note_pid)
        return _run(args, svc, started, note_pid, interrupted)
    except KeyboardInterrupt:
        interrupted.set()
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        _stop_services(args, svc, interrupted.is_set())


def _start_services(args: argparse.Namespace, svc: _Services, note_pid: NotePid) -> None:
    """The emulator (--endpoint-url or a moto server of our own) and, if available, Prometheus."""
    if args.endpoint_url:
        svc.endpoint = args.endpoint_url.rstrip("/")
        with contextlib.suppress(OSError):  # moto: Batch without Docker; others have no such API
            configure(svc.endpoint)
    else:
        svc.server = MotoServer().start()
        note_pid(svc.server.pid or 0)
        svc.endpoint = svc.server.endpoint
    os.environ["AWS_ENDPOINT_URL"] = svc.endpoint
    svc.metrics_url = os.environ.get("SLUICE_REMOTE_WRITE_URL", "")
    if not svc.metrics_url and not args.no_prometheus:
        from sluice.local.prometheus import LocalPrometheus

        if LocalPrometheus.available():
            svc.prom = LocalPrometheus().start()
            note_pid(svc.prom.pid or 0)
            svc.metrics_url = svc.prom.write_url
            if not args.json:
                print(f"sluice: metrics: Prometheus at {svc.prom.url} (remote-write receiver)", file=sys.stderr)


def _stop_services(args: argparse.Namespace, svc: _Services, interrupted: bool) -> None:
    """Stop the workers, then Prometheus and the emulator unless --keep (and not interrupted)."""
    keep = args.keep and not interrupted
    for ex in svc.executors:
        n = ex.stop()
        if interrupted:
            print(f"\nsluice: interrupted: stopped {n} running worker(s)", file=sys.stderr)
    if svc.prom is not None:
        if keep:
            print(
                f"Prometheus left running at {svc.prom.url} (pid {svc.prom.pid}); "
                f"sluice metrics RUN_ID --url {svc.prom.url}",
                file=sys.stderr,
            )
        else:
            svc.prom.stop()
    if svc.server is not None:
        if keep:
            print(
                f"moto server left running at {svc.server.endpoint} (pid {svc.server.pid}); "
                f"export AWS_ENDPOINT_URL={svc.server.endpoint} AWS_ACCESS_KEY_ID=sluice-local "
                "AWS_SECRET_ACCESS_KEY=sluice-local AWS_DEFAULT_REGION=us-east-1",
                file=sys.stderr,
            )
        else:
            svc.server.stop()
    if interrupted:
        print("sluice: interrupted: the emulator and all workers are stopped", file=sys.stderr)


def _run(
    args: argparse.Namespace, svc: _Services, started: float, note_pid: NotePid, interrupted: threading.Event
) -> int:
    from sluice.ledger import Ledger
    from sluice.local.executor import LocalExecutor
    from sluice.local.infra import create_local

    reset_clients()  # AWS_ENDPOINT_URL is set: every client from here on talks to the emulator
    c = Clients()
    stack = create_local(c)
    forced = getattr(args, "prepare_workers", None)
    router = Router(stack, {"SLUICE_PREPARE_WORKERS": str(forced)} if forced else None)
    outcome = _submit(c, stack, router, args)
    if outcome.get("status") not in ("submitted", "preparing"):
        rejected = {"outcome": outcome.get("status"), "run_id": outcome.get("run_id")}
        _report(args, {**rejected, "reasons": outcome.get("reasons", []), "endpoint": svc.endpoint})
        return 1
    run_id = outcome["run_id"]
    ledger = Ledger(c.dynamodb, stack.names["RunsTable"])
    log_dir = tempfile.mkdtemp(prefix=f"sluice-{run_id}-logs-")
    executor = LocalExecutor(
        c.batch,
        ledger,
        [stack.names["GpuJobQueue"], stack.names["MnpJobQueue"], stack.names["PrepareJobQueue"]],
        router,
        slots=args.slots or os.cpu_count() or 1,
        worker_env=_worker_env(args, svc),
        log_dir=log_dir,
        on_pid=note_pid,
    )
    svc.executors.append(executor)
    progress = Progress(c, stack.names["RunsTable"], enabled=not args.json)
    if not args.json:
        layout = "multinode" if args.mode == "multinode" else "array"
        print(
            f"sluice: run {run_id}: about {outcome['total_keys']} keys to prepare with "
            f"{len(outcome['job_ids'])} prepare job(s) (map, then reduce), then {layout} jobs; emulator {svc.endpoint}"
            if outcome["status"] == "preparing"
            else f"sluice: run {run_id}: {outcome['total_keys']} images in {outcome['shards']} shard(s) "
            f"({layout}); emulator {svc.endpoint}",
            file=sys.stderr,
        )
    row = _wait(executor, ledger, run_id, progress, interrupted)
    progress.end()
    if row is None:
        return 130
    summary = _summary(c, stack, row, time.monotonic() - started, svc.endpoint, log_dir)
    summary["output_dir"] = _copy_output(c, row, args.out, run_id)
    summary["metrics"] = (svc.prom.url if svc.prom else None) or (svc.metrics_url or None)
    _report(args, summary)
    return 0 if row.status is RunStatus.SUCCEEDED else 1


def _submit(c: Any, stack: Any, router: Router, args: argparse.Namespace) -> dict[str, Any]:
    """Upload the images and the manifest; route the upload's event to the manifest handler."""
    control = stack.names["ControlBucket"]
    prefix, count = _upload_images(c, args)
    name, body = _manifest(args, prefix, count)
    key = MANIFESTS_PREFIX + name
    put = c.s3.put_object(Bucket=control, Key=key, Body=body)
    event = s3_object_created(
        control,
        key,
        size=len(body),
        etag=put["ETag"],
        version_id=put.get("VersionId"),
        sequencer=f"{time.time_ns():X}",
    )
    results = router(event)
    return dict(results[0]) if results else {"status": "ignored"}


def _worker_env(args: argparse.Namespace, svc: _Services) -> dict[str, str]:
    """What every worker process gets on top of the job's own environment."""
    env = {
        "AWS_ENDPOINT_URL": svc.endpoint,
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": os.environ["AWS_DEFAULT_REGION"],
        "SLUICE_WORKER_CPU_RANKS": str(args.ranks),
        "SLUICE_WORKER_DEVICE": os.environ.get("SLUICE_WORKER_DEVICE", "auto"),
        # Several workers share this host: no fixed /metrics port; metrics go by remote write.
        "SLUICE_WORKER_METRICS_PORT": os.environ.get("SLUICE_WORKER_METRICS_PORT", "0"),
    }
    if svc.metrics_url:
        env["SLUICE_REMOTE_WRITE_URL"] = svc.metrics_url
        env["SLUICE_WORKER_PUSH_INTERVAL_S"] = os.environ.get("SLUICE_WORKER_PUSH_INTERVAL_S", "1")
    return env


def _wait(executor: Any, ledger: Any, run_id: str, progress: Progress, interrupted: threading.Event) -> RunItem | None:
    """Run the jobs until the run is final and no worker is left; None when interrupted."""
    while not interrupted.is_set():
        executor.discover()
        executor.step()
        row: RunItem | None = ledger.get(run_id)
        progress.show(row, executor.running())
        final = row is not None and row.status.final
        if final and executor.idle:
            progress.show(row, 0, force=True)
            return row
        if executor.idle and not final and not executor.discover():
            time.sleep(0.2)  # the completion handler may still submit a retry pass
        time.sleep(0.1)
    return None


def _read_bus(c: Any, queue_url: str) -> list[dict[str, Any]]:
    """Every event the observer queue holds (what was published on Sluice's buses)."""
    events: list[dict[str, Any]] = []
    while True:
        msgs = c.sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
        if not msgs:
            return events
        events += [json.loads(m["Body"]) for m in msgs]
        for m in msgs:
            c.sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])


def _summary(c: Any, stack: Any, row: RunItem, seconds: float, endpoint: str, log_dir: str) -> dict[str, Any]:
    events = _read_bus(c, stack.observer_queue_url)
    details = [parse_detail(e["detail-type"], e["detail"]) for e in events]
    final = next((d for d in details if isinstance(d, RunSucceeded | RunFailed)), None)
    processed = final.processed if final else (row.processed or 0)
    failed = final.failed if final else (row.failed_keys or 0)
    outcomes = {RunStatus.SUCCEEDED: "succeeded", RunStatus.FAILED: "failed"}
    return {
        "run_id": row.run_id,
        "outcome": outcomes.get(row.status, row.status.value),
        "processed": processed,
        "failed": failed,
        "failed_by_reason": _failure_reasons(c, row),
        "reason": final.reason if isinstance(final, RunFailed) else None,
        "reasons": row.reasons or [],
        "shards": int(row.shards or 0),
        "retry_passes": max(1, len(row.passes)) - 1,
        "wall_s": round(seconds, 1),
        "images_per_s": round(processed / seconds, 1) if seconds else 0.0,
        "output_prefix": row.output_prefix,
        "events": [e["detail-type"] for e in events],
        "endpoint": endpoint,
        "logs": log_dir,
        "prepare": _prepare_summary(c, row),
    }


def _prepare_summary(c: Any, row: RunItem) -> dict[str, Any] | None:
    """What the prepare stage did (None when the manifest Lambda planned the run itself)."""
    if row.prepare is None:
        return None
    from sluice.contracts import PrepareSpec
    from sluice.prepare.collect import collect
    from sluice.prepare.store import Store
    from sluice.s3io import read_uri

    spec = PrepareSpec.model_validate_json(read_uri(c.s3, row.prepare.spec_uri))
    return collect(spec, Store(c.s3)).summary(spec)


def _failures_prefix(row: RunItem) -> tuple[str, str]:
    """(bucket, key prefix) of the run's failures/, under the control bucket that holds its plan."""
    bucket, _ = parse_s3_uri(str(row.plan_uri))
    return parse_s3_uri(RunPaths.in_bucket(bucket, row.run_id).failures_prefix)


def _failure_reasons(c: Any, row: RunItem) -> dict[str, int]:
    """Reasons of the keys that finally failed (last record per key)."""
    if not row.plan_uri:
        return {}
    bucket, prefix = _failures_prefix(row)
    pages = c.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [o for page in pages for o in page.get("Contents", [])]
    last: dict[str, str] = {}
    for o in sorted(objects, key=lambda o: int(o["Key"].rsplit("/", 1)[-1].split(".")[0])):
        for line in c.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].iter_lines():
            if line.strip():
                failure = FailureLine.model_validate_json(line)
                last[failure.key] = failure.reason.value
    return dict(Counter(last.values()))


def _copy_output(c: Any, row: RunItem, out: str | None, run_id: str) -> str | None:
    """Copy Parquet output and failures to OUT (default ./sluice-output/<run>/), commit markers left out."""
    if not row.output_prefix:
        return None
    dest = Path(out or Path("sluice-output") / run_id)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    bucket, prefix = parse_s3_uri(row.output_prefix, allow_empty_key=True)
    ctl, failures = _failures_prefix(row)
    for b, p, sub in ((bucket, prefix, "output"), (ctl, failures, "failures")):
        for page in c.s3.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=p):
            for o in page.get("Contents", []):
                if is_commit_marker(o["Key"]):
                    continue
                target = dest / sub / o["Key"][len(p) :]
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
        if s.get("prepare"):
            p = s["prepare"]
            rows.append(
                (
                    "prepare",
                    f"{p['workers']} workers, {p['keys_in']} keys in, {p['unique_keys']} unique "
                    f"({p['duplicates']} duplicates), {p['shards']} shards, {p['seconds']} s, "
                    f"peak {p['peak_rss_mb_per_worker']} MB a worker",
                )
            )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        w(f"  {k:<{width}}  {v}\n")
