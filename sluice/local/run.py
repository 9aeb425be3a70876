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

from sluice.aws.clients import Clients, reset_clients
from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts import FailureLine, RunFailed, RunItem, RunStatus, RunSucceeded, parse_detail
from sluice.local.events import matches, s3_object_created
from sluice.local.lambda_context import LocalContext
from sluice.local.output import OutputDir
from sluice.local.progress import Progress
from sluice.local.server import FAKE_CREDENTIALS, MotoServer, configure
from sluice.paths import COMMITS_DIR, MANIFESTS_PREFIX, RunPaths, is_commit_marker

INPUT_BUCKET = "sluice-local-images"
LOCAL_CHUNK_KEYS = 16
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


def is_image_name(path: Path) -> bool:
    """An image by its name: a known suffix, not hidden (.DS_Store, ._x.jpg from macOS)."""
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


@dataclass
class Uploaded:
    """What --images DIR or --demo N put in the input bucket."""

    prefix: str
    count: int
    skipped: list[str] = field(default_factory=list)  # files of DIR that are not images by name

    def say_skipped(self) -> None:
        if self.skipped:
            shown = ", ".join(self.skipped[:5]) + (" ..." if len(self.skipped) > 5 else "")
            print(f"sluice: skipped {len(self.skipped)} file(s) that are not images by name: {shown}", file=sys.stderr)


def _upload_images(c: Any, args: argparse.Namespace) -> Uploaded:
    """Upload --images DIR (images by name; the rest is skipped and listed) or --demo N images."""
    with contextlib.suppress(c.s3.exceptions.BucketAlreadyOwnedByYou):
        c.s3.create_bucket(Bucket=INPUT_BUCKET)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.images:
        root = Path(args.images)
        if not root.is_dir():
            raise SystemExit(f"sluice: --images {root}: not a directory")
        prefix = f"images/{root.resolve().name}-{stamp}/"
        files = sorted(p for p in root.rglob("*") if p.is_file())
        images = [p for p in files if is_image_name(p)]
        skipped = [p.relative_to(root).as_posix() for p in files if not is_image_name(p)]
        for p in images:  # subfolders are kept as key prefixes; images that do not decode are reported
            c.s3.put_object(Bucket=INPUT_BUCKET, Key=prefix + p.relative_to(root).as_posix(), Body=p.read_bytes())
        if not images:
            raise SystemExit(
                f"sluice: --images {root}: no image files ({len(skipped)} other files; "
                f"images are named {', '.join(IMAGE_SUFFIXES)})"
            )
        return Uploaded(prefix, len(images), skipped)
    from sluice.local.demo import demo_images

    n = 200 if args.demo is None else args.demo
    prefix = f"demo-{stamp}/"
    for key, data in demo_images(n):
        c.s3.put_object(Bucket=INPUT_BUCKET, Key=prefix + key, Body=data)
    return Uploaded(prefix, n)


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
        "model": _models(args),
        "job": job,
    }
    if args.max_failed_fraction is not None:
        manifest["max_failed_fraction"] = args.max_failed_fraction
    return "local-run.json", json.dumps(manifest, indent=2).encode()


def _models(args: argparse.Namespace) -> dict[str, Any] | list[dict[str, Any]]:
    """The generated manifest's model(s): --model URIs (a local path as an absolute one), else the builtin."""
    uris = args.model or ["builtin:reference-cnn"]
    for u in uris:
        if not u.startswith(("builtin:", "s3://")) and not Path(u).expanduser().is_file():
            raise SystemExit(f"sluice: --model {u}: no such file (give a model file, an s3:// URI or builtin:NAME)")
    specs = [
        {
            "uri": u if u.startswith(("builtin:", "s3://")) else str(Path(u).expanduser().resolve()),
            "batch_size": 32,
            "image_size": args.image_size,  # an exported model's spec gives its own size
        }
        for u in uris
    ]
    return specs[0] if len(specs) == 1 else specs


@dataclass
class _Services:
    """What `sluice local run` starts, and stops at the end: emulator, Prometheus, executors."""

    endpoint: str = ""
    server: MotoServer | None = None
    prom: Any = None  # sluice.local.prometheus.LocalPrometheus
    metrics_url: str = ""
    executors: list[Any] = field(default_factory=list)
    waiting: bool = False  # the jobs run: a signal stops them gracefully from the wait loop
    runs_table: str = ""  # the emulator's runs table, for the --keep hint
    # TMPDIR of every worker and prepare process, removed when the run ends: a process killed
    # by SIGKILL (or stopped mid-way) cannot remove its own sluice-worker-* or spill folders.
    scratch: str = ""


