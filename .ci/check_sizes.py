#!/usr/bin/env python3
"""Size goals CI enforces in sluice/, functions/, gpu_worker/: modules of at most 400 lines, folders of at
most 12 modules, functions of at most 60 lines and 6 parameters, classes of at most 250 lines.

A module's size is its line count, docstring, comments and blank lines included. A folder's is the
modules directly in it, __init__.py and __main__.py not counted (a subfolder counts on its own). A
function's size counts from its `def` line to its last line, docstring included. No name is
exempt: a long module is split by concept into modules of its folder, a crowded folder into
subfolders, a long argparse builder into one function a group of arguments.
Exit 1 and list the offenders, largest first.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sluice", "functions", "gpu_worker")
MAX_FUNCTION, MAX_CLASS, MAX_PARAMS = 60, 250, 6  # more parameters: pass a request, a context or a dataclass
MAX_MODULE, MAX_FOLDER = 400, 12  # lines a module; modules a folder, flat
NOT_COUNTED = ("__init__.py", "__main__.py")  # a package's own files: not modules of its folder


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Parameters a caller passes (self and cls not counted; *args and **kwargs count one each)."""
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - 1 if names and names[0].arg in ("self", "cls") else n


def sizes(path: Path) -> list[tuple[int, str, str]]:
    """(lines, kind, qualified name) of every function and class in one file."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                name = f"{prefix}{child.name}"
                out.append((int(child.end_lineno or child.lineno) - child.lineno + 1, kind, name))
                if not isinstance(child, ast.ClassDef) and params(child) > MAX_PARAMS:
                    out.append((params(child), "parameters of", name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def layout(files: list[Path], root: Path) -> list[tuple[int, str]]:
    """(size, line) for every module over MAX_MODULE lines and every folder over MAX_FOLDER modules."""
    bad: list[tuple[int, str]] = []
    folders: dict[Path, list[str]] = {}
    for path in files:
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE:
            bad.append((n, f"{path.relative_to(root)}: module: {n} lines (limit {MAX_MODULE})"))
        if path.name not in NOT_COUNTED:
            folders.setdefault(path.parent, []).append(path.name)
    for folder, names in folders.items():
        if len(names) > MAX_FOLDER:
            where = f"{folder.relative_to(root)}/"
            text = f"{where}: folder: {len(names)} modules (limit {MAX_FOLDER}): {', '.join(sorted(names))}"
            bad.append((len(names), text))
    return bad


def offenders(root: Path = ROOT) -> list[str]:
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    if not files:
        raise SystemExit(f"no Python files under {root} for {PACKAGES}")
    bad = layout(files, root)
    for path in files:
        for n, kind, name in sizes(path):
            limit = {"class": MAX_CLASS, "function": MAX_FUNCTION}.get(kind, MAX_PARAMS)
            if n > limit:
                unit = "parameters" if kind == "parameters of" else "lines"
                bad.append((n, f"{path.relative_to(root)}: {kind} {name}: {n} {unit} (limit {limit})"))
    return [text for _, text in sorted(bad, reverse=True)]


def main() -> int:
    bad = offenders()
    for line in bad:
        print(line)
    print(
        f"check_sizes: {len(bad)} over the limits"
        if bad
        else "check_sizes: every module, folder, function and class is in size"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
