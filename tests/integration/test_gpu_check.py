"""bench/gpu_check: its Python part runs on a CPU (tiny models), and the script stops at once without CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHON": sys.executable}


def test_the_python_part_makes_the_table_on_a_cpu():
    out = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "dry"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("| model | model only (images/s) | end to end, CPU decode |")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in lines[2:]}
    assert set(rows) == {"resnet50", "vit-b16"}
    for cells in rows.values():
        assert float(cells[1]) > 0 and float(cells[8]) > 0  # model only, naive loop


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check would run for minutes")
def test_the_script_refuses_a_machine_without_cuda():
    out = subprocess.run(
        ["bash", "bench/gpu_check.sh"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert "needs an NVIDIA GPU with CUDA" in out.stderr and "gpu_check.py dry" in out.stderr
