"""`sluice local run --decode`: cpu embeds an unseen folder exactly once; gpu is refused without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from tests.worker_images import make_demo_images


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "local", "run", *args], capture_output=True, text=True, timeout=300
    )


def test_decode_cpu_embeds_an_unseen_folder_exactly_once(tmp_path: Path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name, data in make_demo_images(12, seed=31337, min_side=60, max_side=300):
        (folder / name).write_bytes(data)
    proc = _run("--images", str(folder), "--decode", "cpu", "--json", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["outcome"] == "succeeded" and (s["processed"], s["failed"]) == (12, 0)
    files = sorted(Path(s["output_dir"], "output").rglob("*.parquet"))
    keys = [r["key"] for f in files for r in pq.read_table(f).to_pylist()]
    assert len(keys) == 12 == len(set(keys)) and all(k.endswith(".jpg") for k in keys)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --decode gpu runs here")
def test_decode_gpu_without_cuda_is_refused_before_anything_starts(tmp_path: Path):
    proc = _run("--demo", "4", "--decode", "gpu", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "CUDA" in proc.stderr, proc.stderr[-2000:]
    assert "uploaded" not in proc.stderr and not (tmp_path / "out").exists()
