"""AWS Batch adapter: submits a run's array, single or multi-node parallel jobs.

Retriable-vs-fatal is decided here, at the AWS boundary (sluice.aws.errors): throttling and
5xx become RetriableError (the Lambda invocation is retried); anything else is a
SubmissionError whose message says what to fix. The retry strategy is sluice.control.policy's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import Kind, classify
from sluice.contracts.plan import JobLayout, RunPlan
from sluice.control.policy import PREPARE_TIMEOUT_S, prepare_retry_strategy, retry_strategy
from sluice.errors import RetriableError, SubmissionError
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_batch import BatchClient

RUN_TAG = "sluice:run-id"


def job_name(run_id: str, index: int) -> str:
    """A Batch job name (<= 128 of [A-Za-z0-9_-]) that identifies the run."""
    return f"sluice-{run_id}-{index}"[:128]


def job_request(plan: RunPlan, plan_uri: str, job: JobLayout, index: int, settings: Settings) -> dict[str, Any]:
    """The SubmitJob request for one JobLayout of the plan."""
    env = [
        {"name": "SLUICE_PLAN_URI", "value": plan_uri},
        {"name": "SLUICE_RUN_ID", "value": plan.run_id},
        {"name": "SLUICE_SHARD_OFFSET", "value": str(job.shard_offset)},
    ]
    req: dict[str, Any] = {
        "jobName": job_name(plan.run_id, index),
        "retryStrategy": retry_strategy(plan.attempts),
        "timeout": {"attemptDurationSeconds": plan.timeout_s},
        "tags": {RUN_TAG: plan.run_id},
        "propagateTags": True,
    }
    if job.kind == "multinode":
        req["jobQueue"] = settings.mnp_job_queue
        req["jobDefinition"] = settings.mnp_job_definition
        req["nodeOverrides"] = {
            "numNodes": job.shard_count,
            "nodePropertyOverrides": [{"targetNodes": "0:", "containerOverrides": {"environment": env}}],
        }
        return req
    req["jobQueue"] = settings.job_queue
    req["jobDefinition"] = settings.array_job_definition
    if job.kind == "array":
        req["arrayProperties"] = {"size": job.shard_count}
    else:  # a lone shard: no array index is set, so name the shard explicitly
        env.append({"name": "SLUICE_SHARD_INDEX", "value": str(job.shard_offset)})
    req["containerOverrides"] = {"environment": env}
    return req


PREPARE_STAGES = ("map", "reduce")


def prepare_job_name(run_id: str, stage: str) -> str:
    """The name of a run's prepare job (stage "map" or "reduce")."""
    return f"sluice-{run_id}-prepare-{stage}"[:128]


def prepare_request(
    run_id: str, stage: str, spec_uri: str, size: int, settings: Settings, depends_on: str | None = None
) -> dict[str, Any]:
    """The SubmitJob request of one prepare stage: `size` children running `python -m sluice.prepare STAGE`."""
    req: dict[str, Any] = {
        "jobName": prepare_job_name(run_id, stage),
        "jobQueue": settings.prepare_job_queue,
        "jobDefinition": settings.prepare_job_definition,
        "retryStrategy": prepare_retry_strategy(),
        "timeout": {"attemptDurationSeconds": PREPARE_TIMEOUT_S},
        "tags": {RUN_TAG: run_id},
        "propagateTags": True,
        "containerOverrides": {
            "command": ["python", "-m", "sluice.prepare", stage, "--spec", spec_uri],
            "environment": [{"name": "SLUICE_RUN_ID", "value": run_id}],
        },
    }
    if size >= 2:  # Batch array jobs need >= 2 children; one worker is a plain job (index 0)
        req["arrayProperties"] = {"size": size}
    if depends_on:
        req["dependsOn"] = [{"jobId": depends_on}]  # on an array job: waits for every child
    return req


class BatchAdapter:
    """Submits the jobs of a plan; the boto3 Batch client is injected or created lazily."""

    def __init__(self, client: BatchClient) -> None:
        self._client = client

    def submit(
        self, plan: RunPlan, plan_uri: str, settings: Settings, queue: str | None = None, start_index: int = 0
    ) -> list[str]:
        """Submit every job of the plan; returns their job ids in plan order.

        Idempotent: SubmitJob takes no idempotency token, so each job's deterministic name is
        looked up first and a job already submitted (by a delivery that died before recording
        it) is adopted instead of submitted twice.
        """
        ids = []
        for i, job in enumerate(plan.jobs, start_index):
            req = job_request(plan, plan_uri, job, i, settings)
            if queue:
                req["jobQueue"] = queue
            ids.append(self.find(req["jobQueue"], req["jobName"]) or self._submit(req))
        return ids

    def submit_prepare(
        self, run_id: str, spec_uri: str, workers: int, partitions: int, settings: Settings
    ) -> list[str]:
        """Submit (or adopt, by name) the map job and the reduce job that depends on it: [map id, reduce id]."""
        ids: list[str] = []
        for stage, size in zip(PREPARE_STAGES, (workers, partitions), strict=True):
            req = prepare_request(run_id, stage, spec_uri, size, settings, ids[-1] if ids else None)
            ids.append(self.find(req["jobQueue"], req["jobName"]) or self._submit(req))
        return ids

    def submit_named(self, req: dict[str, Any]) -> str:
        """Submit one request, or adopt the job of the same name already in its queue: its job id."""
        return self.find(req["jobQueue"], req["jobName"]) or self._submit(req)

    def find(self, queue: str, name: str) -> str | None:
        """The id of the newest job (not a child or node) named `name` in `queue`, if any.

        ListJobs with a JOB_NAME filter returns jobs of every status (AWS Batch API reference).
        """
        token: str | None = None
        found: list[tuple[int, str]] = []
        while True:
            kwargs: dict[str, Any] = {"jobQueue": queue, "filters": [{"name": "JOB_NAME", "values": [name]}]}
            if token:
                kwargs["nextToken"] = token
            resp = self._call("list_jobs", name, **kwargs)
            found += [
                (int(j.get("createdAt", 0)), j["jobId"])
                for j in resp.get("jobSummaryList", [])
                if j.get("jobName") == name and ":" not in j["jobId"] and "#" not in j["jobId"]
            ]
            token = resp.get("nextToken")
            if not token:
                return max(found)[1] if found else None

    def _submit(self, req: dict[str, Any]) -> str:
        return str(self._call("submit_job", req["jobName"], **req)["jobId"])

    def _call(self, op: str, job_name: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            failure = classify(exc)
            if failure.retriable:
                what = f"AWS Batch {op} {job_name}"
                raise RetriableError(f"{failure.describe(what)}; will retry") from exc
            raise SubmissionError(
                f"AWS Batch refused {op} for {job_name} on queue {kwargs.get('jobQueue')!r}"
                + (f" with definition {kwargs['jobDefinition']!r}" if "jobDefinition" in kwargs else "")
                + f": {failure.message or failure.code}. "
                "Check that the queue and job definition exist and are ENABLED "
                "(SLUICE_JOB_QUEUE / SLUICE_ARRAY_JOB_DEFINITION / SLUICE_MNP_* / SLUICE_PREPARE_*)"
                + (
                    " and that the role may call batch:SubmitJob and batch:ListJobs."
                    if failure.kind is Kind.DENIED
                    else "."
                )
            ) from exc
