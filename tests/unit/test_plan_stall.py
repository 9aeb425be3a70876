"""stall_after_s: derived from the plan (model load plus batch times, well under the timeout), overridable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluice.models import JobLayout, Manifest
from sluice.plan.layout import Layout, PlanInputs, build_plan
from sluice.preflight import Capacity
from sluice.preflight.checks import STALL_LOAD_S, derived_stall_after_s


def _plan(job: dict, rate: float | None = None):
    m = Manifest.model_validate({"version": 1, "input": {"keys": ["a"]}, "job": job})
    lay = Layout(4, 25, [JobLayout(kind="array", shard_offset=0, shard_count=4)])
    inputs = PlanInputs("r-1", m, "s3://c/manifests/m.json", "c", 100, 0, lay, Capacity(images_per_gpu_s=rate))
    return build_plan(inputs)


def test_derived_from_model_load_and_batch_time_well_under_the_timeout():
    fast = derived_stall_after_s(64, 500.0, 6 * 3600)
    assert STALL_LOAD_S <= fast <= STALL_LOAD_S + 60  # 10 batches of 64 at 500 images/s: about a second
    slow = derived_stall_after_s(64, 0.5, 6 * 3600)  # a batch takes 128 s: ten of them
    assert slow >= STALL_LOAD_S + 1280 and slow % 60 == 0
    assert derived_stall_after_s(64, 0.001, 6 * 3600) == 6 * 3600 // 4  # never more than a quarter of the timeout


def test_the_plan_carries_it_and_the_manifest_overrides_it():
    plan = _plan({}, rate=100.0)
    assert plan.stall_after_s == derived_stall_after_s(64, 100.0, plan.timeout_s)
    assert plan.stall_after_s < plan.timeout_s / 4 + 1
    assert _plan({"stall_after_s": 90}).stall_after_s == 90
    with pytest.raises(ValidationError, match="stall_after_s"):
        _plan({"stall_after_s": 5})
