"""template.yaml on moto (sluice.local.emulator.infra): the prepare stage's Batch resources exist locally
and the functions' environment names them, so local runs and tests submit prepare jobs to the
same queue and definition the deployed stack has."""

from __future__ import annotations

from typing import Any

from sluice.contracts.status import JobStatus
from sluice.control.batch import BatchAdapter, prepare_job_name
from sluice.local.emulator.events import JobChange, batch_job_state_change, matches
from sluice.settings import Settings


def test_local_stack_creates_the_prepare_queue_and_definition(aws: Any, stack: Any) -> None:
    for logical in ("PrepareComputeEnvironment", "PrepareJobQueue", "PrepareJobDefinition"):
        assert logical in stack.names, logical
    (queue,) = aws.batch.describe_job_queues(jobQueues=[stack.names["PrepareJobQueue"]])["jobQueues"]
    assert queue["jobQueueName"] == "sluice-prepare" and queue["state"] == "ENABLED"
    (jd,) = aws.batch.describe_job_definitions(jobDefinitions=[stack.names["PrepareJobDefinition"]])["jobDefinitions"]
    assert jd["jobDefinitionName"] == "sluice-prepare"
    assert jd["platformCapabilities"] == ["FARGATE"]
    assert jd["retryStrategy"] == {"attempts": 3}
    assert jd["containerProperties"]["command"][:3] == ["python", "-m", "sluice.prepare"]
    assert jd["containerProperties"]["jobRoleArn"].endswith(":role/sluice-PrepareRole")


def test_functions_settings_name_the_local_prepare_resources(stack: Any) -> None:
    for fn in ("HandleManifestUploadFunction", "HandleJobStateChangeFunction"):
        settings = Settings.from_env(stack.env_for(fn))
        assert settings.prepare_job_queue == stack.names["PrepareJobQueue"], fn
        assert settings.prepare_job_definition == stack.names["PrepareJobDefinition"], fn
    manifest = Settings.from_env(stack.env_for("HandleManifestUploadFunction"))
    assert manifest.prepare_over_keys == 5_000_000
    assert manifest.max_keys == 1_000_000_000


def test_prepare_jobs_submit_locally_and_their_events_reach_the_job_state_function(aws: Any, stack: Any) -> None:
    settings = Settings.from_env(stack.env_for("HandleManifestUploadFunction"))
    spec = f"s3://{stack.names['ControlBucket']}/runs/r1/prepare/spec.json"
    map_id, reduce_id = BatchAdapter(aws.batch).submit_prepare("r1", spec, 3, 2, settings)
    jobs = {j["jobId"]: j for j in aws.batch.describe_jobs(jobs=[map_id, reduce_id])["jobs"]}
    assert jobs[map_id]["jobName"] == prepare_job_name("r1", "map")
    assert jobs[reduce_id]["dependsOn"] == [{"jobId": map_id}]
    assert {j["jobQueue"] for j in jobs.values()} == {stack.names["PrepareJobQueue"]}
    # Adopted by name, not submitted twice.
    assert BatchAdapter(aws.batch).submit_prepare("r1", spec, 3, 2, settings) == [map_id, reduce_id]
    event = batch_job_state_change(
        JobChange(
            job_id=reduce_id,
            job_name=prepare_job_name("r1", "reduce"),
            job_queue=stack.names["PrepareJobQueue"],
            status=JobStatus.SUCCEEDED,
            run_id="r1",
        )
    )
    routed = [name for name, pattern in stack.rule_patterns.items() if matches(pattern, event)]
    assert routed == ["JobStateChanged"]
    assert stack.rule_function["JobStateChanged"] == "HandleJobStateChangeFunction"
