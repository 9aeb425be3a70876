"""Plans for tests and benches, made as the planner makes them: sluice.plan.layout.build_plan of a Manifest.

The manifest's defaults are the plan's: a test names only the sections it cares about.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import RunPlan
from sluice.contracts.sections import MAX_ARRAY_SIZE
from sluice.plan.layout import LOCAL_KEYLIST, NO_STACK, Layout, PlanInputs, build_plan, job_layouts
from sluice.preflight.facts import Capacity


def run_plan(
    run_id: str,
    base: str,
    *,
    total_keys: int,
    n_shards: int = 1,
    keys_per_shard: int | None = None,
    model_ids: Sequence[str] | None = None,
    lineage: Sequence[str] = (),
    manifest_uri: str | None = None,
    created_at: str | None = None,
    **sections: Any,
) -> RunPlan:
    """The plan of a run whose manifest has `sections` (model, job, output, input, max_failed_fraction, ...).

    `base` is the run's folder: s3://<control bucket>/runs/<run>/ or a local directory ending in "/".
    Its n_shards shards hold total_keys keys (keys_per_shard: at most that many each, default
    an even split). `created_at` stands in for the planner's clock (tests that order runs by it).
    """
    body = {"version": 1, **sections, "input": {"key_list": LOCAL_KEYLIST, **sections.get("input", {})}}
    manifest = Manifest.model_validate(body)
    kps = keys_per_shard or max(1, math.ceil(total_keys / n_shards))
    plan = build_plan(
        PlanInputs(
            run_id=run_id,
            manifest=manifest,
            manifest_uri=manifest_uri or base + "manifest.json",
            control_bucket=base[5:].split("/", 1)[0] if base.startswith("s3://") else NO_STACK,
            total_keys=total_keys,
            duplicates=0,
            lay=Layout(n_shards, kps, job_layouts(n_shards, manifest.job.mode, MAX_ARRAY_SIZE)),
            capacity=Capacity(),
            model_ids=model_ids,
            lineage=lineage,
            root=base,
        )
    )
    return plan if created_at is None else plan.model_copy(update={"created_at": created_at})
