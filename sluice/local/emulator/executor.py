"""Local executor: runs the jobs submitted to (moto) AWS Batch as real worker processes.

moto accepts the jobs but runs none (it marks them SUCCEEDED at once and emits no events).
This executor reads each new job of its run (tag sluice:run-id; an emulator kept running
holds earlier runs' jobs too, which it never runs) back from the Batch API (sluice.local.emulator.jobs),
runs its array children or MNP
nodes as `python -m gpu_worker` processes (a job whose command is `python -m MODULE ARGS` as
that: a prepare job's `sluice.prepare STAGE`, the index stage's `sluice.index build` or its
fleet stages' `sluice.index stage ...`, each after the jobs it depends on: an array job when
every child ended; a job whose dependency failed fails unrun, "Dependent Job failed")
with the AWS_BATCH_* variables Batch would set (sluice.local.emulator.workers),
applies the job's retry strategy (sluice.local.emulator.retry) to each failed attempt as Batch does
(sluice.control.policy.evaluate_on_exit: RETRY puts the child back in the queue while attempts
remain, EXIT fails it), honours a concurrency limit, and emits the same "Batch Job State
Change" events Batch would to `deliver`.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sluice.contracts.status import JobStatus
from sluice.control.policy import HOST_LOST_REASON
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.events import JobChange, batch_job_state_change
from sluice.local.emulator.events import attempt as attempt_entry
from sluice.local.emulator.jobs import LocalJob, Task, dependencies, fail_all, read_job
from sluice.local.emulator.retry import strategy_of
from sluice.local.emulator.workers import end_if_timed_out, launch, signal_group, stop_all

Deliver = Callable[[dict[str, Any]], object]
EXITED = "Essential container in task exited"
STATUSES = tuple(JobStatus)


@dataclass(frozen=True)
class ExecutorConfig:
    """What a LocalExecutor runs, and how."""

    run_id: str  # only this run's jobs (tag sluice:run-id): a kept emulator holds earlier runs' jobs too
    queues: tuple[str, ...]  # Sluice's job queues (names or ARNs)
    log_dir: str  # a log file per worker attempt
    slots: int = 1  # workers running at once
    worker_env: Mapping[str, str] = field(default_factory=dict)  # on top of each job's own environment
    on_pid: Callable[[int], None] | None = None  # told every worker's pid (--pid-file)
    out: TextIO | None = None  # failed workers' log tails (default: sys.stderr when the executor starts)
    # Only jobs created at or after this (epoch ms, Batch's createdAt): an executor started later for
    # the same run (an index rerun) leaves the jobs an earlier one ran. None: every job of the run.
    since_ms: int | None = None


class LocalExecutor:
    """Discovers the run's submitted jobs and runs them; call `step()` until `idle`."""

    def __init__(self, batch: Any, ledger: Ledger, deliver: Deliver, config: ExecutorConfig) -> None:
        self._batch = batch
        self._ledger = ledger
        self._deliver = deliver
        self._cfg = config
        self._slots = max(1, config.slots)
        self._log_dir = Path(config.log_dir)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._on_pid = config.on_pid or (lambda pid: None)
        self._out = config.out or sys.stderr
        self.jobs: dict[str, LocalJob] = {}
        self._foreign: set[str] = (
            set()
        )  # other runs' jobs (and jobs that are not Sluice's): never run, never read again
        self._definition_strategies: dict[str, dict[str, Any] | None] = {}
        self._stopping = False

    # ---- discovery -------------------------------------------------------------------------

    def discover(self) -> list[LocalJob]:
        """The run's new parent jobs in Sluice's queues (moto lists them under SUCCEEDED at once).

        Jobs of other runs (an emulator kept with --keep holds every earlier run's) are noted
        and never run: a run executes only its own jobs.
        """
        ids = list(dict.fromkeys(i for q in self._cfg.queues for status in STATUSES for i in self._list_new(q, status)))
        new = []
        for i in range(0, len(ids), 100):  # DescribeJobs takes at most 100 job ids
            for j in self._batch.describe_jobs(jobs=ids[i : i + 100])["jobs"]:
                run_id = (j.get("tags") or {}).get("sluice:run-id")
                earlier = self._cfg.since_ms is not None and int(j.get("createdAt") or 0) < self._cfg.since_ms
                if run_id != self._cfg.run_id or earlier:
                    self._foreign.add(j["jobId"])  # not Sluice's, another run's, or an earlier executor's
                    continue
                row = self._ledger.get(run_id)
                job = read_job(j, row, strategy_of(self._batch, self._definition_strategies, j, row))
                if job is not None:
                    self.jobs[job.job_id] = job
                    new.append(job)
                    self._emit(job, None, JobStatus.PENDING)
        return new

    def _list_new(self, queue: str, status: JobStatus) -> list[str]:
        """Parent job ids in `queue` with `status` that this executor does not know yet."""
        ids: list[str] = []
        token: str | None = None
        while True:
            kw: dict[str, Any] = {"jobQueue": queue, "jobStatus": status.value}
            if token:
                kw["nextToken"] = token
            resp = self._batch.list_jobs(**kw)
            ids += [
                j["jobId"]
                for j in resp["jobSummaryList"]
                if ":" not in j["jobId"]
                and "#" not in j["jobId"]
                and j["jobId"] not in self.jobs
                and j["jobId"] not in self._foreign
            ]
            token = resp.get("nextToken")
            if not token:
                return ids

    # ---- running ---------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return all(j.done for j in self.jobs.values())

    def running(self) -> int:
        return sum(1 for j in self.jobs.values() for t in j.tasks if t.proc is not None)

    def step(self) -> None:
        """Reap finished workers, start queued ones, finish jobs; emits events as Batch would."""
        for task in (t for job in list(self.jobs.values()) if not job.done for t in job.tasks):
            end_if_timed_out(task)
            if task.proc is not None and task.proc.poll() is not None:
                self._reap(task)
        free = self._slots - self.running()
        for job in self.jobs.values():
            deps = "met" if job.done or self._stopping else dependencies(job, self.jobs)
            if deps == "failed":  # as Batch does: a job whose dependency failed fails
                fail_all(job)
                self._emit(job, None, JobStatus.FAILED, reason="Dependent Job failed")
            if job.done or self._stopping or deps != "met":
                continue
            queued = (JobStatus.PENDING, JobStatus.RUNNABLE)
            pending = [t for t in job.tasks if t.status in queued and t.proc is None]
            if job.kind == "multinode":
                # Gang scheduling: every node starts together once the job is admitted.
                if pending and len(pending) == len(job.tasks) and (free >= len(pending) or self.running() == 0):
                    for t in pending:
                        self._start(t)
                    free -= len(pending)
                continue
            for t in pending:
                if free <= 0:
                    break
                self._start(t)
                free -= 1
        for job in self.jobs.values():
            if not job.done and all(t.status.terminal for t in job.tasks):
                self._finish(job)

    def _start(self, task: Task) -> None:
        job = task.job
        task.attempt += 1
        for status in (JobStatus.RUNNABLE, JobStatus.STARTING):
            task.status = status
            self._emit(job, task, status)
        task.proc = launch(task, self._cfg.worker_env, self._log_dir)
        self._on_pid(task.proc.pid)
        task.started_ms = int(time.time() * 1000)
        task.attempts.append(attempt_entry(task.started_ms, None, None, "Task is running"))
        task.status = JobStatus.RUNNING
        self._emit(job, task, JobStatus.RUNNING)
        if job.kind == "multinode" and task.index == 0:
            self._emit(job, None, JobStatus.RUNNING)

    def _reap(self, task: Task) -> None:
        assert task.proc is not None
        rc = task.proc.returncode
        pid = task.proc.pid
        task.proc = None
        now = int(time.time() * 1000)
        if task.terminated is not None:  # TerminateJob killed it: FAILED with its reason, never retried (as Batch)
            reason, exit_code = task.terminated, None
        elif rc < 0 and not self._stopping:
            # A worker killed by a signal we did not send looks, from the job's side, like a lost
            # host (Spot reclaim): Batch reports HOST_LOST_REASON, and the retry strategy decides.
            reason, exit_code = HOST_LOST_REASON.format(instance=f"local-{pid}"), None
        else:
            reason, exit_code = EXITED, rc
        said = worker_said(task.log_path) if rc and exit_code is not None else None
        task.attempts[-1] = attempt_entry(task.started_ms, now, exit_code, reason, said)
        if rc == 0:
            task.status = JobStatus.SUCCEEDED
            self._emit(task.job, task, JobStatus.SUCCEEDED, exit_code=0, reason=reason)
        elif task.terminated is None and task.job.action(task, status_reason=reason, exit_code=exit_code) == "RETRY":
            task.status = JobStatus.RUNNABLE  # back to the queue for the next attempt
            self._emit(task.job, task, JobStatus.RUNNABLE, reason=reason)
        else:
            task.status = JobStatus.FAILED
            self._emit(task.job, task, JobStatus.FAILED, exit_code=exit_code, reason=reason)
            self._out.write(f"worker {task.job_id} failed (exit {rc}); log: {task.log_path}\n")
            tail = Path(task.log_path).read_text(errors="replace").strip().splitlines()[-3:]
            for line in tail:
                self._out.write(f"    {line[:300]}\n")

    def _finish(self, job: LocalJob) -> None:
        job.done = True
        failed = [t for t in job.tasks if t.status is JobStatus.FAILED]
        job.failed = bool(failed)
        if job.kind == "single":
            return  # the plain job's own SUCCEEDED/FAILED was its task's event
        # The parent of an array fails if any child fails; an MNP job fails when a node fails.
        status = JobStatus.FAILED if failed else JobStatus.SUCCEEDED
        reason = f"{len(failed)} of {len(job.tasks)} failed" if failed else None
        self._emit(job, None, status, reason=reason)

    def _emit(
        self,
        job: LocalJob,
        task: Task | None,
        status: JobStatus,
        *,
        exit_code: int | None = None,
        reason: str | None = None,
    ) -> None:
        target_id, idx = task.event_target() if task is not None else job.event_target()
        change = JobChange(
            job_id=target_id,
            job_name=job.name,
            job_queue=job.queue,
            status=status,
            run_id=job.run_id,
            attempts=list(task.attempts) if task else None,
            status_reason=reason,
            exit_code=exit_code,
            array_index=idx.get("array_index"),
            array_size=idx.get("array_size"),
            node_index=idx.get("node_index"),
            num_nodes=idx.get("num_nodes"),
            max_attempts=job.max_attempts,
        )
        self._deliver(batch_job_state_change(change))

    def stop(self, grace_s: float = 5.0) -> int:
        """Stop every worker (SIGTERM, then SIGKILL after grace_s). Returns how many were running."""
        self._stopping = True
        procs = [t.proc for j in self.jobs.values() for t in j.tasks if t.proc is not None]
        stop_all(procs, grace_s)
        return len(procs)


