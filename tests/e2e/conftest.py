"""e2e tests run in a folder of their own (their tmp_path), as a person runs `sluice local run`
in some folder: what it writes there by default (./sluice-output) goes with the test."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
