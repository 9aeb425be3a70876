"""The local executor runs the fleet index build's shape: a job, an array job depending on it, a job depending
on the array; a failed child retried per its retry strategy; a failed dependency failing what depends on it.

The stage jobs run `python -m tests.stage_probe` (a stand-in that records its order and checks
its dependency ended) under the fleet's own job definitions (template.yaml: the segment
children retry any failure, train and commit do not), submitted to moto's Batch as Sluice
submits them (sluice.control.indexing.jobs: dependsOn, arrayProperties).
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.contracts.status import JobStatus
from sluice.control.table.ledger import Ledger
from sluice.local.emulator.executor import ExecutorConfig, LocalExecutor
from tests import pace
from tests.conftest import ROOT

pytestmark = pytest.mark.subprocess  # the stage jobs are processes

RUN = "run-stages"
CHILDREN = 3


def _submit(aws: Any, stack: Any, out: Path, *, train_fails: bool = False) -> dict[str, str]:
    """train -> segments (array of 3, child 1 fails its first attempt) -> commit, as Sluice submits them."""
    ids: dict[str, str] = {}
    args = {
        "train": ["--fail-attempts", "9", "--fail-child", "0"] if train_fails else [],
        "segments": ["--needs", "train:1", "--fail-child", "1", "--fail-attempts", "1"],
        "commit": ["--needs", f"segments:{CHILDREN}"],
    }
    definition = {"train": "IndexTrainJobDefinition", "segments": "IndexSegmentJobDefinition",
                  "commit": "IndexCommitJobDefinition"}  # fmt: skip
    for stage, before in (("train", None), ("segments", "train"), ("commit", "segments")):
        req: dict[str, Any] = {
            "jobName": f"sluice-{RUN}-index-{stage}",
            "jobQueue": stack.names["PrepareJobQueue"],
            "jobDefinition": stack.names[definition[stage]],
            "tags": {"sluice:run-id": RUN},
            "containerOverrides": {"command": ["python", "-m", "tests.stage_probe", str(out), stage, *args[stage]]},
        }
        if stage == "segments":
            req["arrayProperties"] = {"size": CHILDREN}
        if before:
            req["dependsOn"] = [{"jobId": ids[before]}]
        ids[stage] = aws.batch.submit_job(**req)["jobId"]
    return ids


def _run(aws: Any, stack: Any, tmp_path: Path) -> tuple[LocalExecutor, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    # tests.stage_probe is not installed with the package: the jobs import it from the checkout.
    config = ExecutorConfig(
        RUN, (stack.names["PrepareJobQueue"],), str(tmp_path / "logs"), slots=4, out=io.StringIO(),
        worker_env={"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    ex = LocalExecutor(aws.batch, Ledger(aws.dynamodb, stack.names["RunsTable"]), events.append, config)
    assert len(ex.discover()) == 3
    deadline = time.monotonic() + pace.scaled(60)  # a guard against a hang (tests/pace.py)
    while not ex.idle and time.monotonic() < deadline:
        ex.step()
        time.sleep(0.05)
    assert ex.idle, "the chain did not finish in 60 s"
    return ex, events


def _ends(events: list[dict[str, Any]], job_id: str) -> list[tuple[str, str | None]]:
    return [(e["detail"]["status"], e["detail"].get("statusReason")) for e in events if e["detail"]["jobId"] == job_id]


def test_stages_run_in_dependency_order_and_a_failed_child_is_retried(aws, stack, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ids = _submit(aws, stack, out)
    ex, events = _run(aws, stack, tmp_path)
    assert all(not j.failed for j in ex.jobs.values())
    ran = {f.name: int(f.read_text().split()[0]) for f in out.glob("*-*-*")}
    # Child 1 failed attempt 1 and succeeded on attempt 2 (the segment definition retries any failure).
    assert set(ran) == {"train-0-1", "segments-0-1", "segments-1-1", "segments-1-2", "segments-2-1", "commit-0-1"}
    assert (out / "segments-1-1").read_text().endswith("failed")
    # Order: train before every child, every child before commit (each also checked it in-process).
    assert ran["train-0-1"] < min(v for k, v in ran.items() if k.startswith("segments"))
    assert max(v for k, v in ran.items() if k.startswith("segments")) < ran["commit-0-1"]
    child1 = [
        (e["detail"]["status"], len(e["detail"]["attempts"]))
        for e in events
        if e["detail"]["jobId"] == f"{ids['segments']}:1"
    ]
    assert ("RUNNABLE", 1) in child1 and child1[-1] == ("SUCCEEDED", 2)  # back in the queue, then attempt 2
    assert _ends(events, ids["segments"])[-1] == ("SUCCEEDED", None)
    assert events[-1]["detail"]["jobId"] == ids["commit"] and events[-1]["detail"]["status"] == "SUCCEEDED"
    parent = next(e["detail"] for e in events if e["detail"]["jobId"] == ids["segments"])
    assert parent["arrayProperties"]["size"] == CHILDREN and parent["jobName"] == f"sluice-{RUN}-index-segments"


def test_a_failed_train_fails_the_segments_and_commit_unrun_as_batch_does(aws, stack, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    ids = _submit(aws, stack, out, train_fails=True)
    ex, events = _run(aws, stack, tmp_path)
    # Train's definition exits on a failed attempt: one attempt, FAILED; nothing after it ran.
    assert [f.name for f in out.glob("*-*-*")] == ["train-0-1"]
    assert _ends(events, ids["train"])[-1][0] == JobStatus.FAILED.value
    for stage in ("segments", "commit"):
        assert _ends(events, ids[stage])[-1] == ("FAILED", "Dependent Job failed")
        assert ex.jobs[ids[stage]].failed