def worker_said(log_path: str) -> str | None:
    """The worker's own last word on why it ended (`sluice-worker: <reason>`, gpu_worker.errors.report), if any.

    Batch's container.reason in the attempt: ECS puts its own there (an OOM kill); the local
    executor puts the worker's, so the run's reason quotes a configuration error's cause.
    """
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    said = [line for line in lines if line.startswith("sluice-worker: ")]
    return said[-1].removeprefix("sluice-worker: ").strip() if said else None


def terminate(jobs: Mapping[str, LocalJob], job_id: str, reason: str, emit: Callable[..., None]) -> int:
    """TerminateJob: SIGKILL the job's running workers (a stopped one too); cancel what has not started.

    `job_id` names an array child, an MNP node, a plain job, or a whole array or MNP job. A job
    already finished is left as it is. Returns the workers killed; their end is reaped as FAILED.
    """
    parent = job_id.split(":", 1)[0].split("#", 1)[0]
    job = jobs.get(parent)
    if job is None or job.done:
        return 0
    killed = 0
    for t in job.tasks:
        if t.status.terminal or not (job_id == parent or t.job_id == job_id):
            continue
        t.terminated = reason
        if t.proc is not None:
            signal_group(t.proc, signal.SIGKILL)  # SIGKILL ends a SIGSTOPped process too
            killed += 1
        else:
            t.status = JobStatus.FAILED
            emit(job, t, JobStatus.FAILED, reason=reason)
    return killed


def abandon(ex: LocalExecutor, reason: str) -> int:
    """The run is interrupted: stop every worker and fail what did not finish, with `reason`, in events.

    As Batch reports a terminated job: the completion handler settles those shards failed and
    concludes the run, so an emulator that outlives the run does not keep it RUNNING. A worker
    that had already exited is reaped as it ended. Returns how many workers were running.
    """
    for job in ex.jobs.values():
        for task in job.tasks:
            if task.proc is not None and task.proc.poll() is not None:
                ex._reap(task)
    running = ex.stop()
    now = int(time.time() * 1000)
    for job in ex.jobs.values():
        if job.done:
            continue
        for task in job.tasks:
            if task.status.terminal:
                continue
            if task.proc is not None:
                task.proc = None
                task.attempts[-1] = attempt_entry(task.started_ms, now, None, reason)
            task.terminated, task.status = reason, JobStatus.FAILED
            ex._emit(job, task, JobStatus.FAILED, reason=reason)
        ex._finish(job)
    return running
