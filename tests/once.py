"""What a whole test run makes once, whatever the number of pytest processes: an exported model.

`made_once(tmp_path_factory, name, make)` returns a folder `make(folder)` filled: the first
process to get there makes it under a lock, the others (pytest-xdist workers of the same run)
wait for it and reuse it. The folder lives under the run's pytest base folder, which every
worker of the run shares, so it goes with the run's other temporary folders.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

DONE = ".made"


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every process of this pytest run shares (the workers' base folders are inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`name`'s folder, made by `make` in the first process that asks, under a lock; a failed make is retried."""
    root = run_root(tmp_path_factory)
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)  # a make that failed part way
            folder.mkdir()
            make(folder)
            (folder / DONE).touch()
    return folder
