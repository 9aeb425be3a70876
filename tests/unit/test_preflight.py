"""Each preflight check at its limit and just past it."""

from __future__ import annotations

import pytest

from sluice.preflight import Capacity, RunFacts, preflight
from sluice.preflight import limits as L
from sluice.preflight.checks import derived_timeout_s, shard_seconds

RATE = 100.0  # images per GPU-second: round numbers below


def _cap(**kw) -> Capacity:
    return Capacity(**{"images_per_gpu_s": RATE, "max_vcpus": 10**9, "mnp_max_vcpus": 10**9, **kw})


def _run(**kw) -> RunFacts:
    base = {"unique_keys": 1000, "keys_per_shard": 100, "n_shards": 10, "mode": "array", "jobs": [("array", 10)]}
    return RunFacts(**{**base, **kw})


def _check(run: RunFacts, cap: Capacity, name: str):
    (c,) = [c for c in preflight(run, cap).checks if c.name == name]
    return c


CASES = [
    # (check, facts at the limit, facts one past it, capacity, status past the limit)
    ("array size", {"jobs": [("array", 10_000)]}, {"jobs": [("array", 10_001)]}, {}, "error"),
    (
        "jobs in SUBMITTED",
        {"n_shards": L.BATCH_SUBMITTED_JOBS - 1, "jobs": [("array", 1)]},
        {"n_shards": L.BATCH_SUBMITTED_JOBS, "jobs": [("array", 1)]},
        {},
        "error",
    ),
    ("SubmitJob calls", {"jobs": [("single", 1)] * 3000}, {"jobs": [("single", 1)] * 3001}, {}, "warn"),
    ("MNP nodes", {"mode": "multinode", "n_shards": 1000}, {"mode": "multinode", "n_shards": 1001}, {}, "error"),
    (
        "MNP vCPUs",
        {"mode": "multinode", "n_shards": 16},
        {"mode": "multinode", "n_shards": 17},
        {"mnp_max_vcpus": 64, "worker_vcpus": 4},
        "error",
    ),
    (
        "vCPUs for all children at once",
        {"n_shards": 64},
        {"n_shards": 65},
        {"max_vcpus": 256, "worker_vcpus": 4},
        "warn",
    ),
    (
        "shard time",
        {"keys_per_shard": 360_000, "timeout_s": 3600},
        {"keys_per_shard": 360_100, "timeout_s": 3600},
        {},
        "error",
    ),
    ("S3 GET/s", {"n_shards": 55}, {"n_shards": 56}, {}, "warn"),  # 55 GPUs x 100 images/s = 5,500
    ("AMP active series", {"n_shards": 769_230}, {"n_shards": 769_231}, {}, "warn"),  # x13 series vs 10M
    ("AMP samples/s", {"n_shards": 161_538}, {"n_shards": 161_540}, {"push_interval_s": 30.0}, "warn"),
    ("Lambda memory", {"unique_keys": 107_851_851}, {"unique_keys": 107_900_000}, {}, "error"),
    ("Lambda time", {"unique_keys": 375_000_000}, {"unique_keys": 375_500_000}, {}, "error"),
    ("Lambda /tmp", {"unique_keys": 140_273_972}, {"unique_keys": 140_350_000}, {}, "error"),
    (
        "DynamoDB WCU/s (one run)",
        {"n_shards": 250, "keys_per_shard": 100},
        {"n_shards": 251, "keys_per_shard": 100},
        {},
        "warn",
    ),  # 250 workers finishing a 1 s shard each second: 4 WCU each
]


@pytest.mark.parametrize(("name", "at", "past", "cap", "status"), CASES, ids=[c[0] for c in CASES])
def test_each_check_passes_at_its_limit_and_fails_just_past_it(name, at, past, cap, status):
    ok = _check(_run(**at), _cap(**cap), name)
    assert ok.value <= ok.limit and ok.status in ("ok", "warn"), ok
    bad = _check(_run(**past), _cap(**cap), name)
    assert bad.value > bad.limit and bad.status == status and bad.advice, bad


def test_far_under_every_limit_everything_is_ok():
    pf = preflight(_run(), _cap(max_vcpus=256, mnp_max_vcpus=64))
    assert [c.name for c in pf.checks if c.status != "ok"] == []
    assert pf.errors == [] and pf.warnings == []


def test_the_shard_time_advice_fits_the_timeout():
    run = _run(keys_per_shard=10_000, timeout_s=21_600)
    cap = Capacity(images_per_gpu_s=1 / 3.8)  # the case study's ~3.8 GPU-s per image
    c = _check(run, cap, "shard time")
    assert c.status == "error" and round(c.value / 3600, 1) == 10.6
    assert "lower job.keys_per_shard to about 2,842" in c.advice
    assert f"job.timeout_s to at least {derived_timeout_s(10_000, 1, 1 / 3.8)}" in c.advice
    assert derived_timeout_s(10_000, 1, 1 / 3.8) >= 2 * shard_seconds(10_000, 1, 1 / 3.8)


def test_cost_is_gpu_hours_times_the_price():
    pf = preflight(_run(unique_keys=3_600_000), Capacity(images_per_gpu_s=100.0, gpu_family="g5"))
    hours = 10.0 + 10 * 60 / 3600  # 3.6M keys at 100/s, and each of the 10 children's 60 s start-up
    assert (pf.cost["working_gpu_hours"], pf.cost["startup_gpu_hours"]) == (10.0, round(10 * 60 / 3600, 2))
    assert pf.cost["gpu_hours"] == round(hours, 2)
    assert pf.cost["on_demand_usd"] == round(hours * 1.006, 2) and pf.cost["spot_usd"] == round(hours * 1.006 * 0.4, 2)


def test_a_prices_file_overrides_the_table(tmp_path, monkeypatch):
    f = tmp_path / "prices.json"
    f.write_text('{"g5": {"on_demand": 2.0, "spot": 0.5, "gpus": 1}}')
    monkeypatch.setenv("SLUICE_PRICES_FILE", str(f))
    pf = preflight(_run(unique_keys=3_600_000), Capacity(images_per_gpu_s=100.0, gpu_family="g5"))
    hours = 10.0 + 10 * 60 / 3600  # working and starting, as above
    assert (pf.cost["on_demand_usd"], pf.cost["spot_usd"]) == (round(hours * 2.0, 2), round(hours * 0.5, 2))


def test_measured_gpu_hours_are_priced_on_the_deployed_family():
    from sluice.preflight.spent import describe, spent
    from sluice.settings import Settings

    family = Capacity.build(Settings.from_values({"gpu_instance_types": "g5.2xlarge,g6"})).gpu_family
    used = spent(8 * 3600, family)
    assert used["gpu_hours"] == 8.0 and used["cost_usd"].family == "g5" and used["cost_usd"].on_demand == 8.05
    assert describe(8.0, family) == "8.00 GPU-hours (about $8.05 On-Demand, $3.22 Spot on g5)"
    assert describe(8.0, None) == "8.00 GPU-hours"  # a run recorded before its family was: no price guessed
    assert spent(0, family) == {"gpu_hours": 0.0, "cost_usd": None}


def test_more_keys_than_sluice_max_keys_is_an_error():
    assert _check(_run(unique_keys=1000, max_keys=1000), _cap(), "unique keys").status != "error"
    over = _check(_run(unique_keys=1001, max_keys=1000), _cap(), "unique keys")
    assert over.status == "error" and "split the input into several manifests" in over.advice
