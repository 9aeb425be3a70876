"""A submitted job as the local executor holds it: read back from the Batch API, its tasks, what it waits on.

moto keeps array jobs' environment but drops MNP `nodeOverrides`, so node count and
environment of a multi-node job come from its run (ledger row and plan), found by the run tag.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.contracts.status import JobStatus
from sluice.control.policy import EVALUATE_ON_EXIT, evaluate_on_exit
from sluice.control.table.items import RunItem
from sluice.local.emulator.retry import DEFAULT_ATTEMPTS

Rules = Sequence[Mapping[str, str]]


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
