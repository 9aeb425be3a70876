"""`sluice local run`: the whole pipeline on this machine, against a local AWS emulator.

1. a moto server on 127.0.0.1 (or --endpoint-url), resources created from template.yaml
   (sluice.local.services starts and stops what the run needs);
2. images uploaded (--images DIR, read by sluice.local.folder, or --demo N), a manifest uploaded
   under manifests/ (sluice.local.upload; sluice.local.manifest: generated from the flags, or
   --manifest FILE with the flags on top);
3. the S3 "Object Created" event routed to the real manifest handler (shards, plan, jobs) by
   sluice.local.router, as the template's rules deliver it;
4. the local executor runs the run's submitted Batch jobs as real worker processes and routes
   the "Batch Job State Change" events to the real completion handler;
5. a progress line while it runs, then a summary; output copied to --out (sluice.local.summary).

stdout and stderr may close under it (`... 2>&1 | head -3`): writes then stop (sluice.local.streams),
the run goes on, its output is saved with its summary.json, and the servers it started are
stopped whatever happens.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.aws.clients import Clients, reset_clients
from sluice.contracts.status import RunStatus
from sluice.control.table.items import RunItem
from sluice.local import manifest as local_manifest
from sluice.local.emulator.bus import BusTap
from sluice.local.emulator.server import FAKE_CREDENTIALS
from sluice.local.folder import Folder, plural, suffixes
from sluice.local.manifest import Uploaded
from sluice.local.output import OutputDir
from sluice.local.progress import Progress
from sluice.local.router import Router
from sluice.local.services import NotePid, Services, metrics_note, start_services, stop_services, worker_env
from sluice.local.streams import pipe_safe
from sluice.local.summary import Ended, report, save, stopped_work, summarize
from sluice.local.upload import save_demo, submit

INTERRUPTED = "interrupted: the local run was stopped (Ctrl-C, SIGTERM or SIGHUP) and its workers with it"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each stops the run and what it started


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
    more = suffixes(getattr(args, "suffixes", None))
    follow = bool(getattr(args, "follow_links", False))
    if not source and (more or follow):
        flag = "--follow-links" if follow else "--suffixes"
        raise SystemExit(f"sluice: {flag} is for a folder flag: add --images, --texts, --videos or --audio DIR")
    folder = Folder.read(source, kind, more, follow) if source else None  # a missing or empty folder: now
    if args.model:
        local_manifest.model_specs(args)  # so does a --model file that is not there
    files = len(folder.images) if folder else None
    local_manifest.refuse_rejected(args, files)  # and what the manifest function would reject, in its words
    out = OutputDir.check(args.out)  # and an unusable --out, not after the run
    start = _Start(args, out, folder, started, note_pid)
    svc = Services()
    interrupted = threading.Event()

    def on_signal(*_: Any) -> None:
        interrupted.set()
        if not svc.waiting:  # uploading or planning: stop now, not after the last image
            raise KeyboardInterrupt

    # SIGHUP too: a closed terminal window or `tmux kill-session` must not orphan the servers.
    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        start_services(args, svc, note_pid)
        return _run(start, svc, interrupted)
    except KeyboardInterrupt:
        interrupted.set()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stop_services(args, svc, interrupted.is_set())


def _run(start: _Start, svc: Services, interrupted: threading.Event) -> int:
    from sluice.control.table.ledger import Ledger
    from sluice.local.emulator.executor import ExecutorConfig, LocalExecutor
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
    outcome, uploaded = submit(c, stack, router, args, start.folder)
    if outcome.get("status") not in ("submitted", "preparing"):
        rejected = {"outcome": outcome.get("status"), "run_id": outcome.get("run_id")}
        report({**rejected, "reasons": outcome.get("reasons", []), "endpoint": svc.endpoint}, args.json)
        return 1
    run_id = outcome["run_id"]
    ledger = Ledger(c.dynamodb, stack.names["RunsTable"])
    run_dir = start.out.for_run(run_id)
    if args.demo is not None and uploaded.count:
        save_demo(run_dir, uploaded.count)
    queues = (stack.names["GpuJobQueue"], stack.names["MnpJobQueue"], stack.names["PrepareJobQueue"])
    config = ExecutorConfig(
        run_id,
        queues,
        str(run_dir / "logs"),
        slots=args.slots or os.cpu_count() or 1,
        worker_env=worker_env(args, svc),
        on_pid=start.note_pid,
    )
    executor = LocalExecutor(c.batch, ledger, router, config)
    svc.executors.append(executor)
    from sluice.local.emulator.sweep import LocalSweep

    sweep = LocalSweep(c, stack, executor, run_id)  # ends a hung worker by the control plane's path
    # on stderr: --json keeps stdout for its one object; the beats count what is embedded before it commits
    progress = Progress(c, stack.names["RunsTable"], enabled=True, beats=stack.names["BeatsTable"])
    if not args.json:
        _say_started(args, outcome, svc.endpoint)
    svc.waiting = True
    row = _wait(_Discovery(executor, router), ledger, run_id, progress, interrupted, sweep)
    progress.end()
    stopped = None
    if row is None:  # interrupted: the run is concluded (failed) and still gets its summary.json
        row, stopped = _abandoned(executor, ledger, run_id, svc)
        if row is None:
            return 130
    summary = summarize(c, svc.tap, Ended(row, time.monotonic() - start.started, svc.endpoint, run_dir))
    summary.update(_more_summary(args, svc, uploaded, run_dir), interrupted=interrupted.is_set())
    summary["interrupted_work"] = stopped
    summary["stalled"] = [s.model_dump(include={"shard", "attempt", "after_s", "cause"}) for s in sweep.stalled()]
    save(run_dir, summary)
    report(summary, args.json)
    if interrupted.is_set():
        return 130
    return 0 if row.status is RunStatus.SUCCEEDED else 1


def _abandoned(executor: Any, ledger: Any, run_id: str, svc: Services) -> tuple[RunItem | None, str | None]:
    """Interrupted: what it stops named (with its logs), every worker stopped; the run's row as concluded."""
    from sluice.local.emulator.executor import abandon

    svc.waiting = False  # a second signal stops at once, without the summary
    now = ledger.get(run_id)
    stopped = stopped_work(executor, now is not None and now.status.final)
    svc.stopped += abandon(executor, INTERRUPTED)
    svc.executors.remove(executor)
    return ledger.get(run_id), stopped


