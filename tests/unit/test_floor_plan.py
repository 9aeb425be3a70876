"""The floor plan's one source: .ci/check_imports.py's floors, and the docs' tables made from them."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / ".ci" / "check_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docs(tmp_path: Path, checker: ModuleType) -> Path:
    """A copy of the docs that hold the floor tables."""
    for doc in checker.DOC_TABLES.values():
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    return tmp_path


def test_the_docs_tables_are_the_checkers(checker):
    assert checker.stale_docs() == []
    table = checker.floor_table("sluice")
    assert "| 2 | `sluice/plan/` |" in table and "| 4 | `sluice/control/`, `gpu_worker/` |" in table
    worker = checker.floor_table("gpu_worker")
    assert "| 4.1 | `__init__.py`, `errors.py`, `log.py`, `procs.py` |" in worker  # the checker's numbering
    assert worker.count("\n| 4.") == len(checker.WORKER_FLOORS)


def test_a_stale_table_is_named_with_the_command_and_rewritten(checker, tmp_path):
    root = _docs(tmp_path, checker)
    doc = root / "docs" / "architecture.md"
    fresh = doc.read_text()
    doc.write_text(fresh.replace("| 2 | `sluice/plan/` |", "| 2 | `sluice/plan/`, `sluice/input/` |"))
    assert checker.stale_docs(root) == [
        "docs/architecture.md: the floor table is stale: run `python .ci/check_imports.py --docs`"
    ]
    assert checker.write_docs(root) == ["docs/architecture.md"]
    assert doc.read_text() == fresh and checker.stale_docs(root) == []
    assert checker.write_docs(root) == []  # nothing left to write


def test_a_doc_without_its_table_is_named(checker, tmp_path):
    root = _docs(tmp_path, checker)
    doc = root / "docs" / "worker.md"
    doc.write_text(doc.read_text().replace("<!-- floors:gpu_worker -->", ""))
    (problem,) = checker.stale_docs(root)
    assert problem.startswith("docs/worker.md: no floor table (<!-- floors:gpu_worker -->")


def test_a_room_moved_to_another_floor_makes_the_table_stale(checker, tmp_path, monkeypatch):
    root = _docs(tmp_path, checker)
    floors = list(checker.FLOORS)
    floors[1], floors[2] = floors[2], floors[1]  # sluice.plan below sluice.input: a new floor plan
    monkeypatch.setattr(checker, "FLOORS", floors)
    assert checker.stale_docs(root) == [
        "docs/architecture.md: the floor table is stale: run `python .ci/check_imports.py --docs`"
    ]
    checker.write_docs(root)
    assert "| 1 | `sluice/plan/` |" in (root / "docs" / "architecture.md").read_text()
