"""`sluice plan`'s cost counts each child's start-up, and the planner sizes shards so start-up stays small."""

from __future__ import annotations

import json

import pytest

from sluice.cli import main
from sluice.plan.layout import MAX_KEYS_PER_SHARD, chosen_keys_per_shard
from sluice.preflight.checks import CHILD_STARTUP_S, STARTUP_TARGET
from sluice.preflight.estimate import DEFAULT_FAMILY, IMAGES_PER_GPU_S, PRICES

RATE = IMAGES_PER_GPU_S[DEFAULT_FAMILY]  # the stack's default family's images/s (g6e)
PRICE = PRICES[DEFAULT_FAMILY].on_demand  # USD a GPU-hour (one GPU an instance)


def _plan(tmp_path, capsys, job: dict, keys: int, *, text: bool = False) -> dict | str:
    path = tmp_path / "m.json"
    doc = {"version": 1, "input": {"prefix": "s3://my-images/stock/"}, "job": job}
    path.write_text(json.dumps(doc | {"model": {"uri": "builtin:reference-cnn"}}))
    assert main(["plan", str(path), "--assume-keys", str(keys)] + ([] if text else ["--json"])) == 0
    out = capsys.readouterr().out
    return out if text else json.loads(out)


def _expected(keys: int, children: int) -> tuple[float, float]:
    """(GPU-hours, On-Demand USD) from the documented figures: keys at RATE, plus 60 s a child."""
    hours = keys / RATE / 3600 + children * CHILD_STARTUP_S / 3600
    return hours, hours * PRICE


@pytest.mark.parametrize("keys", [300_000_000, 1_000_000])
def test_the_cost_of_10k_key_shards_includes_every_childs_start_up(tmp_path, capsys, keys):
    s = _plan(tmp_path, capsys, {"keys_per_shard": 10_000}, keys)
    children = -(-keys // 10_000)
    assert s["shards"] == children and s["keys_per_shard_why"].startswith("the manifest's job.keys_per_shard")
    hours, usd = _expected(keys, children)
    c = s["cost"]
    assert c["workers"] == children and c["startup_gpu_hours"] == round(children * CHILD_STARTUP_S / 3600, 2)
    assert c["working_gpu_hours"] == round(keys / RATE / 3600, 2)
    assert c["gpu_hours"] == pytest.approx(hours, abs=0.01) and c["on_demand_usd"] == pytest.approx(usd, abs=0.01)
    # start-up is most of it: 60 s against 10,000 / 700 = 14 s of work a child
    assert c["startup_gpu_hours"] > 4 * c["working_gpu_hours"]
    startup = {x["name"]: x for x in s["checks"]}["child start-up share"]
    assert startup["status"] == "warn" and "leave it out for the planner to size shards" in startup["advice"]


def test_the_text_says_working_plus_starting(tmp_path, capsys):
    out = _plan(tmp_path, capsys, {"keys_per_shard": 10_000}, 300_000_000, text=True)
    hours, usd = _expected(300_000_000, 30_000)
    working, starting = 300_000_000 / RATE / 3600, 30_000 * CHILD_STARTUP_S / 3600
    line = next(x for x in out.splitlines() if x.startswith("cost"))
    assert f"GPU-hours {working:,.2f} working + {starting:,.2f} starting" in line
    assert f"= {hours:,.2f}, about ${usd:,.2f} On-Demand" in line


@pytest.mark.parametrize("keys", [300_000_000, 1_000_000, 20_000_000])
def test_a_chosen_shard_size_keeps_start_up_under_the_target(tmp_path, capsys, keys):
    s = _plan(tmp_path, capsys, {}, keys)
    kps, shards = s["keys_per_shard"], s["shards"]
    assert shards == -(-keys // kps) and shards >= 2  # enough keys for more than one such shard
    share = CHILD_STARTUP_S / (CHILD_STARTUP_S + kps / RATE)
    assert share < STARTUP_TARGET and s["keys_per_shard_why"].startswith("chosen: start-up")
    # no bigger than needed: one shard fewer would make a shard of less work than the target asks
    assert (keys // (shards + 1)) / RATE < CHILD_STARTUP_S * (1 - STARTUP_TARGET) / STARTUP_TARGET
    checks = {x["name"]: x for x in s["checks"]}
    assert checks["child start-up share"]["status"] == "ok" and checks["array size"]["status"] == "ok"
    hours, _ = _expected(keys, shards)
    assert s["cost"]["gpu_hours"] == pytest.approx(hours, abs=0.01)
    assert s["cost"]["startup_gpu_hours"] < STARTUP_TARGET / (1 - STARTUP_TARGET) * s["cost"]["working_gpu_hours"]


def test_a_small_run_is_one_shard_and_says_why():
    kps, why = chosen_keys_per_shard(1_000, RATE)
    assert kps == 1_000 and why.startswith("one shard: all 1,000 keys are 1 s of work, start-up 98%")


def test_past_the_10m_key_limit_the_size_stops_there_and_says_why():
    per_s = 16 * IMAGES_PER_GPU_S["p5"]  # 16 H100s a child: 10M keys are only ~417 s of work
    kps, why = chosen_keys_per_shard(1_000_000_000, per_s)
    share = CHILD_STARTUP_S / (CHILD_STARTUP_S + MAX_KEYS_PER_SHARD / per_s)
    assert kps == MAX_KEYS_PER_SHARD and share > STARTUP_TARGET
    assert why == f"JobSpec's 10,000,000 keys a shard at most: start-up {share:.0%}, over the 10% aimed at"


def test_a_multinode_run_counts_each_nodes_start_up(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLUICE_WORKER_GPUS", "8")  # a stack deployed for 8-GPU nodes (g6e.48xlarge, 192 vCPUs) ...
    monkeypatch.setenv("SLUICE_MNP_MAX_VCPUS", str(4 * 192))  # ... and MNP room for all four at once
    s = _plan(tmp_path, capsys, {"mode": "multinode", "nodes": 4, "gpus_per_node": 8}, 10_000_000)
    assert s["cost"]["workers"] == 4 and s["cost"]["startup_gpu_hours"] == round(4 * 8 * CHILD_STARTUP_S / 3600, 2)
