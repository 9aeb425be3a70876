"""Local executor: runs the jobs submitted to (moto) AWS Batch as real worker processes.

moto accepts the jobs but runs none (it marks them SUCCEEDED at once and emits no events).
This executor reads each new job of its run (tag sluice:run-id; an emulator kept running
holds earlier runs' jobs too, which it never runs) back from the Batch API, runs its array children or MNP
nodes as `python -m gpu_worker` processes (a job whose command is `python -m MODULE ARGS` as
that: a prepare job's `sluice.prepare STAGE`, the index stage's `sluice.index build` or its
fleet stages' `sluice.index stage ...`, each after the jobs it depends on: an array job when
every child ended; a job whose dependency failed fails unrun, "Dependent Job failed")
with the AWS_BATCH_* variables Batch would set,
applies the job's retry strategy to each failed attempt as Batch does
(sluice.control.policy.evaluate_on_exit: RETRY puts the child back in the queue while attempts
remain, EXIT fails it), honours a concurrency limit, and emits the same "Batch Job State
Change" events Batch would to `deliver`.

The retry strategy is the job's own `retryStrategy` from DescribeJobs. moto (5.2.5) does not
echo the one SubmitJob sent, so then: the rules (`evaluateOnExit`) are the job definition's
(DescribeJobDefinitions; moto lower-cases their actions, which Batch matches without regard
to case), or sluice.control.policy's when the definition has none; and `attempts` is the plan's
for a GPU job, which is what Sluice's SubmitJob sets (sluice.control.policy.retry_strategy(plan.attempts))
and which overrides the definition's, and the definition's for a CPU job (prepare, index), as
Sluice's SubmitJob passes the definition's own there.

moto keeps array jobs' environment but drops MNP `nodeOverrides`, so node count and
environment of a multi-node job come from its run (ledger row and plan), found by the run tag.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sluice.contracts.status import JobStatus
from sluice.control.policy import EVALUATE_ON_EXIT, HOST_LOST_REASON, TIMEOUT_REASON, evaluate_on_exit
from sluice.control.table.items import RunItem
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.events import JobChange, batch_job_state_change
from sluice.local.emulator.events import attempt as attempt_entry

Deliver = Callable[[dict[str, Any]], object]
Rules = Sequence[Mapping[str, str]]
EXITED = "Essential container in task exited"
STATUSES = tuple(JobStatus)
DEFAULT_ATTEMPTS = 3  # the manifest's default (sluice.contracts.manifest), when the plan cannot be read


@dataclass
class Task:
    """One array child, plain job or MNP node: one worker process per attempt."""

    job: LocalJob
    index: int | None  # array index / node index; None for a plain job
    attempt: int = 0
    attempts: list[dict[str, Any]] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    started_ms: int = 0
    status: JobStatus = JobStatus.PENDING
    log_path: str = ""
    terminated: str | None = None  # TerminateJob's reason: the attempt fails with it, and is not retried

    @property
    def job_id(self) -> str:
        if self.index is None:
            return self.job.job_id
        return f"{self.job.job_id}#{self.index}" if self.job.kind == "multinode" else f"{self.job.job_id}:{self.index}"

    def event_target(self) -> tuple[str, dict[str, int | None]]:
        """The job id an event about this task names, and its array/node index field."""
        if self.job.kind == "single":
            return self.job.job_id, {}
        return self.job_id, {"array_index" if self.job.kind == "array" else "node_index": self.index}


@dataclass
class LocalJob:
    """A submitted job as read back from the Batch API (plus its run's plan)."""

    job_id: str
    name: str
    queue: str
    kind: str  # array | single | multinode
    size: int  # children or nodes (1 for a plain job)
    env: dict[str, str]
    run_id: str
    max_attempts: int
    rules: Rules = EVALUATE_ON_EXIT  # the retry strategy's evaluateOnExit
    tasks: list[Task] = field(default_factory=list)
    done: bool = False
    module: tuple[str, ...] = ("gpu_worker",)  # what `python -m` runs: the GPU worker, or sluice.prepare's stage
    depends_on: tuple[str, ...] = ()  # job ids that must succeed first (dependsOn)
    failed: bool = False
    timeout_s: int | None = None  # timeout.attemptDurationSeconds: an attempt past it is ended, not retried

    def event_target(self) -> tuple[str, dict[str, int | None]]:
        """The job id an event about the whole job names, and its size field."""
        if self.kind == "array":
            return self.job_id, {"array_size": self.size}
        if self.kind == "multinode":
            return self.job_id, {"num_nodes": self.size}
        return self.job_id, {}

    def action(self, task: Task, *, status_reason: str, exit_code: int | None) -> str:
        """RETRY or EXIT for the task's failed attempt: the retry strategy, then the attempts left."""
        action = evaluate_on_exit(self.rules, status_reason=status_reason, reason=None, exit_code=exit_code)
        return action if task.attempt < self.max_attempts else "EXIT"


def read_job(j: dict[str, Any], row: RunItem | None, strategy: dict[str, Any]) -> LocalJob | None:
    """A LocalJob from DescribeJobs' view of a parent job, its run's RUN item and its retry strategy."""
    run_id = (j.get("tags") or {}).get("sluice:run-id")
    if not run_id:
        return None
    layout = next((x for x in (row.jobs or []) if x.id == j["jobId"]), None) if row else None
    env = {e["name"]: e["value"] for e in (j.get("container") or {}).get("environment", [])}
    env.pop("AWS_BATCH_JOB_ID", None)
    if "nodeProperties" in j or (layout and layout.kind == "multinode"):
        if layout is None or row is None:
            return None
        env = {
            "SLUICE_PLAN_URI": str(row.plan_uri),
            "SLUICE_RUN_ID": run_id,
            "SLUICE_SHARD_OFFSET": str(layout.shard_offset),
            # A stalled MNP job re-submitted by Sluice (sluice.control.sweep.stall): its attempts follow the ended ones.
            **({"SLUICE_ATTEMPT_BASE": str(layout.attempt_base)} if layout.attempt_base else {}),
        }
        kind, size = "multinode", int(layout.shard_count)
    elif (j.get("arrayProperties") or {}).get("size"):
        kind, size = "array", int(j["arrayProperties"]["size"])
    else:
        kind, size = "single", 1
    attempts = int(strategy.get("attempts") or 0) or DEFAULT_ATTEMPTS
    rules = tuple(strategy.get("evaluateOnExit") or ())
    job = LocalJob(j["jobId"], j["jobName"], j["jobQueue"], kind, size, env, run_id, attempts, rules)
    command = [str(c) for c in (j.get("container") or {}).get("command") or []]
    if command[:2] == ["python", "-m"] and len(command) > 2:
        job.module = tuple(command[2:])  # a prepare job, an index job or stage (sluice.control.indexing.jobs)
    job.depends_on = tuple(d["jobId"] for d in j.get("dependsOn") or [] if d.get("jobId"))
    job.timeout_s = (j.get("timeout") or {}).get("attemptDurationSeconds")
    job.tasks = [Task(job, None)] if kind == "single" else [Task(job, i) for i in range(size)]
    return job


def dependencies(job: LocalJob, jobs: Mapping[str, LocalJob]) -> str:
    """ "met" once every job it depends on (dependsOn) succeeded, "failed" when one failed, else "waiting"."""
    deps = [jobs.get(d) for d in job.depends_on]
    if any(d is not None and d.done and d.failed for d in deps):
        return "failed"
    return "met" if all(d is not None and d.done for d in deps) else "waiting"


def fail_all(job: LocalJob) -> None:
    """Mark every task of the job, and the job, FAILED without running them."""
    for t in job.tasks:
        t.status = JobStatus.FAILED
    job.done = job.failed = True


def definition_strategy(batch: Any, cache: dict[str, dict[str, Any] | None], arn: str | None) -> dict[str, Any] | None:
    """The job definition's retryStrategy, None when it has none (cached per ARN in `cache`)."""
    if not arn:
        return None
    if arn not in cache:
        defs = batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
        strategy = defs[0].get("retryStrategy") if defs else None
        cache[arn] = dict(strategy) if strategy else None
    return cache[arn]


def plan_attempts(plan_uri: str | None) -> int:
    """The plan's attempts (what Sluice's SubmitJob puts in retryStrategy); the default if unreadable."""
    from sluice.aws.clients import client
    from sluice.aws.store import ObjectStore
    from sluice.contracts.plan import load_plan

    if not plan_uri:
        return DEFAULT_ATTEMPTS
    try:
        return load_plan(ObjectStore(client("s3")).get, plan_uri).attempts
    except Exception:
        return DEFAULT_ATTEMPTS


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
                job = read_job(j, row, self._retry_strategy(j, row))
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

    def _retry_strategy(self, j: dict[str, Any], row: RunItem | None) -> dict[str, Any]:
        """The job's retryStrategy, or what Batch would apply when moto does not echo it (module docstring).

        A CPU job (no SLUICE_PLAN_URI: a prepare or index job) gets its definition's attempts too:
        Sluice's SubmitJob passes the definition's own (a unit test compares them).
        """
        own = j.get("retryStrategy")
        if own:
            return dict(own)
        env = {e["name"]: e["value"] for e in (j.get("container") or {}).get("environment", [])}
        defined = definition_strategy(self._batch, self._definition_strategies, j.get("jobDefinition"))
        rules = tuple(defined.get("evaluateOnExit") or ()) if defined is not None else None
        if "SLUICE_PLAN_URI" not in env and defined is not None and defined.get("attempts"):
            attempts = int(defined["attempts"])
        else:
            attempts = plan_attempts(env.get("SLUICE_PLAN_URI") or (row.plan_uri if row else None))
        return {"attempts": attempts, "evaluateOnExit": list(rules if rules is not None else EVALUATE_ON_EXIT)}

    # ---- running ---------------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        return all(j.done for j in self.jobs.values())

    def running(self) -> int:
        return sum(1 for j in self.jobs.values() for t in j.tasks if t.proc is not None)

    def step(self) -> None:
        """Reap finished workers, start queued ones, finish jobs; emits events as Batch would."""
        for task in (t for job in list(self.jobs.values()) if not job.done for t in job.tasks):
            _end_if_timed_out(task)
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
        env = {
            **os.environ,
            **self._cfg.worker_env,
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
        task.log_path = str(self._log_dir / f"{name}-attempt{task.attempt}.log")
        with open(task.log_path, "wb") as log:
            task.proc = subprocess.Popen(
                [sys.executable, "-m", *job.module],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches us only; we stop the workers ourselves
            )
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
        task.attempts[-1] = attempt_entry(task.started_ms, now, exit_code, reason)
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
        for p in procs:
            _signal_group(p, signal.SIGTERM)
            _signal_group(p, signal.SIGCONT)  # a stopped worker gets its SIGTERM only once continued
        deadline = time.monotonic() + grace_s
        for p in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        return len(procs)


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
            _signal_group(t.proc, signal.SIGKILL)  # SIGKILL ends a SIGSTOPped process too
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


def _end_if_timed_out(task: Task) -> None:
    """An attempt past its job's timeout (from its start, as Batch's startedAt) is killed; reaped FAILED.

    As Batch does ("Job timeouts"): the attempt ends with TIMEOUT_REASON and is not retried.
    """
    limit = task.job.timeout_s
    if task.proc is None or task.proc.poll() is not None or not limit:
        return
    if time.time() * 1000 - task.started_ms > int(limit) * 1000:
        task.terminated = TIMEOUT_REASON
        _signal_group(task.proc, signal.SIGKILL)
        task.proc.wait()


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, sig)
