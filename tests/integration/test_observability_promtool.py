"""promtool (Debian's prometheus package) checks the recording rules and runs their tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

OBS = Path(__file__).resolve().parents[2] / "observability"


def test_promtool_checks_and_tests_the_rules():
    if shutil.which("promtool") is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing in CI: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for args in (["check", "rules", "rules.yml"], ["test", "rules", "rules.test.yml"]):
        proc = subprocess.run(["promtool", *args], cwd=OBS, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout
