""".ci/check_imports.py's door rule: outside the worker, only sluice's commands import it, by its door, lazily."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _checker():
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / ".ci" / "check_imports.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _house(tmp_path: Path, module: str, source: str) -> Path:
    """A small tree of sluice/, gpu_worker/ and functions/ with `source` as `module` (a dotted name)."""
    files = {
        "sluice/__init__.py": "",
        "sluice/commands/__init__.py": "",
        "sluice/ops/__init__.py": "",
        "functions/__init__.py": "",
        "gpu_worker/__init__.py": "",
        "gpu_worker/errors.py": "",
        "gpu_worker/models/__init__.py": "",
        "gpu_worker/models/engine.py": "",
        "gpu_worker/door.py": "def embed_images():\n    from gpu_worker.models import engine\n",
    }
    files[module.replace(".", "/") + ".py"] = source
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


LAZY_DOOR = "def cmd():\n    from gpu_worker.door import embed_images\n"


@pytest.mark.parametrize(
    "source",
    [
        LAZY_DOOR,
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpu_worker.door import embed_images\n",
        "def cmd():\n    from gpu_worker import door\n",
    ],
    ids=["in a function", "for types only", "the door by its package"],
)
def test_a_command_may_open_the_door_lazily(tmp_path, source):
    assert _checker().problems(_house(tmp_path, "sluice.commands.search", source)) == []


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("sluice.commands.search", "def cmd():\n    from gpu_worker.models.engine import Engine\n"),
        ("sluice.commands.search", "def cmd():\n    import gpu_worker\n"),
        ("sluice.commands.search", "from gpu_worker.door import embed_images\n"),
        ("sluice.commands.search", "try:\n    from gpu_worker import door\nexcept ImportError:\n    door = None\n"),
        ("sluice.ops.report", LAZY_DOOR),
        ("functions.handler", LAZY_DOOR),
    ],
    ids=["past the door", "the package", "at import", "at import, guarded", "not a command", "a Lambda handler"],
)
def test_any_other_way_into_the_worker_is_a_problem(tmp_path, module, source):
    found = _checker().problems(_house(tmp_path, module, source))
    assert len(found) == 1, found
    assert f"{module} imports gpu_worker" in found[0]
    assert "only sluice.commands may import it, through gpu_worker.door, inside a function" in found[0]
