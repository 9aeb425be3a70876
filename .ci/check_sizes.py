#!/usr/bin/env python3
"""Size goals CI enforces: no function over 60 lines, no class over 250, in sluice/, functions/, gpu_worker/.

A function's size counts from its `def` line to its last line, docstring included. The
argparse builders (their length is the CLI's surface, one add_argument a line) are exempt.
Exit 1 and list the offenders, largest first.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sluice", "functions", "gpu_worker")
MAX_FUNCTION, MAX_CLASS = 60, 250
EXEMPT = {"build_parser"}  # argparse builders


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
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def offenders(root: Path = ROOT) -> list[str]:
    bad: list[tuple[int, str]] = []
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))]
    if not files:
        raise SystemExit(f"no Python files under {root} for {PACKAGES}")
    for path in files:
        for n, kind, name in sizes(path):
            limit = MAX_CLASS if kind == "class" else MAX_FUNCTION
            if n > limit and name.rsplit(".", 1)[-1] not in EXEMPT:
                bad.append((n, f"{path.relative_to(root)}: {kind} {name} is {n} lines (limit {limit})"))
    return [text for _, text in sorted(bad, reverse=True)]


def main() -> int:
    bad = offenders()
    for line in bad:
        print(line)
    print(f"check_sizes: {len(bad)} over the limits" if bad else "check_sizes: every function and class is in size")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
