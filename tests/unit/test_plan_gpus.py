"""`sluice plan`'s figures for 1, 4 and 8 GPUs a worker: one count (the stack's WorkerGpus) behind each."""

from __future__ import annotations

import json
import math

import pytest

from sluice.cli import main
from sluice.preflight.checks import CHILD_STARTUP_S
from sluice.preflight.estimate import DEFAULT_FAMILY, IMAGES_PER_GPU_S, PRICES

RATE = IMAGES_PER_GPU_S[DEFAULT_FAMILY]  # g6e: images/s a GPU
NODE_VCPUS = {1: 4, 4: 48, 8: 192}  # g6e's smallest size with that many GPUs: xlarge, 12xlarge, 48xlarge


def _plan(tmp_path, capsys, monkeypatch, job: dict, stack_gpus: int, keys: int) -> tuple[int, dict]:
    monkeypatch.setenv("SLUICE_WORKER_GPUS", str(stack_gpus))
    monkeypatch.setenv("SLUICE_MNP_MAX_VCPUS", "100000")
    path = tmp_path / "m.json"
    doc = {"version": 1, "input": {"prefix": "s3://my-images/stock/"}, "job": job}
    path.write_text(json.dumps(doc | {"model": {"uri": "builtin:reference-cnn"}}))
    rc = main(["plan", str(path), "--assume-keys", str(keys), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _checks(s: dict) -> dict:
    return {c["name"]: c for c in s["checks"]}


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_a_multinode_plan_counts_each_nodes_gpus_in_vcpus_gets_and_hours(tmp_path, capsys, monkeypatch, gpus):
    keys = 10_000_000
    rc, s = _plan(tmp_path, capsys, monkeypatch, {"mode": "multinode", "nodes": 16, "gpus_per_node": gpus}, gpus, keys)
    checks = _checks(s)
    assert rc == 0 and checks["GPUs per node"]["status"] == "ok"
    assert checks["MNP vCPUs"]["value"] == 16 * NODE_VCPUS[gpus]
    assert checks["S3 GET/s"]["value"] == round(16 * gpus * RATE)
    starting = 16 * gpus * CHILD_STARTUP_S / 3600
    assert s["cost"]["startup_gpu_hours"] == round(starting, 2)
    hours = keys / RATE / 3600 + starting
    assert s["cost"]["gpu_hours"] == pytest.approx(hours, abs=0.01)
    assert s["cost"]["on_demand_usd"] == pytest.approx(hours * PRICES[DEFAULT_FAMILY].on_demand, abs=0.02)


@pytest.mark.parametrize("gpus", [1, 4, 8])
def test_an_array_plan_fits_children_by_their_gpus_instances(tmp_path, capsys, monkeypatch, gpus):
    job = {"keys_per_shard": 200_000, "gpus_per_node": gpus}
    rc, s = _plan(tmp_path, capsys, monkeypatch, job, gpus, 198 * 200_000)
    checks = _checks(s)
    assert rc == 0 and s["shards"] == 198
    vcpus = checks["vCPUs for all children at once"]
    assert vcpus["value"] == 198 * NODE_VCPUS[gpus] and vcpus["limit"] == 256
    at_once = min(198, 256 // NODE_VCPUS[gpus])  # children that fit MaxVcpus at once
    assert checks["S3 GET/s"]["value"] == round(at_once * gpus * RATE)
    if at_once < 198:
        assert f"at most {at_once:,} children run at once" in vcpus["advice"]
        assert f"about {math.ceil(198 / at_once):,} waves" in vcpus["advice"]
    assert s["cost"]["startup_gpu_hours"] == round(198 * gpus * CHILD_STARTUP_S / 3600, 2)


@pytest.mark.parametrize("mode", [{"mode": "array"}, {"mode": "multinode", "nodes": 4}])
def test_gpus_per_node_other_than_the_stacks_is_an_error(tmp_path, capsys, monkeypatch, mode):
    rc, s = _plan(tmp_path, capsys, monkeypatch, mode | {"gpus_per_node": 8}, 1, 1_000_000)
    check = _checks(s)["GPUs per node"]
    assert rc == 1 and check["status"] == "error" and (check["value"], check["limit"]) == (8, 1)
    assert "set job.gpus_per_node to 1, or deploy with WorkerGpus=8" in check["advice"]
    if mode["mode"] == "multinode":  # the figures are the stack's one GPU a node, not the manifest's eight
        assert _checks(s)["S3 GET/s"]["value"] == round(4 * RATE) and _checks(s)["MNP vCPUs"]["value"] == 4 * 4


def test_a_manifest_that_leaves_gpus_out_gets_the_stacks(tmp_path, capsys, monkeypatch):
    rc, s = _plan(tmp_path, capsys, monkeypatch, {"mode": "multinode", "nodes": 2}, 4, 1_000_000)
    checks = _checks(s)
    assert rc == 0 and "GPUs per node" not in checks
    assert checks["S3 GET/s"]["value"] == round(2 * 4 * RATE) and checks["MNP vCPUs"]["value"] == 2 * 48
