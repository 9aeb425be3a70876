"""One capacity: for every instance size, the plan.json, `sluice plan` and the worker decide decode alike."""

from __future__ import annotations

import pytest

from gpu_worker.decode.nvjpeg import decode_device
from sluice.contracts.manifest import Manifest
from sluice.ops.dryrun import DryRun, dry_run
from sluice.plan.layout import PlanInputs, build_plan, layout
from sluice.preflight import Capacity
from sluice.preflight.instances import INSTANCES
from sluice.settings import Settings

KEYS = 100_000


def _settings(size: str) -> Settings:
    return Settings.from_values(
        {
            "gpu_instance_types": f"{size},g5",
            "default_input_bucket": "images",
            "default_model_uri": "builtin:reference-cnn",
        }
    )


def _plan(size: str, manifest: Manifest):
    """The plan.json the manifest function writes on a stack deployed with `size` first."""
    settings = _settings(size)
    lay = layout(KEYS, manifest, settings.max_array_size)
    return build_plan(PlanInputs("r-1", manifest, "s3://c/m.json", "c", KEYS, 0, lay, Capacity.build(settings)))


def _shown(size: str, tmp_path, decode: str | None = None) -> dict:
    """What `sluice plan` shows for the same manifest on the same settings."""
    path = tmp_path / "keys.txt"
    path.write_text("a.jpg\nb.jpg\n")
    return dry_run(DryRun(str(path), _settings(size), assume_keys=KEYS, decode=decode), lambda: None)


def _on_gpu(plan) -> bool:
    """The worker's decision for a rank on a CUDA device where nvJPEG works."""
    return bool(decode_device(plan.decode, plan.decode_binds, "cuda:0", lambda _device: None)[0])


@pytest.mark.parametrize("size", sorted(INSTANCES))
def test_the_plan_the_preflight_and_the_worker_decide_decode_alike(size, tmp_path):
    shown = _shown(size, tmp_path)
    check = next(c for c in shown["checks"] if c["name"] == "decode")
    plan = _plan(size, Manifest(version=1, input={"key_list": "s3://images/keys.txt"}))
    assert shown["instance_type"] == size
    assert plan.decode_binds == shown["decode_binds"] == (check["value"] > check["limit"]), check
    assert _on_gpu(plan) == ("nvJPEG" in check["advice"]), check
    assert (plan.timeout_s, plan.stall_after_s) == (shown["timeout_s"], shown["stall_after_s"])


def test_p5_feeds_its_gpus_from_its_cpus_and_a_g5_xlarge_too():
    # 24 vCPUs a GPU on a p5.48xlarge decode 4,800 images/s for an H100's 1,500: the CPUs keep up.
    assert not Capacity.build(_settings("p5.48xlarge")).decode_binds
    assert not Capacity.build(_settings("g5.xlarge")).decode_binds  # 800 decoded for the A10G's 350


def test_job_decode_cpu_sizes_the_plan_at_the_bound_rate(tmp_path):
    # g6e.xlarge, 4 vCPUs: decode cpu binds at 800 images/s when the model takes 2,000, so a
    # 10M-key shard takes 12,500 s, not 5,000: its timeout is 2 x that + 900 s, over the 6 h floor.
    settings = _settings("g6e.xlarge").model_copy(update={"images_per_gpu_s": 2000.0})
    job = {"decode": "cpu", "keys_per_shard": 10_000_000}
    manifest = Manifest(version=1, input={"key_list": "s3://images/keys.txt"}, job=job)
    lay = layout(10_000_000, manifest, settings.max_array_size)
    plan = build_plan(PlanInputs("r-1", manifest, "s3://c/m.json", "c", 10**7, 0, lay, Capacity.build(settings)))
    path = tmp_path / "m.json"
    path.write_text(manifest.model_dump_json(exclude_defaults=True))
    shown = dry_run(DryRun(str(path), settings, assume_keys=10**7), lambda: None)
    assert shown["images_per_gpu_s"] == 800 and shown["timeout_s"] == 25_920
    assert (plan.timeout_s, plan.stall_after_s) == (shown["timeout_s"], shown["stall_after_s"])
