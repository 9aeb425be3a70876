"""One capacity: the deployed run's plan.json decides as `sluice plan` showed, and the worker follows it."""

from __future__ import annotations

import json

import pytest

from gpu_worker.decode.nvjpeg import decode_device
from sluice.cli import main
from sluice.contracts.plan import RunPlan
from sluice.paths import RunPaths
from tests.integration.helpers import INPUT_BUCKET, _get, bus_events, keys_manifest, submit_keys


def _worker_decodes_on_gpu(plan: RunPlan) -> bool:
    """The worker's own decision for a rank on a CUDA device where nvJPEG works."""
    on, _ = decode_device(plan.decode, plan.decode_binds, "cuda:0", lambda _device: None)
    return bool(on)


@pytest.mark.parametrize("size", ["p5.48xlarge", "g6e.xlarge", "g5.xlarge"])
def test_the_deployed_plan_decides_decode_as_sluice_plan_showed(aws, stack, monkeypatch, tmp_path, capsys, size):
    env = {"SLUICE_GPU_INSTANCE_TYPES": size}
    out = submit_keys(aws, stack, monkeypatch, "cap", n_keys=30, extra_env=env)
    assert out["status"] == "submitted", out
    plan = RunPlan.model_validate_json(_get(aws, RunPaths.in_bucket(stack.names["ControlBucket"], out["run_id"]).plan))

    path = tmp_path / "cap.json"  # the same manifest, planned on this machine with the same settings
    path.write_text(keys_manifest(30))
    assert main(["plan", str(path), "--bucket", INPUT_BUCKET, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    decode = next(c for c in shown["checks"] if c["name"] == "decode")

    assert shown["instance_type"] == size
    assert plan.decode_binds == shown["decode_binds"], (size, decode)
    assert _worker_decodes_on_gpu(plan) == ("nvJPEG" in decode["advice"])
    assert (plan.timeout_s, plan.stall_after_s) == (shown["timeout_s"], shown["stall_after_s"])
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    assert ev["detail"]["gpu_hours_estimate"] == shown["cost"]["gpu_hours"]  # the preflight's one estimate
    priced = ev["detail"]["cost_estimate_usd"] or {}  # none for under 0.005 GPU-hours
    assert priced.get("on_demand") == (shown["cost"]["on_demand_usd"] if shown["cost"]["gpu_hours"] else None)
