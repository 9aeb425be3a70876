"""`sluice local run`: the whole pipeline on this machine, against a local AWS emulator.

1. a moto server on 127.0.0.1 (or --endpoint-url), resources created from template.yaml;
2. images uploaded (--images DIR or --demo N), a manifest uploaded under manifests/
   (sluice.local.manifest: generated from the flags, or --manifest FILE with the flags on top);
3. the S3 "Object Created" event routed to the real manifest handler (shards, plan, jobs);
4. the local executor runs the run's submitted Batch jobs as real worker processes and routes
   the "Batch Job State Change" events to the real completion handler;
5. a progress line while it runs, then a summary; output copied to --out (sluice.local.summary).

stdout and stderr may close under it (`... 2>&1 | head -3`): writes then stop (sluice.local.streams),
the run goes on, its output is saved with its summary.json, and the servers it started are
stopped whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
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
from sluice.contracts.status import RunStatus
from sluice.control.table.items import RunItem
from sluice.local import manifest as local_manifest
from sluice.local.emulator.bus import BusTap
from sluice.local.emulator.events import matches, s3_object_created
from sluice.local.emulator.lambda_context import LocalContext
from sluice.local.emulator.server import FAKE_CREDENTIALS, MotoServer, configure
from sluice.local.manifest import INPUT_BUCKET, KIND_SUFFIXES, Earlier, Uploaded
from sluice.local.output import OutputDir
from sluice.local.progress import Progress
from sluice.local.streams import pipe_safe
from sluice.local.summary import Ended, report, save, summarize
from sluice.paths import MANIFESTS_PREFIX

LOCAL_CHUNK_KEYS = 16
NotePid = Callable[[int], None]
INTERRUPTED = "interrupted: the local run was stopped (Ctrl-C, SIGTERM or SIGHUP) and its workers with it"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each stops the run and what it started


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


def is_image_name(path: Path, kind: str = "image") -> bool:
    """An image (or a text, a video) by its name: a known suffix, not hidden (.DS_Store, ._x.jpg from macOS)."""
    return path.suffix.lower() in KIND_SUFFIXES[kind] and not path.name.startswith(".")


@dataclass(frozen=True)
class Folder:
    """--images DIR, read before anything starts: its images by name, and the other files."""

    root: Path
    images: list[Path]
    skipped: list[str]  # files that are not of the kind by name
    kind: str = "image"
    unreadable: list[str] = field(default_factory=list)  # dangling symlinks, folders reached twice: named, skipped

    @classmethod
    def read(cls, images: str, kind: str = "image") -> Folder:
        """DIR's files of the kind; SystemExit when it is missing or holds none (before any server starts)."""
        root = Path(images).expanduser()
        flag = f"--{kind}s"
        if not root.is_dir():
            raise SystemExit(f"sluice: {flag} {root}: " + ("not a directory" if root.exists() else "no such folder"))
        files, unreadable = walk(root)
        images_ = [p for p in files if is_image_name(p, kind)]
        skipped = [p.relative_to(root).as_posix() for p in files if not is_image_name(p, kind)]
        if not images_:
            raise SystemExit(
                f"sluice: {flag} {root}: no {kind} files ({len(skipped) + len(unreadable)} other files; "
                f"{kind}s are named {', '.join(KIND_SUFFIXES[kind])})"
            )
        for p in images_:
            if any(ord(ch) < 32 or ord(ch) == 127 for ch in p.name):  # a key S3 cannot take as given
                raise SystemExit(
                    f"sluice: {flag} {root}: the file {p.relative_to(root).as_posix()!r} has a control character "
                    "(a newline?) in its name: rename it, then run again (nothing was uploaded)"
                )
        return cls(root, images_, skipped, kind, unreadable)


