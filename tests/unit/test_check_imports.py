""".ci/check_imports.py: the door rule (outside the worker, only sluice's commands import it, by its door, lazily),
and the floor plan it is the one source of (the docs' floor tables made from it)."""

from __future__ import annotations

import importlib.util
import shutil
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


STALE = "docs/architecture.md: the floor table is stale: run `python .ci/check_imports.py --docs`"


def _docs(tmp_path: Path, checker) -> Path:
    """A copy of the docs that hold the floor tables."""
    for doc in checker.DOC_TABLES.values():
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    return tmp_path


def test_the_docs_tables_are_the_checkers_and_every_room_is_placed_once():
    checker = _checker()
    assert checker.stale_docs() == [] and checker.misplaced_rooms() == []
    table = checker.floor_table("sluice")
    assert "| 2 | `sluice/plan/` |" in table and "| 4 | `sluice/control/`, `gpu_worker/` |" in table
    worker = checker.floor_table("gpu_worker")
    assert "| 4.1 | `__init__.py`, `errors.py`, `log.py`, `procs.py` |" in worker  # the checker's numbering
    assert worker.count("\n| 4.") == len(checker.WORKER_FLOORS)


def test_a_stale_table_is_named_with_the_command_and_rewritten(tmp_path):
    checker = _checker()
    root = _docs(tmp_path, checker)
    doc = root / "docs" / "architecture.md"
    fresh = doc.read_text()
    doc.write_text(fresh.replace("| 2 | `sluice/plan/` |", "| 2 | `sluice/plan/`, `sluice/input/` |"))
    assert checker.stale_docs(root) == [STALE]
    assert checker.write_docs(root) == ["docs/architecture.md"]
    assert doc.read_text() == fresh and checker.stale_docs(root) == []
    assert checker.write_docs(root) == []  # nothing left to write


def test_a_doc_without_its_table_is_named(tmp_path):
    checker = _checker()
    root = _docs(tmp_path, checker)
    doc = root / "docs" / "worker.md"
    doc.write_text(doc.read_text().replace("<!-- floors:gpu_worker -->", ""))
    (problem,) = checker.stale_docs(root)
    assert problem.startswith("docs/worker.md: no floor table (<!-- floors:gpu_worker -->")


def test_a_room_moved_to_another_floor_makes_the_table_stale(tmp_path):
    checker = _checker()
    root = _docs(tmp_path, checker)
    checker.FLOORS[1], checker.FLOORS[2] = checker.FLOORS[2], checker.FLOORS[1]  # sluice.plan below sluice.input
    assert checker.stale_docs(root) == [STALE]
    checker.write_docs(root)
    assert "| 1 | `sluice/plan/` |" in (root / "docs" / "architecture.md").read_text()


def test_a_room_on_no_module_or_on_two_floors_is_named():
    checker = _checker()
    checker.FLOORS[1] = checker.Floor((*checker.FLOORS[1].rooms, "sluice.gone", "sluice.plan"), "")
    assert checker.misplaced_rooms() == [
        "sluice.gone is on a floor in .ci/check_imports.py but is no module",
        "sluice.plan is on two floors in .ci/check_imports.py",
    ]
