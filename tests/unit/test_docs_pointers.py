"""docs/architecture.md's "Where things are decided": every pointer names a file that exists and a name it defines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def decision_rows() -> list[tuple[str, str]]:
    """(decision, where) of every row of the table."""
    text = DOC.read_text()
    body = text.split("### Where things are decided", 1)[1].split("\n\n", 3)[2]
    rows = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and not set(cells[1]) <= {"-"} and cells[0] != "decision":
            rows.append((cells[0], cells[1]))
    return rows


def defined(path: Path) -> dict[str, set[str]]:
    """Names a module binds at its top level (defs, classes, assignments, imports), each with its class's members."""
    out: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            members = set()
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    members.add(sub.name)
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    members.add(sub.target.id)
                elif isinstance(sub, ast.Assign):
                    members |= {t.id for t in sub.targets if isinstance(t, ast.Name)}
            out[node.name] = members
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = set()
        elif isinstance(node, ast.Assign):
            out |= {t.id: set() for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = set()
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).split(".")[0]: set() for a in node.names}
    return out


def problems_of(where: str) -> list[str]:
    """What is wrong with one row's pointers: a missing file, or a name its file does not define."""
    bad: list[str] = []
    current: Path | None = None  # the file a bare name belongs to
    base = ROOT  # where a file named without its folder is
    for token in re.findall(r"`([^`]+)`", where):
        file, _, name = token.partition("::")
        if file.endswith(".py") or file.endswith("/"):
            path = ROOT / file if "/" in file.rstrip("/") else base / file
            if not path.exists():
                bad.append(f"{token}: no file {path.relative_to(ROOT)}")
                continue
            if path.is_dir():
                base = path
                continue
            current, base = path, path.parent
        elif current is None or not re.fullmatch(r"[A-Za-z_][\w.]*", token):
            continue  # a setting or a value, not a code pointer
        else:
            name = token
        if name and current is not None and current.suffix == ".py":
            cls, _, member = name.partition(".")
            names = defined(current)
            if cls not in names or (member and member not in names[cls]):
                bad.append(f"{token}: {current.relative_to(ROOT)} defines no {name}")
    return bad


def test_every_decision_points_at_code_that_exists():
    rows = decision_rows()
    assert len(rows) >= 30, "the table was not found where expected"
    bad = [f"{decision}: {p}" for decision, where in rows for p in problems_of(where)]
    assert not bad, "\n".join(bad)


def test_a_wrong_pointer_is_found():
    assert problems_of("`sluice/contracts/plan.py::pass_batch`") == []
    assert problems_of("`sluice/contracts/plan.py::RunPlan.effective_batch`") == []
    assert problems_of("`sluice/contracts/plan.py::no_such_rule`") == [
        "sluice/contracts/plan.py::no_such_rule: sluice/contracts/plan.py defines no no_such_rule"
    ]
    assert problems_of("`sluice/nowhere.py::x`")[0].startswith("sluice/nowhere.py::x: no file")
