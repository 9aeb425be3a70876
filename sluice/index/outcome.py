"""The index stage's outcome, written beside the index for the control plane (paths.index_result)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from sluice.contracts.events import IndexFailed, RunIndexed
from sluice.contracts.plan import RunPlan
from sluice.errors import SluiceError
from sluice.log import logger

if TYPE_CHECKING:
    from sluice.index.build import BuildReport


def with_vectors(outcome: RunIndexed, report: BuildReport, plan: RunPlan, index: str) -> RunIndexed:
    """The plan's second target, S3 Vectors (output.index.s3_vectors), upserted after the Lance build."""
    target = plan.index
    if target is None or target.s3_vectors is None or target.uri != index:
        return outcome
    from sluice.index.vectors import upsert

    return outcome.model_copy(update={"s3_vectors": upsert(report, target.name, target.s3_vectors)})


def write_result(uri: str, outcome: RunIndexed | IndexFailed) -> None:
    data = outcome.model_dump_json().encode()
    if uri.startswith("s3://"):
        from sluice.aws.store import ObjectStore

        ObjectStore().put(uri, data, "application/json")
    else:  # a local index (local mode's index step)
        os.makedirs(os.path.dirname(uri), exist_ok=True)
        with open(uri, "wb") as fh:
            fh.write(data)
    logger.info("index stage", extra={"result": uri, "outcome": outcome.detail_type})


def reason_of(exc: BaseException) -> str:
    """A failure's reason: ours as it is (it says what to do), others with their type."""
    return str(exc) if isinstance(exc, SluiceError) else f"{type(exc).__name__}: {exc}"
