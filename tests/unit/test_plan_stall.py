"""stall_after_s: derived from the plan (model load plus batch times, well under the timeout), overridable."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import JobLayout
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


def test_the_load_grace_is_derived_from_the_models_bounded_and_overridable():
    from sluice.preflight.checks import LOAD_GRACE_BASE_S, LOAD_GRACE_PER_MODEL_S, derived_load_grace_s

    plan = _plan({})
    assert plan.load_grace_s == LOAD_GRACE_BASE_S + LOAD_GRACE_PER_MODEL_S  # one model
    assert derived_load_grace_s(2, 6 * 3600) == LOAD_GRACE_BASE_S + 2 * LOAD_GRACE_PER_MODEL_S
    assert derived_load_grace_s(8, 3600) == 900  # never more than a quarter of the timeout
    assert derived_load_grace_s(1, 60) == 60  # nor under a minute
    assert _plan({"load_grace_s": 20}).load_grace_s == 20
    with pytest.raises(ValidationError, match="load_grace_s"):
        _plan({"load_grace_s": 5})


def test_an_earlier_runs_failures_are_read_by_one_model_task_whatever_the_models():
    # The failures files are the run's, not a model's: with two matching models they were read (and counted) twice.
    from sluice.control.intake.lineage import EarlierRun, Lineage

    m = Manifest.model_validate(
        {
            "version": 1,
            "input": {"keys": ["a"]},
            "model": [
                {"name": "a", "uri": "builtin:reference-cnn"},
                {"name": "b", "uri": "builtin:reference-cnn", "image_size": 64},
            ],
        }
    )
    lay = Layout(6, 25, [JobLayout(kind="array", shard_offset=0, shard_count=6)])
    plan = build_plan(
        PlanInputs("r-0", m, "s3://c/manifests/m.json", "c", 150, 0, lay, Capacity(), model_ids=["ida", "idb"])
    )
    tasks = Lineage([EarlierRun("r-0", plan, 6)]).tasks(["ida", "idb"], workers=2)
    shards = lambda want: sorted(s for t in tasks if t.failures == want for s in range(t.start, t.stop))  # noqa: E731
    assert {t.model_id for t in tasks} == {"ida", "idb"}
    assert shards(True) == list(range(6))  # every shard's failures file once ...
    assert {t.model_id for t in tasks if t.failures} == {"ida"}  # ... by the first model's tasks
