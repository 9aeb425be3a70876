"""What the completion handler derives from a Batch event: run, shard, attempt, exit code."""

from __future__ import annotations

import copy

from sluice.control.completion.batch_events import BatchJobStateChangeEvent
from tests.conftest import load_event


def _d(name: str):
    return BatchJobStateChangeEvent.model_validate(load_event(f"{name}.json")).detail


def test_child_event_maps_to_parent_index_and_run():
    d = _d("batch-array-child-failed")
    assert d.run_id == "demo-0123456789abcdef" and d.parent_id == "a1b2c3d4-1111-2222-3333-444455556666"
    assert d.child_index == 2 and d.exit_code == 1 and d.status == "FAILED" and d.attempt == 1


def test_attempt_and_seq_order_a_spot_reclaim_before_the_retry():
    running1, reclaimed, ok2 = (
        _d(n)
        for n in (
            "batch-array-child-running",
            "batch-array-child-spot-reclaimed",
            "batch-array-child-succeeded-attempt2",
        )
    )
    assert (running1.attempt, reclaimed.attempt, ok2.attempt) == (1, 2, 2)
    assert running1.seq < reclaimed.seq < ok2.seq
    assert reclaimed.spot_reclaimed and not running1.spot_reclaimed


def test_mnp_node_and_job_events():
    node = _d("batch-mnp-node-failed")
    assert node.child_index == 1 and node.parent_id == "f0e1d2c3-7777-8888-9999-aaaabbbbcccc" and node.exit_code == 1
    job = _d("batch-mnp-job-succeeded")
    assert job.child_index is None and job.node_properties is not None


def test_exit_code_of_ecs_properties_jobs_comes_from_task_containers():
    ev = copy.deepcopy(load_event("batch-array-child-failed.json"))
    ev["detail"].pop("container")
    ev["detail"]["attempts"] = [
        {
            "startedAt": 1,
            "stoppedAt": 2,
            "taskProperties": [
                {"containers": [{"name": "sidecar", "exitCode": 0}, {"name": "worker", "exitCode": 137}]}
            ],
        }
    ]
    assert BatchJobStateChangeEvent.model_validate(ev).detail.exit_code == 137


def test_run_id_falls_back_to_the_job_name():
    ev = copy.deepcopy(load_event("batch-array-child-running.json"))
    ev["detail"]["tags"] = {}
    ev["detail"]["jobName"] = "sluice-cats-00ff00ff00ff00ff-3"
    assert BatchJobStateChangeEvent.model_validate(ev).detail.run_id == "cats-00ff00ff00ff00ff"


def test_unknown_fields_are_tolerated():
    ev = copy.deepcopy(load_event("batch-array-child-running.json"))
    ev["detail"]["someNewField"] = {"x": 1}
    assert BatchJobStateChangeEvent.model_validate(ev).detail.status == "RUNNING"
