"""The local executor's worker processes: started with the AWS_BATCH_* variables Batch sets, signalled as a group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from sluice.control.policy import TIMEOUT_REASON
from sluice.local.emulator.jobs import Task


def launch(task: Task, worker_env: Mapping[str, str], log_dir: Path) -> subprocess.Popen[bytes]:
    """Start the task's attempt as `python -m MODULE`, in a session of its own, its output in a log per attempt."""
    job = task.job
    env = {
        **os.environ,
        **worker_env,
        **job.env,
        "AWS_BATCH_JOB_ID": task.job_id,
        "AWS_BATCH_JOB_ATTEMPT": str(task.attempt),
        "AWS_BATCH_JQ_NAME": job.queue.rsplit("/", 1)[-1],
    }
    if job.kind == "array":
        env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(task.index)
    elif job.kind == "multinode":
        env.update(
            AWS_BATCH_JOB_NODE_INDEX=str(task.index),
            AWS_BATCH_JOB_NUM_NODES=str(job.size),
            AWS_BATCH_JOB_MAIN_NODE_INDEX="0",
        )
    name = task.job_id.replace(":", "_").replace("#", "_")
    task.log_path = str(log_dir / f"{name}-attempt{task.attempt}.log")
    with open(task.log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", *job.module],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the workers ourselves
        )


def stop_all(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM every worker, then SIGKILL what is still running after grace_s."""
    for p in procs:
        signal_group(p, signal.SIGTERM)
        signal_group(p, signal.SIGCONT)  # a stopped worker gets its SIGTERM only once continued
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_group(p, signal.SIGKILL)
            p.wait()


def end_if_timed_out(task: Task) -> None:
    """An attempt past its job's timeout (from its start, as Batch's startedAt) is killed; reaped FAILED.

    As Batch does ("Job timeouts"): the attempt ends with TIMEOUT_REASON and is not retried.
    """
    limit = task.job.timeout_s
    if task.proc is None or task.proc.poll() is not None or not limit:
        return
    if time.time() * 1000 - task.started_ms > int(limit) * 1000:
        task.terminated = TIMEOUT_REASON
        signal_group(task.proc, signal.SIGKILL)
        task.proc.wait()


def signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    """Signal the worker's process group (it leads a session of its own); one already gone is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)
