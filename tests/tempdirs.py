"""Every temporary folder a test run makes goes in one folder of its own, removed at the end.

The session points TMPDIR (and tempfile.tempdir) at a fresh folder, so what this process and
every process it starts (servers, workers, the CLI) make with tempfile lands there. After
each test, a `sluice-*` folder that appeared during it and is still there fails that test
(the code or the test leaked it); at the end, any `sluice-*` folder left fails the run. The
folder is removed either way, so no run leaves anything in the system's temp directory.
pytest's own tmp_path folders are made under the system temp directory as before
(tmp_path_retention_policy in pyproject.toml keeps only failed tests' ones).
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pace

PATTERN = "sluice-*"
GRACE_S = 3.0  # a process stopped at the end of a test may still be removing its folder (scaled: tests/pace.py)


def leftovers(root: Path) -> set[str]:
    return {p.name for p in root.glob(PATTERN)}


def session_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Session fixture body: TMPDIR -> a fresh folder; fail on `sluice-*` left in it; remove it."""
    tmp_path_factory.getbasetemp()  # pytest's tmp_path base stays in the system temp directory
    multiprocessing.util.get_temp_dir()  # so does multiprocessing's, which it removes at exit
    root = Path(tempfile.mkdtemp(prefix="pytest-sluice-tmp-"))
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = str(root), str(root)
    try:
        yield root
        left = settled(root, set())
        if left:
            pytest.fail(f"the test run left temporary folders: {sorted(left)}", pytrace=False)
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(root, ignore_errors=True)


def settled(root: Path, before: set[str]) -> set[str]:
    """New `sluice-*` folders still there after GRACE_S (none: returns at once)."""
    deadline = time.monotonic() + pace.scaled(GRACE_S)
    while (new := leftovers(root) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return new


def per_test(root: Path, nodeid: str) -> Iterator[None]:
    """Autouse fixture body: fail the test that leaves a `sluice-*` folder behind (and remove it)."""
    before = leftovers(root)
    yield
    new = settled(root, before)
    for name in new:
        shutil.rmtree(root / name, ignore_errors=True)
    if new:
        pytest.fail(f"{nodeid} left temporary folders: {sorted(new)}", pytrace=False)