def walk(root: Path) -> tuple[list[Path], list[str]]:
    """Every file under root, sorted, symlinked subfolders followed; and what was left out, named with why.

    Each real folder is read once: a link back up (a cycle) or a second link to one folder is
    named, not followed again. A symlink to nothing is named too: skipped, never silently.
    """
    files: list[Path] = []
    unreadable: list[str] = []
    seen: dict[str, str] = {}  # real folder -> the path it was first read under
    for top, dirs, names in os.walk(root, followlinks=True):
        here = Path(top)
        rel = here.relative_to(root).as_posix()
        real = os.path.realpath(top)
        if real in seen:
            unreadable.append(f"{rel}/ (the folder {seen[real] or '.'}/ again: read once)")
            dirs[:] = []
            continue
        seen[real] = "" if rel == "." else rel
        dirs.sort()
        for name in names:
            p = here / name
            if p.is_file():
                files.append(p)
            elif p.is_symlink() and not p.exists():
                unreadable.append(f"{p.relative_to(root).as_posix()} (a symlink to {os.readlink(p)}, which is missing)")
            else:
                unreadable.append(f"{p.relative_to(root).as_posix()} (not a regular file)")
    return sorted(files), sorted(unreadable)


def say_skipped(skipped: list[str], kind: str = "image", unreadable: list[str] | None = None) -> None:
    """The files a folder run leaves out, named (the first five of each kind of reason)."""

    def shown(names: list[str]) -> str:
        return ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")

    unreadable = unreadable or []
    if skipped and not unreadable:
        print(f"sluice: skipped {len(skipped)} file(s) that are not {kind}s by name: {shown(skipped)}", file=sys.stderr)
    elif unreadable:
        parts = [f"{len(skipped)} not {kind}s by name ({shown(skipped)})"] if skipped else []
        parts.append(f"{len(unreadable)} not read ({shown(unreadable)})")
        print(f"sluice: skipped {len(skipped) + len(unreadable)} file(s): {'; '.join(parts)}", file=sys.stderr)


def _upload_images(
    c: Any, args: argparse.Namespace, folder: Folder | None, earlier: Earlier | None, stamp: str
) -> Uploaded:
    """Upload --images DIR (images by name) or --demo N images; nothing for --manifest / --since-run alone.

    With --since-run, DIR goes to the prefix that run read (its unchanged images keep their ETags).
    """
    kind, _, demo = local_manifest.content_source(args)
    if folder is None and demo is None and (args.manifest or earlier):
        return Uploaded("", 0)
    with contextlib.suppress(c.s3.exceptions.BucketAlreadyOwnedByYou):
        c.s3.create_bucket(Bucket=INPUT_BUCKET)
    if folder is not None:
        prefix = (earlier.local_prefix if earlier else None) or f"{kind}s/{folder.root.resolve().name}-{stamp}/"
        for p in folder.images:  # subfolders are kept as key prefixes; images that do not decode are reported
            c.s3.put_object(
                Bucket=INPUT_BUCKET, Key=prefix + p.relative_to(folder.root).as_posix(), Body=p.read_bytes()
            )
        return Uploaded(prefix, len(folder.images), folder.skipped, folder.unreadable)
    from sluice.local.demo import demo_objects

    n = 200 if demo is None else demo
    prefix = f"demo-{stamp}/"
    for key, data in demo_objects(kind, n):
        c.s3.put_object(Bucket=INPUT_BUCKET, Key=prefix + key, Body=data)
    return Uploaded(prefix, n)


@dataclass
class _Services:
    """What `sluice local run` starts, and stops at the end: emulator, Prometheus, executors."""

    endpoint: str = ""
    server: MotoServer | None = None
    prom: Any = None  # sluice.local.emulator.prometheus.LocalPrometheus
    metrics_url: str = ""
    executors: list[Any] = field(default_factory=list)
    waiting: bool = False  # the jobs run: a signal stops them gracefully from the wait loop
    runs_table: str = ""  # the emulator's runs table, for the --keep hint
    control_bucket: str = ""  # ... and its control bucket (sluice output sql)
    beats_table: str = ""  # the workers' progress beats (gpu_worker.watchdog)
    # TMPDIR of every worker and prepare process, removed when the run ends: a process killed
    # by SIGKILL (or stopped mid-way) cannot remove its own sluice-worker-* or spill folders.
    scratch: str = ""
    tap: BusTap | None = None  # this run's queue of its own events, removed when it ends
    stopped: int = 0  # workers an interrupted run stopped before its summary
    clients: Any = None


@dataclass(frozen=True)
class _Start:
    """What is known before any server starts."""

    args: argparse.Namespace
    out: OutputDir
    folder: Folder | None
    started: float
    note_pid: NotePid


