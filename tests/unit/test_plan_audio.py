"""An audio run's plan: windows a file, CPU decode (always the CPU's), timeout, stall time and `sluice plan`'s cost."""

from __future__ import annotations

import json

import pytest

from sluice.cli import main
from sluice.contracts.manifest import Manifest
from sluice.contracts.sections import ContentSpec
from sluice.control.policy import index_rows
from sluice.plan.layout import run_times
from sluice.preflight.checks import derived_stall_after_s, derived_timeout_s
from sluice.preflight.estimate import IMAGES_PER_GPU_S
from sluice.preflight.facts import Capacity, audio_decode
from sluice.preflight.instances import AUDIO_DECODE_S_PER_CORE, AUDIO_S_PER_FILE, audio_windows


def _manifest(content: dict | None = None, batch_size: int = 64) -> Manifest:
    return Manifest.model_validate(
        {
            "version": 1,
            "input": {"prefix": "s3://sounds/podcasts/", **(content or {"kind": "audio"})},
            "model": {"uri": "s3://models/clap.pt", "batch_size": batch_size},
        }
    )


def test_a_planned_audio_file_is_its_windows_at_the_manifests_window_and_hop():
    assert AUDIO_S_PER_FILE == 360 and audio_windows(None, None) == 36  # six minutes of 10 s windows
    assert audio_windows(5.0, None) == 72
    assert audio_windows(10.0, 5.0) == 71  # starts 0, 5, ..., 350: the window at 350 reaches the end
    assert audio_windows(600.0, None) == 1
    assert index_rows(ContentSpec(kind="audio", window_s=5.0), models=2, keys=10) == 10 * 2 * 72
    assert index_rows(ContentSpec(kind="image"), models=2, keys=10) == 20


def test_an_audio_file_costs_its_windows_on_the_gpu_and_its_seconds_on_the_cpu():
    image = Capacity(instance_type="g6e.xlarge").for_manifest(_manifest({"kind": "image"}))
    audio = Capacity(instance_type="g6e.xlarge").for_manifest(_manifest())
    assert (image.audio_windows, image.parts_per_key, image.rate) == (0, 1, IMAGES_PER_GPU_S["g6e"])
    assert audio.model_rate == pytest.approx(IMAGES_PER_GPU_S["g6e"] / 36)  # each window an image's GPU time
    assert audio.cpu_decode_rate == pytest.approx(4 * AUDIO_DECODE_S_PER_CORE / AUDIO_S_PER_FILE)  # 4 vCPUs a GPU
    # job.decode auto: an image run would decode on the GPU; audio decodes on the CPU, which binds here
    assert audio.decode == "auto" and audio.rate == audio.cpu_decode_rate < audio.model_rate
    assert "audio decodes on the CPU" in audio.rate_source
    assert audio.part_rate == pytest.approx(audio.rate * 36)
    _, _, status, advice, unit = audio_decode(audio)  # the preflight's decode check of an audio run
    assert status == "warn" and "g6e." in advice and unit.startswith("audio files/s")
    fast = Capacity(instance_type="g6e.48xlarge", images_per_gpu_s=100).for_manifest(_manifest())  # 24 vCPUs a GPU
    assert audio_decode(fast)[2] == "ok" and fast.rate == fast.model_rate == pytest.approx(100 / 36)
    assert "a planning guess" in fast.rate_source


def test_an_audio_runs_timeout_and_stall_time_follow_its_files_and_windows():
    cap = Capacity(instance_type="g6e.xlarge")
    m = _manifest(batch_size=64)
    timeout, stall = run_times(m, 200_000, cap)
    rate = cap.for_manifest(m).rate  # audio files a second: 4.7
    assert timeout == derived_timeout_s(200_000, 1, rate) > derived_timeout_s(200_000, 1, IMAGES_PER_GPU_S["g6e"])
    assert timeout >= 2 * 200_000 / rate  # twice the shard's files at the CPU-bound rate
    # a stall is judged in batches of windows (what a rank's progress waits on), not of files
    assert stall == derived_stall_after_s(64, rate * 36, timeout) < derived_stall_after_s(64, rate, timeout)


def test_sluice_plan_costs_an_audio_run_by_its_files_windows_and_decode(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLUICE_LOCAL_MODE", "1")  # the model a local file, not looked up on S3
    path = tmp_path / "m.json"
    doc = {"version": 1, "input": {"prefix": "s3://sounds/x/", "kind": "audio", "window_s": 5}}
    path.write_text(json.dumps(doc | {"model": {"uri": str(tmp_path / "clap.pt")}}))
    assert main(["plan", str(path), "--assume-keys", "100000", "--json", "--images-per-gpu-s", "288"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["audio"] == {
        "seconds_per_file": AUDIO_S_PER_FILE,
        "windows_per_file": 72,
        "decode_s_per_core": AUDIO_DECODE_S_PER_CORE,
        "windows_per_gpu_s": 288.0,
    }
    # 288 windows/s over 72 windows a file: 4 files/s, under the 4.7 its 4 vCPUs decode
    assert s["images_per_gpu_s"] == pytest.approx(4.0) and s["decode_binds"] is False
    (decode,) = [c for c in s["checks"] if c["name"] == "decode"]
    assert (decode["value"], decode["limit"], decode["status"]) == (4.0, 4.7, "ok") and "audio files" in decode["unit"]
    assert s["cost"]["working_gpu_hours"] == round(100_000 / 4.0 / 3600, 2)
    assert s["timeout_s"] == derived_timeout_s(s["keys_per_shard"], 1, 4.0)
    assert main(["plan", str(path), "--assume-keys", "100000", "--images-per-gpu-s", "288"]) == 0
    out = capsys.readouterr().out
    assert "audio files     360 s, 72 windows each" in out and "files/s a GPU   4, " in out
