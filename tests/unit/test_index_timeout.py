"""SLUICE_INDEX_TIMEOUT_S: one fixed timeout for every index job, decided at the claim, in both modes."""

from __future__ import annotations

import pytest

from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import RunPlan
from sluice.control.indexing import jobs as index_jobs
from sluice.control.indexing import plan as index_plan
from sluice.control.indexing import stage as indexing
from sluice.control.policy import INDEX_STAGES, index_stage_timeout_s, index_timeout_s
from sluice.control.table.items import IndexItem, RunItem
from sluice.errors import SettingsError
from sluice.settings import Settings
from tests.plans import run_plan

FLEET_ROWS = 1_000  # a small crossover, so a plan of a few thousand keys is built by the fleet


def _plan(keys: int) -> RunPlan:
    return run_plan(
        "r", "s3://ctl/runs/r/", total_keys=keys, output={"index": {"uri": "s3://ctl/indexes/m/", "name": "m"}}
    )


def _run(ix: IndexItem) -> RunItem:
    return RunItem(
        pk="r", sk="RUN", gsi1pk="RUNS", run_id="r", status="SUCCEEDED", manifest_uri="s3://ctl/manifests/m.json",
        created_at=0, updated_at=0, expires_at=0, plan_uri="s3://ctl/runs/r/plan.json", index=ix,
    )  # fmt: skip


def test_unset_the_single_jobs_timeout_is_derived_from_the_rows() -> None:
    ix = indexing.claim(_plan(500), 500, Settings())["index"]
    assert (ix.mode, ix.timeout_s, ix.timeout_fixed) == ("single", index_timeout_s(500), False)
    assert index_jobs.request(_run(ix), Settings())["timeout"]["attemptDurationSeconds"] == index_timeout_s(500)


def test_the_override_is_the_single_jobs_timeout() -> None:
    settings = Settings.from_env({"SLUICE_INDEX_TIMEOUT_S": "7"})
    ix = indexing.claim(_plan(500), 500, settings)["index"]
    assert (ix.mode, ix.timeout_s, ix.timeout_fixed) == ("single", 7, True)
    assert index_jobs.request(_run(ix), settings)["timeout"]["attemptDurationSeconds"] == 7


def test_the_override_is_every_fleet_stages_timeout_shorter_or_longer_than_derived() -> None:
    for fixed in (7, 10 * 24 * 3600):
        settings = Settings.from_values({"index_fleet_rows": FLEET_ROWS, "index_timeout_s": fixed})
        ix = indexing.claim(_plan(5_000), 5_000, settings)["index"]
        assert ix.mode == "fleet" and ix.timeout_fixed
        timeouts = {
            st: index_jobs.stage_request(_run(ix), settings, st, None)["timeout"]["attemptDurationSeconds"]
            for st in INDEX_STAGES
        }
        assert timeouts == dict.fromkeys(INDEX_STAGES, fixed)


def test_without_it_a_fleet_timeout_is_a_floor_over_the_derived_one() -> None:
    settings = Settings.from_values({"index_fleet_rows": FLEET_ROWS})
    ix = indexing.claim(_plan(5_000), 5_000, settings)["index"]
    assert (ix.mode, ix.timeout_s, ix.timeout_fixed) == ("fleet", None, False)
    derived = {st: index_stage_timeout_s(st, 5_000, ix.children or 2) for st in INDEX_STAGES}
    assert {st: index_jobs.stage_timeout_s(ix, st) for st in INDEX_STAGES} == derived
    rerun = ix.model_copy(update={"timeout_s": 7})  # a rerun's --timeout-s: a floor, never shorter
    assert {st: index_jobs.stage_timeout_s(rerun, st) for st in INDEX_STAGES} == derived


def test_sluice_plan_shows_the_override_as_every_stages_timeout() -> None:
    m = Manifest.model_validate({"version": 1, "input": {"keys": ["s3://b/a.jpg"]}})
    for rows_over, stages in ((10**9, 1), (FLEET_ROWS, 3)):
        settings = Settings.from_values({"index_fleet_rows": rows_over, "index_timeout_s": 90})
        est = index_plan.estimate(m, 5_000, settings)
        assert est is not None and len(est["stages"]) == stages
        assert [st["timeout_s"] for st in est["stages"]] == [90] * stages


def test_a_bad_value_names_the_variable() -> None:
    with pytest.raises(SettingsError, match="SLUICE_INDEX_TIMEOUT_S='0'"):
        Settings.from_env({"SLUICE_INDEX_TIMEOUT_S": "0"})
