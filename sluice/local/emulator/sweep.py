"""The sweep in local mode: the control plane's stall and waiting checks, every couple of seconds.

On AWS the completion function sweeps every 5 minutes (sluice.control.sweep.reconcile). Locally the
same stall code (sluice.control.sweep.stall) runs from the wait loop at a short cadence, against the
emulator, with TerminateJob going to the local executor (moto's Batch runs nothing, so only the
executor can end a worker). The rest of the sweep (settling shards from Batch's job states) is
not run here: moto marks every job SUCCEEDED at once, so its job states say nothing locally.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, cast

from sluice.aws.clients import Clients
from sluice.contracts.events import StalledAttempt
from sluice.control.context import Context
from sluice.control.sweep.stall import beat_items, stalled_attempts, sweep_stalls
from sluice.control.sweep.tail import sweep_tail
from sluice.local.emulator.executor import LocalExecutor, terminate
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_batch import BatchClient

SWEEP_EVERY_S = 2.0
SPLIT_ENV = "SLUICE_SPLIT_"
JOB_STATE_FUNCTION = "HandleJobStateChangeFunction"


class LocalBatch:
    """The emulator's Batch client, with TerminateJob sent to the executor that runs the workers."""

    def __init__(self, batch: Any, executor: LocalExecutor) -> None:
        self._batch = batch
        self._executor = executor

    def terminate_job(self, *, jobId: str, reason: str) -> dict[str, Any]:
        terminate(self._executor.jobs, jobId, reason, self._executor._emit)  # the events Batch would send
        return {}

    def describe_jobs(self, *, jobs: list[str]) -> dict[str, Any]:
        """The emulator's descriptions, with the status the executor's tasks have (moto's is SUCCEEDED at once)."""
        tasks = {t.job_id: t for j in self._executor.jobs.values() for t in j.tasks}
        described = {d["jobId"]: d for d in self._batch.describe_jobs(jobs=jobs).get("jobs", [])}
        out = []
        for job_id in jobs:
            d = dict(described.get(job_id) or ({"jobId": job_id} if job_id in tasks else {}))
            if job_id in tasks:
                d["status"] = tasks[job_id].status.value
            if d:
                out.append(d)
        return {"jobs": out}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._batch, name)


class LocalSweep:
    """Runs the stall sweep for one run when it is due; call it from the wait loop."""

    def __init__(self, c: Clients, stack: Any, executor: LocalExecutor, run_id: str, every_s: float = SWEEP_EVERY_S):
        clients = Clients(
            s3=c.s3, dynamodb=c.dynamodb, batch=cast("BatchClient", LocalBatch(c.batch, executor)), events=c.events
        )
        # The shell's SLUICE_SPLIT_* override the stack's: a local run tunes (or turns off) the tail's splits.
        env = {**stack.env_for(JOB_STATE_FUNCTION), **{k: v for k, v in os.environ.items() if k.startswith(SPLIT_ENV)}}
        self.ctx = Context.build(Settings.from_env(env), clients)
        self._run_id = run_id
        self._every = every_s
        self._next = 0.0
        self.actions: list[str] = []

    def __call__(self) -> list[str]:
        """The sweep's actions this time (nothing when it is not due yet, or the run is not in flight)."""
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self._every
        row = self.ctx.ledger.get(self._run_id)
        if row is None:
            return []
        items = beat_items(self.ctx.clients.dynamodb, self.ctx.settings.beats_table, self._run_id)
        done = sweep_stalls(self.ctx, row, now=time.time(), items=items)
        fresh = self.ctx.ledger.get(self._run_id) if done else row
        done += sweep_tail(self.ctx, fresh or row, now=time.time(), items=items)
        self.actions += done
        return done

    def stalled(self) -> list[StalledAttempt]:
        return stalled_attempts(self.ctx.clients.dynamodb, self.ctx.settings.runs_table, self._run_id)
