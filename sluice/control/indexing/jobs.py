"""The index stage's Batch jobs: their names and SubmitJob requests, one job or the fleet's three stages.

A claim (sluice.control.indexing.stage) is "single": one CPU job, `python -m sluice.index build`; or
"fleet": three jobs submitted at once, Batch ordering them by `dependsOn`:

    train     python -m sluice.index stage train   --bucket B --run R --children N
    segments  python -m sluice.index stage segment --bucket B --run R   (array of N, dependsOn train)
    commit    python -m sluice.index stage commit  --bucket B --run R   (dependsOn the segments array)

Names are deterministic (`job_name`), so a second submission adopts the first by name
(sluice.control.batch.submit_named) and a rerun's jobs carry its own suffix.
"""

from __future__ import annotations

import re
from typing import Any

from sluice.control.batch import RUN_TAG
from sluice.control.context import control_bucket
from sluice.control.policy import (
    INDEX_STAGES,
    index_child_retry_strategy,
    index_retry_strategy,
    index_stage_timeout_s,
)
from sluice.control.table.items import IndexItem, RunItem

ATTEMPTS = 2  # a lost host is retried; a failed build is not (its outcome is written, the index left as it was)
TIMEOUT_S = 4 * 3600  # a claim written before timeouts were derived from the rows
STAGE_COMMAND = {"train": "train", "segments": "segment", "commit": "commit"}  # sluice.index's `stage` verbs
_NAME = re.compile(r"-index(?:-r(?P<rerun>[1-9][0-9]*))?(?:-(?P<stage>train|segments|commit))?")


def job_name(run_id: str, rerun: int = 0, stage: str | None = None) -> str:
    """An index job's name: deterministic, so a second submission adopts the first; a rerun's is its own.

    sluice-<run>-index[-r<rerun>][-<stage>], at most 128 characters (Batch's job name limit).
    """
    suffix = "-index" + (f"-r{rerun}" if rerun else "") + (f"-{stage}" if stage else "")
    return f"sluice-{run_id}"[: 128 - len(suffix)] + suffix


def parse_name(run_id: str, name: str) -> tuple[int, str | None] | None:
    """(rerun, stage or None) when `name` is one of the run's index jobs' names, else None."""
    for m in _NAME.finditer(name):
        rerun, stage = int(m["rerun"] or 0), m["stage"]
        if m.end() == len(name) and name == job_name(run_id, rerun, stage):
            return rerun, stage
    return None


def is_index_job(run_id: str, name: str) -> bool:
    """True when a Batch job named `name` is one of the run's index jobs (any rerun, any stage)."""
    return parse_name(run_id, name) is not None


def request(run: RunItem, settings: Any) -> dict[str, Any]:
    """The SubmitJob request of the run's single index job: one CPU job on the prepare queue."""
    ix = run.index
    return _base(run, settings, None) | {
        "jobDefinition": settings.index_job_definition,
        "retryStrategy": index_retry_strategy(ATTEMPTS),
        "timeout": {"attemptDurationSeconds": (ix.timeout_s if ix else None) or TIMEOUT_S},
        "containerOverrides": {
            "command": ["python", "-m", "sluice.index", "build", *_where(run)],
            "environment": [{"name": "SLUICE_RUN_ID", "value": run.run_id}],
        },
    }


def stage_request(run: RunItem, settings: Any, stage: str, depends_on: str | None) -> dict[str, Any]:
    """The SubmitJob request of one fleet stage; `depends_on`: the previous stage's job id (train has none)."""
    ix = run.index
    assert ix is not None and stage in INDEX_STAGES
    children = ix.children or 2
    command = ["python", "-m", "sluice.index", "stage", STAGE_COMMAND[stage], *_where(run)]
    if stage == "train":
        command += ["--children", str(children)]
    req = _base(run, settings, stage) | {
        "jobDefinition": {
            "train": settings.index_train_job_definition,
            "segments": settings.index_segment_job_definition,
            "commit": settings.index_commit_job_definition,
        }[stage],
        "retryStrategy": index_child_retry_strategy() if stage == "segments" else index_retry_strategy(ATTEMPTS),
        "timeout": {"attemptDurationSeconds": stage_timeout_s(ix, stage)},
        "containerOverrides": {"command": command, "environment": [{"name": "SLUICE_RUN_ID", "value": run.run_id}]},
    }
    if stage == "segments":
        req["arrayProperties"] = {"size": children}  # 2..10,000: sluice.control.policy.index_mode
    if depends_on:
        req["dependsOn"] = [{"jobId": depends_on}]  # on an array job: waits for every child
    return req


def stage_timeout_s(ix: IndexItem, stage: str) -> int:
    """A stage's timeout from the claim's rows; a rerun's --timeout-s (IndexItem.timeout_s) as its floor.

    SLUICE_INDEX_TIMEOUT_S fixed at the claim (IndexItem.timeout_fixed) is every stage's, shorter or longer.
    """
    if ix.timeout_fixed and ix.timeout_s:
        return ix.timeout_s
    derived = index_stage_timeout_s(stage, ix.planned_rows or 0, ix.children or 2)
    return max(derived, ix.timeout_s or 0)


def _base(run: RunItem, settings: Any, stage: str | None) -> dict[str, Any]:
    return {
        "jobName": job_name(run.run_id, run.index.reruns if run.index else 0, stage),
        "jobQueue": settings.prepare_job_queue,
        "tags": {RUN_TAG: run.run_id},
        "propagateTags": True,
    }


def _where(run: RunItem) -> list[str]:
    return ["--bucket", control_bucket(run), "--run", run.run_id]


__all__ = ["ATTEMPTS", "TIMEOUT_S", "is_index_job", "job_name", "parse_name", "request", "stage_request"]
