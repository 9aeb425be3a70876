"""What a local run starts and stops: the emulator, Prometheus, its workers' scratch folder and environment."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.local.emulator.bus import BusTap
from sluice.local.emulator.server import FAKE_CREDENTIALS, MotoServer, configure

LOCAL_CHUNK_KEYS = 16
NotePid = Callable[[int], None]


@dataclass
class Services:
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


def start_services(args: argparse.Namespace, svc: Services, note_pid: NotePid) -> None:
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


def stop_services(args: argparse.Namespace, svc: Services, interrupted: bool) -> None:
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


def _what_stopped(svc: Services, workers: int) -> str:
    """What an interrupted run stopped: its workers, and only the servers it started itself."""
    parts = [f"{workers} running worker(s)"]
    parts += [name for name, it in (("the emulator", svc.server), ("Prometheus", svc.prom)) if it is not None]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]


def _kept(svc: Services) -> str:
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


def worker_env(args: argparse.Namespace, svc: Services) -> dict[str, str]:
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
        # Several workers share this host's cores (--slots), each with torch threads for all of them:
        # idle OpenMP threads sleep instead of spinning on a core another worker needs (about a
        # quarter of a local run's CPU time on 2 cores: docs/performance.md).
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
    }
    if svc.metrics_url:
        env["SLUICE_REMOTE_WRITE_URL"] = svc.metrics_url
        env["SLUICE_WORKER_PUSH_INTERVAL_S"] = os.environ.get("SLUICE_WORKER_PUSH_INTERVAL_S", "1")
    return env


def metrics_note(args: argparse.Namespace, svc: Services) -> str | None:
    """Where the run's metrics are, or that they went with the Prometheus this run started."""
    if svc.prom is not None:
        if args.keep:
            return str(svc.prom.url)
        return "local Prometheus stopped with the run (use --keep to query it with sluice metrics)"
    return svc.metrics_url or None
