"""The local executor's retry decisions: the job's retry strategy as moto gives it back, applied as Batch does."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time

import pytest

from sluice.contracts.status import JobStatus
from sluice.control.policy import EVALUATE_ON_EXIT, HOST_LOST_REASON, retry_strategy
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.executor import EXITED, ExecutorConfig, LocalExecutor
from sluice.local.emulator.jobs import LocalJob, Task
from sluice.local.emulator.retry import strategy_of
from tests import pace
from tests.plans import run_plan

RUN = "run-executor"


@pytest.fixture
def submitted(aws, stack, tmp_path):
    """An executor that has discovered one 2-child array job of a plan with attempts=5."""
    control = stack.names["ControlBucket"]
    plan = run_plan(RUN, f"s3://{control}/runs/{RUN}/", n_shards=2, total_keys=2, job={"attempts": 5})
    aws.s3.put_object(Bucket=control, Key=f"runs/{RUN}/plan.json", Body=plan.model_dump_json().encode())
    aws.batch.submit_job(
        jobName="sluice-test",
        jobQueue=stack.names["GpuJobQueue"],
        jobDefinition=stack.names["WorkerJobDefinition"],
        arrayProperties={"size": 2},
        retryStrategy=retry_strategy(5),
        tags={"sluice:run-id": RUN},
        containerOverrides={
            "environment": [{"name": "SLUICE_PLAN_URI", "value": f"s3://{control}/runs/{RUN}/plan.json"}]
        },
    )
    for other in ("earlier-run", None):  # a kept emulator's earlier run, and a job that is not Sluice's
        aws.batch.submit_job(
            jobName="other",
            jobQueue=stack.names["GpuJobQueue"],
            jobDefinition=stack.names["WorkerJobDefinition"],
            arrayProperties={"size": 3},
            tags={"sluice:run-id": other} if other else {},
        )
    events: list[dict] = []
    config = ExecutorConfig(RUN, (stack.names["GpuJobQueue"],), str(tmp_path / "logs"), out=io.StringIO())
    executor = LocalExecutor(aws.batch, Ledger(aws.dynamodb, stack.names["RunsTable"]), events.append, config)
    jobs = executor.discover()
    assert len(jobs) == 1
    return executor, jobs[0], events


def test_only_the_runs_own_jobs_are_discovered(submitted):
    executor, job, events = submitted
    assert list(executor.jobs) == [job.job_id] and job.run_id == RUN
    assert len(executor._foreign) == 2  # the others are noted, not run
    assert executor.discover() == [] and list(executor.jobs) == [job.job_id]
    assert {e["detail"]["tags"]["sluice:run-id"] for e in events} == {RUN}


def test_discovered_job_takes_the_definitions_rules_and_the_plans_attempts(submitted):
    _, job, events = submitted
    assert job.kind == "array" and job.size == 2 and len(job.tasks) == 2
    assert job.max_attempts == 5  # what SubmitJob sent (moto does not echo it): the plan's
    assert job.rules, "the job definition's evaluateOnExit"
    assert [{**r, "action": r["action"].upper()} for r in job.rules] == [dict(r) for r in EVALUATE_ON_EXIT]
    assert [e["detail"]["status"] for e in events] == ["PENDING"]
    assert events[0]["detail"]["retryStrategy"] == retry_strategy(5)


def test_lost_host_retries_until_attempts_run_out_and_an_exit_fails_at_once(submitted):
    _, job, _ = submitted
    task = job.tasks[0]
    lost = HOST_LOST_REASON.format(instance="local-1")
    for attempt in range(1, 5):
        task.attempt = attempt
        assert job.action(task, status_reason=lost, exit_code=None) == "RETRY"
        assert job.action(task, status_reason=EXITED, exit_code=1) == "EXIT"
    task.attempt = 5
    assert job.action(task, status_reason=lost, exit_code=None) == "EXIT"


def test_job_strategy_without_rules_retries_any_failure() -> None:
    job = LocalJob("j", "n", "q", "single", 1, {}, RUN, max_attempts=2, rules=())
    task = Task(job, None, attempt=1)
    assert job.action(task, status_reason=EXITED, exit_code=1) == "RETRY"
    task.attempt = 2
    assert job.action(task, status_reason=EXITED, exit_code=1) == "EXIT"


def test_own_retry_strategy_wins_over_the_fallbacks(aws):
    own = {"attempts": 7, "evaluateOnExit": [{"onExitCode": "9", "action": "RETRY"}]}
    assert strategy_of(aws.batch, {}, {"retryStrategy": own, "jobDefinition": "x"}, None) == own


def _killed(sig: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    proc.send_signal(sig)
    proc.wait(timeout=pace.scaled(10))
    return proc


def test_reaping_a_killed_worker_requeues_it_then_fails_it_on_the_last_attempt(submitted, tmp_path):
    executor, job, events = submitted
    task = job.tasks[1]
    task.log_path = str(tmp_path / "worker.log")
    (tmp_path / "worker.log").write_text("killed\n")
    for attempt, want in ((1, JobStatus.RUNNABLE), (5, JobStatus.FAILED)):
        task.attempt = attempt
        task.attempts = [{}]
        task.proc = _killed(signal.SIGKILL)
        pid = task.proc.pid
        executor._reap(task)
        assert task.status is want and task.proc is None
        detail = events[-1]["detail"]
        assert detail["status"] == want.value
        assert detail["statusReason"] == HOST_LOST_REASON.format(instance=f"local-{pid}")
        assert detail["arrayProperties"] == {"index": 1}


def test_a_job_waits_for_its_dependencies_and_fails_when_one_fails():
    from sluice.local.emulator.jobs import LocalJob, Task, dependencies, fail_all

    def job(jid: str, deps: tuple[str, ...] = ()) -> LocalJob:
        j = LocalJob(jid, f"n-{jid}", "q", "array", 2, {}, "run", 3, depends_on=deps)
        j.tasks = [Task(j, 0), Task(j, 1)]
        return j

    mapper, reducer = job("map"), job("reduce", ("map",))
    jobs = {"map": mapper, "reduce": reducer}
    assert dependencies(reducer, {"reduce": reducer}) == "waiting"  # the map job not discovered yet
    assert dependencies(reducer, jobs) == "waiting"
    mapper.done = True
    assert dependencies(reducer, jobs) == "met"
    mapper.failed = True
    assert dependencies(reducer, jobs) == "failed"
    fail_all(reducer)
    assert reducer.done and reducer.failed and all(t.status is JobStatus.FAILED for t in reducer.tasks)


def test_an_attempt_past_its_timeout_is_ended_failed_with_batchs_reason_and_not_retried(submitted, tmp_path):
    from sluice.control.policy import TIMEOUT_REASON

    executor, job, events = submitted
    job.timeout_s = 60
    task = job.tasks[0]
    job.tasks[1].status = JobStatus.SUCCEEDED  # the other child is done: step() starts nothing
    task.log_path = str(tmp_path / "hung.log")
    (tmp_path / "hung.log").write_text("hung\n")
    task.attempt, task.attempts, task.status = 1, [{}], JobStatus.RUNNING
    task.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    task.started_ms = int((time.time() - 30) * 1000)  # 30 s in: within its 60 s
    executor.step()
    assert task.proc is not None and task.proc.poll() is None
    task.started_ms = int((time.time() - 61) * 1000)  # past it
    executor.step()
    assert task.proc is None and task.status is JobStatus.FAILED  # 5 attempts allowed: a timeout retries none
    detail = next(e["detail"] for e in events if e["detail"]["status"] == "FAILED")
    assert detail["statusReason"] == TIMEOUT_REASON


def test_a_worker_ending_with_a_configuration_error_is_quoted_in_the_shards_reason(submitted, tmp_path):
    from sluice.control.completion.batch_events import BatchJobStateChangeDetail
    from sluice.control.completion.verdict import settle_shard

    executor, job, events = submitted
    task = job.tasks[0]
    said = "configuration error: model m.pt: chunk_tokens 300 is over the 254 tokens its context holds"
    task.log_path = str(tmp_path / "worker.log")
    task.attempt, task.attempts = 1, [{}]
    with open(task.log_path, "wb") as log:  # the worker's last word on stderr (gpu_worker.errors.report), exit 2
        code = f"import sys; print('loading'); print('sluice-worker: {said}', file=sys.stderr); sys.exit(2)"
        task.proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    task.proc.wait(timeout=pace.scaled(10))
    executor._reap(task)
    assert task.status is JobStatus.FAILED  # exit 2: the strategy's EXIT rule, no retry
    detail = BatchJobStateChangeDetail.model_validate(events[-1]["detail"])
    assert detail.reason == f"{EXITED}: {said}"
    why = settle_shard(detail.status, detail.exit_code, detail.reason, None).why
    assert why == f"exit code 2: {EXITED}: {said}"


def test_an_interrupt_names_what_it_stopped_and_its_log_on_disk(submitted, tmp_path):
    import io as _io
    from contextlib import redirect_stdout

    from sluice.local.summary import report, stopped_work

    executor, job, _ = submitted
    task = job.tasks[0]
    task.log_path = str(tmp_path / "index.log")
    task.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        said = stopped_work(executor, True)  # the run concluded: what runs is its index stage
        assert said == f"the index stage (1 worker(s) stopped); log: {task.log_path}"
        assert stopped_work(executor, False) == f"the run (1 worker(s) stopped); log: {task.log_path}"
    finally:
        task.proc.kill()
        task.proc.wait()
    assert stopped_work(executor, True) is None  # nothing running: nothing stopped
    out = _io.StringIO()
    with redirect_stdout(out):
        report({"run_id": RUN, "outcome": "succeeded", "interrupted": True, "interrupted_work": said}, as_json=False)
    assert f"interrupted  {said}" in out.getvalue()