def _more_summary(args: argparse.Namespace, svc: Services, uploaded: Uploaded, run_dir: Path) -> dict[str, Any]:
    """What the summary says that the run's records do not: skipped files, metrics, the input."""
    return {
        "skipped_files": len(uploaded.skipped) + len(uploaded.unreadable),
        "metrics": metrics_note(args, svc),
        "input_prefix": uploaded.uri if uploaded.count else None,
        "input_dir": str(run_dir / "input") if args.demo is not None and uploaded.count else None,
    }


def _say_started(args: argparse.Namespace, outcome: dict[str, Any], endpoint: str) -> None:
    layout = "multinode" if args.mode == "multinode" else "array"
    run_id = outcome["run_id"]
    print(
        f"sluice: run {run_id}: about {outcome['total_keys']} keys to prepare with "
        f"{len(outcome['job_ids'])} prepare job(s) (map, then reduce), then {layout} jobs; emulator {endpoint}"
        if outcome["status"] == "preparing"
        else f"sluice: run {run_id}: {outcome['total_keys']} {plural(local_manifest.content_source(args)[0])} in "
        f"{outcome['shards']} shard(s) "
        f"({layout}); emulator {endpoint}",
        file=sys.stderr,
    )


def _indexing(row: RunItem, executor: Any) -> bool:
    """The run's index stage is still to come or running (the completion handler submitted it)."""
    from sluice.control.indexing.stage import pending

    if not pending(row) or row.index is None:
        return False
    return row.index.state == "submitted" or bool(executor.discover())


DISCOVER_EVERY_S = 2.0  # a job submitted other than by this process's handlers is found within this


class _Discovery:
    """The executor, whose discover() the wait loop calls when a new job of the run may exist.

    That is after this process's handlers ran (the Router delivered an event: a handler may have
    submitted the run's jobs, a retry pass or the index stage) or the sweep acted (a stalled
    shard re-submitted), and otherwise every DISCOVER_EVERY_S. A discover lists each of Sluice's
    queues in every job status (21 ListJobs): at every turn of the loop it was most of what a
    local run asked of its emulator, and a good part of the emulator's and this process's CPU.
    """

    def __init__(self, executor: Any, router: Router) -> None:
        self.executor = executor
        self._router = router
        self._seen = -1  # the Router's deliveries at the last discover
        self._next = 0.0

    def __call__(self, woken: bool = False) -> list[Any]:
        """The run's new jobs: discover() when due (or `woken`), else none."""
        delivered = sum(self._router.delivered.values())
        now = time.monotonic()
        if not woken and delivered == self._seen and now < self._next:
            return []
        self._seen, self._next = delivered, now + DISCOVER_EVERY_S
        return list(self.executor.discover())


def _wait(
    look: _Discovery, ledger: Any, run_id: str, progress: Progress, interrupted: threading.Event, sweep: Any
) -> RunItem | None:
    """Run the jobs until the run is final and no worker is left; None when interrupted."""
    executor = look.executor
    woken = False
    while not interrupted.is_set():
        look(woken)
        executor.step()
        woken = bool(sweep())
        row: RunItem | None = ledger.get(run_id)
        progress.show(row, executor.running())
        final = row is not None and row.status.final and not _indexing(row, executor)
        if final and executor.idle:
            progress.show(row, 0, force=True)
            return row
        if executor.idle and not final and not look():
            time.sleep(0.2)  # the completion handler may still submit a retry pass
        time.sleep(0.1)
    return None