def run_local(args: argparse.Namespace) -> int:
    """Run the pipeline locally; exit code 0 only when the run succeeded (130 when interrupted)."""
    for k, v in FAKE_CREDENTIALS.items():
        os.environ.setdefault(k, v)
    with pipe_safe():
        return _run_local(args)


def _run_local(args: argparse.Namespace) -> int:
    from sluice.log import logger

    # The handlers run in this process: their INFO lines would drown the progress (SLUICE_LOCAL_LOG_LEVEL).
    logger.setLevel(os.environ.get("SLUICE_LOCAL_LOG_LEVEL", "WARNING"))
    started = time.monotonic()

    def note_pid(pid: int) -> None:
        if args.pid_file:
            with open(args.pid_file, "a", encoding="ascii") as fh:
                fh.write(f"{pid}\n")

    local_manifest.check_flags(args)
    local_manifest.check_file(args)  # a missing or broken --manifest: before any server starts
    kind, source, _ = local_manifest.content_source(args)
    folder = Folder.read(source, kind) if source else None  # a missing or empty folder: before anything starts
    if args.model:
        local_manifest.model_specs(args)  # so does a --model file that is not there
    out = OutputDir.check(args.out)  # and an unusable --out, not after the run
    start = _Start(args, out, folder, started, note_pid)
    svc = _Services()
    interrupted = threading.Event()

    def on_signal(*_: Any) -> None:
        interrupted.set()
        if not svc.waiting:  # uploading or planning: stop now, not after the last image
            raise KeyboardInterrupt

    # SIGHUP too: a closed terminal window or `tmux kill-session` must not orphan the servers.
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        _start_services(args, svc, note_pid)
        return _run(start, svc, interrupted)
    except KeyboardInterrupt:
        interrupted.set()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
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
        from sluice.local.emulator.prometheus import LocalPrometheus

        if LocalPrometheus.available():
            svc.prom = LocalPrometheus().start()
            note_pid(svc.prom.pid or 0)
            svc.metrics_url = svc.prom.write_url
            if not args.json:
                print(f"sluice: metrics: Prometheus at {svc.prom.url} (remote-write receiver)", file=sys.stderr)


def _stop_services(args: argparse.Namespace, svc: _Services, interrupted: bool) -> None:
    """Stop the workers, then Prometheus and the emulator unless --keep (and not interrupted).

    Each step runs even when one before it fails: no server of ours outlives the run by accident.
    """
    keep = args.keep and not interrupted
    stopped = svc.stopped
    try:
        for ex in svc.executors:
            stopped += ex.stop()
        if svc.tap is not None and (svc.server is None or keep):  # an emulator that outlives the run
            svc.tap.close(svc.clients)
    finally:
        try:
            if svc.prom is not None and not keep:
                svc.prom.stop()
        finally:
            try:
                if svc.server is not None and not keep:
                    svc.server.stop()
            finally:
                if svc.scratch:
                    shutil.rmtree(svc.scratch, ignore_errors=True)
    if interrupted:
        print(f"\nsluice: interrupted: stopped {_what_stopped(svc, stopped)}", file=sys.stderr)
    elif keep and (svc.server is not None or svc.prom is not None):
        print(_kept(svc), file=sys.stderr)


def _what_stopped(svc: _Services, workers: int) -> str:
    """What an interrupted run stopped: its workers, and only the servers it started itself."""
    parts = [f"{workers} running worker(s)"]
    parts += [name for name, it in (("the emulator", svc.server), ("Prometheus", svc.prom)) if it is not None]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _kept(svc: _Services) -> str:
    """What --keep left running, how to use it and how to stop it."""
    lines, pids, rm = [], [], ""
    if svc.prom is not None:
        url = svc.prom.url
        lines.append(f"Prometheus left running at {url} (pid {svc.prom.pid}); sluice metrics RUN_ID --url {url}")
        pids.append(str(svc.prom.pid))
        rm = f" && rm -rf {svc.prom.data_dir}"
    if svc.server is not None:
        env = keep_exports(svc.server.endpoint, svc.runs_table, svc.control_bucket, svc.beats_table)
        lines.append(
            f"moto server left running at {svc.server.endpoint} (pid {svc.server.pid}); for sluice status, runs, "
            f"output sql and local run --endpoint-url:\n  export {env}"
        )
        pids.append(str(svc.server.pid))
    lines.append(f"stop them with: kill {' '.join(pids)}{rm}")
    return "\n".join(lines)


