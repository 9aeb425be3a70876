"""The decode check: CPU decode capacity per GPU against the models' rate, per instance family; --decode flags."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from sluice.cli import build_parser, main
from sluice.local.manifest import Uploaded, build
from sluice.preflight.checks import decode_check
from sluice.preflight.facts import Capacity
from sluice.preflight.instances import DECODE_PER_CORE_S, INSTANCES, instance, more_cpu_per_gpu


def _keys(tmp_path) -> str:
    path = tmp_path / "keys.txt"
    path.write_text("a.jpg\nb.jpg\n")
    return str(path)


def _plan(tmp_path, capsys, *flags: str) -> dict:
    argv = [
        "plan",
        _keys(tmp_path),
        "--bucket",
        "images",
        "--model",
        "builtin:reference-cnn",
        "--assume-keys",
        "100000000",
        "--json",
        *flags,
    ]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _decode(summary: dict) -> dict:
    return next(c for c in summary["checks"] if c["name"] == "decode")


def test_cpu_decode_on_a_g6e_xlarge_warns_and_gpu_decode_is_ok(tmp_path, capsys):
    base = ("--instance-type", "g6e.xlarge", "--images-per-gpu-s", "12000")
    cpu = _plan(tmp_path, capsys, *base, "--decode", "cpu")
    check = _decode(cpu)
    assert check["status"] == "warn" and (check["value"], check["limit"]) == (12_000, 4 * DECODE_PER_CORE_S)
    assert "job.decode gpu" in check["advice"] and "g6e.16xlarge" in check["advice"]
    # The estimate runs at the bound rate: the CPUs' 800 images/s, not the GPU's 12,000.
    assert cpu["images_per_gpu_s"] == 800 and cpu["cost"]["working_gpu_hours"] == round(1e8 / 800 / 3600, 2)
    assert cpu["images_per_gpu_s_source"].startswith("bound by CPU decode (job.decode cpu, 4 vCPUs a GPU")
    gpu = _plan(tmp_path, capsys, *base, "--decode", "gpu")
    assert _decode(gpu)["status"] == "ok" and gpu["images_per_gpu_s"] == 12_000
    assert gpu["cost"]["working_gpu_hours"] == round(1e8 / 12_000 / 3600, 2)
    auto = _plan(tmp_path, capsys, *base)  # the manifest's default: auto decodes on the GPU when it binds
    assert _decode(auto)["status"] == "ok" and auto["decode_binds"] and "nvJPEG" in _decode(auto)["advice"]


def test_a_measured_decode_rate_and_more_cpus_per_gpu_lift_the_bound(tmp_path, capsys):
    s = _plan(tmp_path, capsys, "--instance-type", "g6e.xlarge", "--images-per-gpu-s", "1000", "--decode", "cpu")
    assert _decode(s)["status"] == "warn" and s["images_per_gpu_s"] == 800
    s = _plan(tmp_path, capsys, "--instance-type", "g6e.2xlarge", "--images-per-gpu-s", "1000", "--decode", "cpu")
    assert _decode(s)["status"] == "ok" and s["images_per_gpu_s"] == 1000
    s = _plan(
        tmp_path,
        capsys,
        *("--instance-type", "g6e.xlarge", "--images-per-gpu-s", "1000", "--decode", "cpu"),
        *("--decode-per-core-s", "300"),
    )
    assert _decode(s)["status"] == "ok" and _decode(s)["limit"] == 1200


@pytest.mark.parametrize(
    ("size", "vcpus_per_gpu"),
    [
        ("g4dn.xlarge", 4),
        ("g4dn.12xlarge", 12),
        ("g4dn.metal", 12),
        ("g5.48xlarge", 24),
        ("g6.12xlarge", 12),
        ("g6e.xlarge", 4),
        ("g6e.24xlarge", 24),
        ("p4d.24xlarge", 12),
        ("p5.48xlarge", 24),
        ("p5e.48xlarge", 24),
    ],
)
def test_cpu_decode_capacity_per_family(size, vcpus_per_gpu):
    cap = Capacity(instance_type=size, gpu_family=size.split(".")[0], images_per_gpu_s=10_000, decode="cpu")
    assert cap.cpu_per_gpu == vcpus_per_gpu
    assert cap.cpu_decode_rate == vcpus_per_gpu * DECODE_PER_CORE_S
    assert cap.rate == min(10_000, vcpus_per_gpu * DECODE_PER_CORE_S)
    assert decode_check(cap).status == "warn"
    assert decode_check(replace(cap, images_per_gpu_s=vcpus_per_gpu * DECODE_PER_CORE_S)).status == "ok"


def test_every_template_family_is_in_the_table():
    for family in ("g4dn", "g5", "g6", "g6e", "p4d", "p5", "p5e"):
        assert any(name.startswith(family + ".") for name in INSTANCES), family
    assert more_cpu_per_gpu("g6e", 8) == "g6e.2xlarge"
    assert more_cpu_per_gpu("p5", 100) is None


def test_the_table_is_overridable_like_the_prices(tmp_path, monkeypatch):
    f = tmp_path / "instances.json"
    f.write_text(json.dumps({"g6e.xlarge": {"vcpus": 8, "gpus": 1}, "g7.xlarge": {"vcpus": 6, "gpus": 1}}))
    monkeypatch.setenv("SLUICE_INSTANCES_FILE", str(f))
    assert instance("g6e.xlarge").vcpus == 8 and instance("G7.XLARGE").vcpus == 6
    assert instance("g5.xlarge").vcpus == 4


def test_models_share_the_gpu_but_not_the_decode():
    """Two models halve the images/s a GPU takes; each image is still decoded once."""
    one = Capacity(instance_type="g6e.xlarge", images_per_gpu_s=1200, decode="cpu")
    assert decode_check(one).status == "warn"
    assert decode_check(replace(one, models=2)).status == "ok"


def test_local_run_takes_decode_into_the_manifest():
    args = build_parser().parse_args(["local", "run", "--decode", "cpu"])
    _, body, _ = build(args, Uploaded("images/x/", 5), None)
    assert json.loads(body)["job"]["decode"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --decode gpu is allowed here")
def test_local_run_decode_gpu_without_cuda_is_refused_before_it_starts(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["local", "run", "--demo", "3", "--decode", "gpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--decode gpu needs a CUDA GPU" in err and "CUDA" in err
    assert not out.exists()  # nothing started, nothing written
