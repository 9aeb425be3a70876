"""The local run's wait loop lists the emulator's queues only when a job of the run may be new."""

from __future__ import annotations

import io

from sluice.contracts.status import JobStatus
from sluice.control.table.ledger import Ledger
from sluice.local import run
from sluice.local.emulator.executor import ExecutorConfig, LocalExecutor
from sluice.local.router import Router

RUN = "run-discovery"


def test_the_queues_are_listed_when_a_handler_ran_the_sweep_acted_or_every_few_seconds(
    aws, stack, tmp_path, monkeypatch
):
    monkeypatch.setattr(run, "DISCOVER_EVERY_S", 3600.0)  # not due by time until the end, however slow the machine
    queues = (stack.names["GpuJobQueue"], stack.names["MnpJobQueue"], stack.names["PrepareJobQueue"])
    listed: list[str] = []  # one entry a ListJobs call
    aws.batch.meta.events.register("before-call.batch.ListJobs", lambda **_: listed.append("ListJobs"))
    router = Router(stack, {"SLUICE_LOCAL_MODE": "1"})
    config = ExecutorConfig(RUN, queues, str(tmp_path / "logs"), out=io.StringIO())
    look = run._Discovery(
        LocalExecutor(aws.batch, Ledger(aws.dynamodb, stack.names["RunsTable"]), router, config), router
    )
    per_look = len(queues) * len(JobStatus)  # every queue in every status

    assert look() == [] and len(listed) == per_look  # the first look
    assert look() == [] and len(listed) == per_look  # nothing ran here since: not listed again
    job_id = aws.batch.submit_job(
        jobName="sluice-test",
        jobQueue=stack.names["GpuJobQueue"],
        jobDefinition=stack.names["WorkerJobDefinition"],
        tags={"sluice:run-id": RUN},
    )["jobId"]
    assert look() == [] and len(listed) == per_look  # submitted elsewhere: found at the next due look
    (found,) = look(woken=True)  # the sweep acted (it re-submits a stalled shard itself)
    assert found.job_id == job_id and len(listed) == 2 * per_look
    # Finding it delivered the job's PENDING to this process's handlers (the Router): one may have
    # submitted a job, so the next turn looks again; then not until something happens.
    assert sum(router.delivered.values()) > 0
    assert look() == [] and len(listed) == 3 * per_look
    assert look() == [] and len(listed) == 3 * per_look
    monkeypatch.setattr(run, "DISCOVER_EVERY_S", 0.0)
    assert look(woken=True) == [] and len(listed) == 4 * per_look
    assert look() == [] and len(listed) == 5 * per_look  # every DISCOVER_EVERY_S in any case