def run_local(args: argparse.Namespace) -> int:
    """Run the pipeline locally; exit code 0 only when the run succeeded."""
    for k, v in FAKE_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    started = time.monotonic()

    def note_pid(pid: int) -> None:
        if args.pid_file:
            with open(args.pid_file, "a", encoding="ascii") as fh:
                fh.write(f"{pid}\n")

    out = OutputDir.check(args.out)  # an unusable --out fails now, not after the run
    _models(args)  # so does a --model file that is not there
    svc = _Services()
    interrupted = threading.Event()

    def on_signal(*_: Any) -> None:
        interrupted.set()
        if not svc.waiting:  # uploading or planning: stop now, not after the last image
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        _start_services(args, svc, note_pid)
        return _run(args, svc, out, started, note_pid, interrupted)
    except KeyboardInterrupt:
        interrupted.set()
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        _stop_services(args, svc, interrupted.is_set())


def _start_services(args: argparse.Namespace, svc: _Services, note_pid: NotePid) -> None:
    """The emulator (--endpoint-url or a moto server of our own) and, if available, Prometheus."""
    svc.scratch = tempfile.mkdtemp(prefix="sluice-local-")
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
                f"Prometheus left running at {svc.prom.url} (pid {svc.prom.pid}, data in {svc.prom.data_dir}: "
                "remove it after stopping it); "
                f"sluice metrics RUN_ID --url {svc.prom.url}",
                file=sys.stderr,
            )
        else:
            svc.prom.stop()
    if svc.server is not None:
        if keep:
            print(
                f"moto server left running at {svc.server.endpoint} (pid {svc.server.pid}); for sluice status/runs:\n"
                f"  export {keep_exports(svc.server.endpoint, svc.runs_table)}",
                file=sys.stderr,
            )
        else:
            svc.server.stop()
    if svc.scratch:
        shutil.rmtree(svc.scratch, ignore_errors=True)
    if interrupted:
        print("sluice: interrupted: the emulator and all workers are stopped", file=sys.stderr)


def keep_exports(endpoint: str, runs_table: str) -> str:
    """The environment that points the sluice CLI at a kept emulator."""
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        "SLUICE_RUNS_TABLE": runs_table,
    }
    return " ".join(f"{k}={v}" for k, v in env.items() if v)


def _run(
    args: argparse.Namespace,
    svc: _Services,
    out: OutputDir,
    started: float,
    note_pid: NotePid,
    interrupted: threading.Event,
) -> int:
    from sluice.control.ledger import Ledger
    from sluice.local.executor import LocalExecutor
    from sluice.local.infra import create_local

    reset_clients()  # AWS_ENDPOINT_URL is set: every client from here on talks to the emulator
    c = Clients()
    stack = create_local(c)
    svc.runs_table = stack.names["RunsTable"]
    forced = getattr(args, "prepare_workers", None)
    # Local mode: the workers run here, so a manifest's model.uri may be a local path.
    router = Router(stack, {"SLUICE_LOCAL_MODE": "1", **({"SLUICE_PREPARE_WORKERS": str(forced)} if forced else {})})
    outcome, uploaded = _submit(c, stack, router, args)
    if not args.json:
        uploaded.say_skipped()
    if outcome.get("status") not in ("submitted", "preparing"):
        rejected = {"outcome": outcome.get("status"), "run_id": outcome.get("run_id")}
        _report(args, {**rejected, "reasons": outcome.get("reasons", []), "endpoint": svc.endpoint})
        return 1
    run_id = outcome["run_id"]
    ledger = Ledger(c.dynamodb, stack.names["RunsTable"])
    log_dir = str((run_dir := out.for_run(run_id)) / "logs")
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
        _say_started(args, outcome, svc.endpoint)
    svc.waiting = True
    row = _wait(executor, ledger, run_id, progress, interrupted)
    progress.end()
    if row is None:
        return 130
    summary = _summary(c, stack, row, time.monotonic() - started, svc.endpoint, log_dir)
    summary.update(output_dir=_copy_output(c, row, run_dir), skipped_files=len(uploaded.skipped))
    summary["metrics"] = _metrics_note(args, svc)
    _report(args, summary)
    return 0 if row.status is RunStatus.SUCCEEDED else 1


