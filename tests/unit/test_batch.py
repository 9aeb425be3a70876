"""The SubmitJob requests the Batch adapter builds, and its error translation."""

from __future__ import annotations

from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import JobLayout
from sluice.control.batch import job_request
from sluice.plan.layout import Layout, PlanInputs, build_plan
from sluice.preflight import Capacity
from sluice.settings import Settings


def _plan(mode: str = "array", jobs: list[JobLayout] | None = None):
    m = Manifest.model_validate({"version": 1, "input": {"keys": ["a"]}, "job": {"mode": mode, "nodes": 3}})
    jobs = jobs or [JobLayout(kind="array", shard_offset=0, shard_count=4)]
    return build_plan(
        PlanInputs(
            run_id="r-1",
            manifest=m,
            manifest_uri="s3://c/manifests/m.json",
            control_bucket="c",
            total_keys=100,
            duplicates=0,
            lay=Layout(4, 25, jobs),
            capacity=Capacity(),
        )
    )


def test_array_request_has_plan_uri_tag_timeout_and_spot_retry():
    plan = _plan()
    req = job_request(plan, "s3://c/runs/r-1/plan.json", plan.jobs[0], 0, Settings())
    env = {e["name"]: e["value"] for e in req["containerOverrides"]["environment"]}
    assert env == {"SLUICE_PLAN_URI": "s3://c/runs/r-1/plan.json", "SLUICE_RUN_ID": "r-1", "SLUICE_SHARD_OFFSET": "0"}
    assert req["arrayProperties"] == {"size": 4}
    assert req["tags"] == {"sluice:run-id": "r-1"} and req["propagateTags"] is True
    assert req["timeout"] == {"attemptDurationSeconds": plan.timeout_s}
    assert req["retryStrategy"] == {
        "attempts": 3,
        "evaluateOnExit": [
            {"onStatusReason": "Host EC2*", "action": "RETRY"},
            {"onExitCode": "75", "action": "RETRY"},  # a stalled rank (gpu_worker.watchdog)
            {"onReason": "*", "action": "EXIT"},
        ],
    }
    assert req["jobName"] == "sluice-r-1-0" and req["jobQueue"] == Settings().job_queue


def test_multinode_request_overrides_node_count_on_the_on_demand_queue():
    plan = _plan("multinode", [JobLayout(kind="multinode", shard_offset=0, shard_count=3)])
    req = job_request(plan, "s3://c/p.json", plan.jobs[0], 0, Settings())
    assert req["nodeOverrides"]["numNodes"] == 3
    assert req["nodeOverrides"]["nodePropertyOverrides"][0]["targetNodes"] == "0:"
    assert req["jobQueue"] == Settings().mnp_job_queue and "arrayProperties" not in req
    assert plan.spot_allowed is False


def test_single_job_names_its_shard():
    plan = _plan(jobs=[JobLayout(kind="single", shard_offset=7, shard_count=1)])
    req = job_request(plan, "s3://c/p.json", plan.jobs[0], 0, Settings())
    env = {e["name"]: e["value"] for e in req["containerOverrides"]["environment"]}
    assert env["SLUICE_SHARD_INDEX"] == "7" and "arrayProperties" not in req