def keep_exports(endpoint: str, runs_table: str, control_bucket: str = "", beats_table: str = "") -> str:
    """The environment that points the sluice CLI at a kept emulator (the beats table: reconcile's stall rule)."""
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": FAKE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": FAKE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": FAKE_CREDENTIALS["AWS_DEFAULT_REGION"],
        "SLUICE_RUNS_TABLE": runs_table,
        "SLUICE_CONTROL_BUCKET": control_bucket,
        "SLUICE_BEATS_TABLE": beats_table,
    }
    return " ".join(f"{k}={v}" for k, v in env.items() if v)


def _run(start: _Start, svc: _Services, interrupted: threading.Event) -> int:
    from sluice.control.table.ledger import Ledger
    from sluice.local.emulator.executor import ExecutorConfig, LocalExecutor, abandon
    from sluice.local.emulator.infra import create_local

    args = start.args
    reset_clients()  # AWS_ENDPOINT_URL is set: every client from here on talks to the emulator
    c = Clients()
    stack = create_local(c, observe_bus_events=False)  # each run reads its own events (sluice.local.emulator.bus)
    svc.tap, svc.clients = BusTap.open(c, stack), c
    svc.runs_table, svc.control_bucket = stack.names["RunsTable"], stack.names["ControlBucket"]
    svc.beats_table = stack.names["BeatsTable"]
    forced = getattr(args, "prepare_workers", None)
    # Local mode: the workers run here, so a manifest's model.uri may be a local path.
    router = Router(stack, {"SLUICE_LOCAL_MODE": "1", **({"SLUICE_PREPARE_WORKERS": str(forced)} if forced else {})})
    outcome, uploaded = _submit(c, stack, router, start)
    if outcome.get("status") not in ("submitted", "preparing"):
        rejected = {"outcome": outcome.get("status"), "run_id": outcome.get("run_id")}
        report({**rejected, "reasons": outcome.get("reasons", []), "endpoint": svc.endpoint}, args.json)
        return 1
    run_id = outcome["run_id"]
    ledger = Ledger(c.dynamodb, stack.names["RunsTable"])
    run_dir = start.out.for_run(run_id)
    if args.demo is not None and uploaded.count:
        _save_demo(run_dir, uploaded.count)
    queues = (stack.names["GpuJobQueue"], stack.names["MnpJobQueue"], stack.names["PrepareJobQueue"])
    config = ExecutorConfig(
        run_id,
        queues,
        str(run_dir / "logs"),
        slots=args.slots or os.cpu_count() or 1,
        worker_env=_worker_env(args, svc),
        on_pid=start.note_pid,
    )
    executor = LocalExecutor(c.batch, ledger, router, config)
    svc.executors.append(executor)
    from sluice.local.emulator.sweep import LocalSweep

    sweep = LocalSweep(c, stack, executor, run_id)  # ends a hung worker by the control plane's path
    progress = Progress(c, stack.names["RunsTable"], enabled=True)  # on stderr: --json keeps stdout for its one object
    if not args.json:
        _say_started(args, outcome, svc.endpoint)
    svc.waiting = True
    row = _wait(executor, ledger, run_id, progress, interrupted, sweep)
    progress.end()
    if row is None:  # interrupted: the run is concluded (failed) and still gets its summary.json
        svc.waiting = False  # a second signal stops at once, without the summary
        svc.stopped += abandon(executor, INTERRUPTED)
        svc.executors.remove(executor)
        row = ledger.get(run_id)
        if row is None:
            return 130
    summary = summarize(c, svc.tap, Ended(row, time.monotonic() - start.started, svc.endpoint, run_dir))
    summary.update(_more_summary(args, svc, uploaded, run_dir), interrupted=interrupted.is_set())
    summary["stalled"] = [s.model_dump(include={"shard", "attempt", "after_s", "cause"}) for s in sweep.stalled()]
    save(run_dir, summary)
    report(summary, args.json)
    if interrupted.is_set():
        return 130
    return 0 if row.status is RunStatus.SUCCEEDED else 1