def _say_started(args: argparse.Namespace, outcome: dict[str, Any], endpoint: str) -> None:
    layout = "multinode" if args.mode == "multinode" else "array"
    run_id = outcome["run_id"]
    print(
        f"sluice: run {run_id}: about {outcome['total_keys']} keys to prepare with "
        f"{len(outcome['job_ids'])} prepare job(s) (map, then reduce), then {layout} jobs; emulator {endpoint}"
        if outcome["status"] == "preparing"
        else f"sluice: run {run_id}: {outcome['total_keys']} images in {outcome['shards']} shard(s) "
        f"({layout}); emulator {endpoint}",
        file=sys.stderr,
    )


def _metrics_note(args: argparse.Namespace, svc: _Services) -> str | None:
    """Where the run's metrics are, or that they went with the Prometheus this run started."""
    if svc.prom is not None:
        if args.keep:
            return str(svc.prom.url)
        return "local Prometheus stopped with the run (use --keep to query it with sluice metrics)"
    return svc.metrics_url or None


def _submit(c: Any, stack: Any, router: Router, args: argparse.Namespace) -> tuple[dict[str, Any], Uploaded]:
    """Upload the images and the manifest; route the upload's event to the manifest handler."""
    control = stack.names["ControlBucket"]
    uploaded = _upload_images(c, args)
    name, body = _manifest(args, uploaded.prefix, uploaded.count)
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
    return (dict(results[0]) if results else {"status": "ignored"}), uploaded


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
        # Small chunks: progress (read from commit markers) moves every few images, not every 2,048.
        "SLUICE_WORKER_CHUNK_KEYS": os.environ.get("SLUICE_WORKER_CHUNK_KEYS", str(LOCAL_CHUNK_KEYS)),
        "TMPDIR": svc.scratch,
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
        "lineage": row.lineage or [],
        "skipped": row.skipped or {},
    }


def _prepare_summary(c: Any, row: RunItem) -> dict[str, Any] | None:
    """What the prepare stage did (None when the manifest Lambda planned the run itself)."""
    if row.prepare is None:
        return None
    from sluice.aws.s3io import read_uri
    from sluice.contracts import PrepareSpec
    from sluice.prepare.collect import collect
    from sluice.prepare.store import PrepareStore

    spec = PrepareSpec.model_validate_json(read_uri(c.s3, row.prepare.spec_uri))
    return collect(spec, PrepareStore(c.s3)).summary(spec)


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


def _copy_output(c: Any, row: RunItem, dest: Path) -> str | None:
    """Copy committed Parquet output, failures and plan.json into the run's own folder (OUT/<run id>/).

    A chunk without its commit marker (a killed attempt's leftover) is left out, and the markers
    too: the copy is the run's valid output only (`sluice output sql RUN --local OUT` reads it).
    """
    if not row.output_prefix:
        return None
    bucket, prefix = parse_s3_uri(row.output_prefix, allow_empty_key=True)
    ctl, failures = _failures_prefix(row)
    for b, p, sub in ((bucket, prefix, "output"), (ctl, failures, "failures")):
        keys = [
            o["Key"]
            for page in c.s3.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=p)
            for o in page.get("Contents", [])
        ]
        marked = {k.replace(COMMITS_DIR, "").removesuffix(".json") + ".parquet" for k in keys if is_commit_marker(k)}
        for key in keys:
            if is_commit_marker(key) or (key.endswith(".parquet") and key not in marked):
                continue
            target = dest / sub / key[len(p) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(c.s3.get_object(Bucket=b, Key=key)["Body"].read())
    if row.plan_uri:
        pb, pk = parse_s3_uri(row.plan_uri)
        (dest / "plan.json").write_bytes(c.s3.get_object(Bucket=pb, Key=pk)["Body"].read())
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
        if s.get("lineage"):
            skipped = ", ".join(f"{n} {why}" for why, n in sorted(s.get("skipped", {}).items())) or "none"
            rows.append(("since", f"{', '.join(s['lineage'])} (incremental: skipped {skipped})"))
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
