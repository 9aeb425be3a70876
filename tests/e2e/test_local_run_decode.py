"""`sluice local run --decode gpu` is refused without CUDA (--decode cpu embeds a folder exactly once: the
prepare-stage run of tests/e2e/test_local_run.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "local", "run", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --decode gpu runs here")
def test_decode_gpu_without_cuda_is_refused_before_anything_starts(tmp_path: Path):
    proc = _run("--demo", "4", "--decode", "gpu", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "CUDA" in proc.stderr, proc.stderr[-2000:]
    assert "uploaded" not in proc.stderr and not (tmp_path / "out").exists()