def _more_summary(args: argparse.Namespace, svc: _Services, uploaded: Uploaded, run_dir: Path) -> dict[str, Any]:
    """What the summary says that the run's records do not: skipped files, metrics, the input."""
    return {
        "skipped_files": len(uploaded.skipped) + len(uploaded.unreadable),
        "metrics": _metrics_note(args, svc),
        "input_prefix": uploaded.uri if uploaded.count else None,
        "input_dir": str(run_dir / "input") if args.demo is not None and uploaded.count else None,
    }


def _save_demo(run_dir: Path, n: int) -> None:
    """The demo's images in the run's folder too (input/), so `sluice search --image` can be shown one."""
    from sluice.local.demo import demo_images

    for key, data in demo_images(n):  # deterministic: the same bytes as the upload
        target = run_dir / "input" / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def _say_started(args: argparse.Namespace, outcome: dict[str, Any], endpoint: str) -> None:
    layout = "multinode" if args.mode == "multinode" else "array"
    run_id = outcome["run_id"]
    print(
        f"sluice: run {run_id}: about {outcome['total_keys']} keys to prepare with "
        f"{len(outcome['job_ids'])} prepare job(s) (map, then reduce), then {layout} jobs; emulator {endpoint}"
        if outcome["status"] == "preparing"
        else f"sluice: run {run_id}: {outcome['total_keys']} {local_manifest.content_source(args)[0]}s in "
        f"{outcome['shards']} shard(s) "
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


def _submit(c: Any, stack: Any, router: Router, start: _Start) -> tuple[dict[str, Any], Uploaded]:
    """Upload the images and the manifest; route the upload's event to the manifest handler."""
    args = start.args
    control = stack.names["ControlBucket"]
    earlier = local_manifest.read_earlier(c.s3, control, args.since_run) if args.since_run else None
    token = local_manifest.run_token()  # this run's own input prefix, manifest key and index
    uploaded = _upload_images(c, args, start.folder, earlier, token)
    if not args.json:
        kind = local_manifest.content_source(args)[0]
        say_skipped(uploaded.skipped, kind, uploaded.unreadable)
        if uploaded.count:
            print(f"sluice: uploaded {uploaded.count} {kind}(s) to {uploaded.uri}", file=sys.stderr)
    name, body, applied = local_manifest.build(args, uploaded, earlier, token)
    if applied and not args.json:
        print(f"sluice: --manifest {args.manifest} with {', '.join(applied)} applied on top", file=sys.stderr)
    key = f"{MANIFESTS_PREFIX}local/{token}/{name}"  # one key a run: `sluice status` finds each run's own
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
        "SLUICE_BEATS_TABLE": svc.beats_table,
        # Beats every second: the sweep (every couple of seconds here) sees a stall within SLUICE_STALL_AFTER_S.
        "SLUICE_WORKER_BEAT_INTERVAL_S": os.environ.get("SLUICE_WORKER_BEAT_INTERVAL_S", "1"),
    }
    if svc.metrics_url:
        env["SLUICE_REMOTE_WRITE_URL"] = svc.metrics_url
        env["SLUICE_WORKER_PUSH_INTERVAL_S"] = os.environ.get("SLUICE_WORKER_PUSH_INTERVAL_S", "1")
    return env


def _indexing(row: RunItem, executor: Any) -> bool:
    """The run's index stage is still to come or running (the completion handler submitted it)."""
    from sluice.control.indexing.stage import pending

    if not pending(row) or row.index is None:
        return False
    return row.index.state == "submitted" or bool(executor.discover())


def _wait(
    executor: Any, ledger: Any, run_id: str, progress: Progress, interrupted: threading.Event, sweep: Any
) -> RunItem | None:
    """Run the jobs until the run is final and no worker is left; None when interrupted."""
    while not interrupted.is_set():
        executor.discover()
        executor.step()
        sweep()
        row: RunItem | None = ledger.get(run_id)
        progress.show(row, executor.running())
        final = row is not None and row.status.final and not _indexing(row, executor)
        if final and executor.idle:
            progress.show(row, 0, force=True)
            return row
        if executor.idle and not final and not executor.discover():
            time.sleep(0.2)  # the completion handler may still submit a retry pass
        time.sleep(0.1)
    return None
