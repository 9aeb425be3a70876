#!/usr/bin/env python3
"""The floor plan CI enforces: no import circle, and no import from a lower floor to a higher one.

Every `import` and `from ... import` in sluice/, functions/ and gpu_worker/ counts, deferred
ones (inside a function) and TYPE_CHECKING ones too: a circle hidden in a function body is
still a circle. Three checks:

- circles: between modules, and between rooms (a package or a top-level module of sluice/ or
  gpu_worker/, functions);
- floors: a room imports only rooms on its own floor or below (FLOORS, lowest first). The worker's
  rooms have floors of their own (WORKER_FLOORS), all on FLOORS' worker floor: sluice's rooms on
  that floor or below never import the worker, and the worker imports only sluice's foundation;
- the door: outside the worker, only DOOR_ROOMS import it, only WORKER_DOOR, and only where the
  import does not run with the module (inside a function, or under `if TYPE_CHECKING:`), so
  `sluice --help` and the Lambdas never load the worker's torch.

Exit 1 and list every offending import.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sluice", "gpu_worker", "functions")
# Lowest first. The foundation is what every role shares (contracts, paths, settings, errors,
# the AWS boundary, the shard codec, manifest and plan models); each floor above may use it.
FLOORS: list[set[str]] = [
    {
        "sluice",
        "sluice.aws",
        "sluice.contracts",
        "sluice.errors",
        "sluice.log",
        "sluice.modelid",
        "sluice.outputs",
        "sluice.paths",
        "sluice.settings",
        "sluice.shards",
    },
    {"sluice.input", "sluice.preflight"},
    {"sluice.plan"},
    {"sluice.prepare", "sluice.index"},  # the stages' CPU jobs: prepare, and the search index
    {"sluice.control", "gpu_worker"},  # gpu_worker: WORKER_FLOORS inside this floor
    {"sluice.ops", "functions"},
    {"sluice.local"},
    {"sluice.cli", "sluice.commands"},  # the console script and its commands (sluice.cli imports them)
]
# The worker's rooms, lowest first (docs/worker.md draws them). Each sits on FLOORS' "gpu_worker" floor.
WORKER_FLOORS: list[set[str]] = [
    {"gpu_worker", "gpu_worker.errors", "gpu_worker.log", "gpu_worker.procs"},
    {"gpu_worker.telemetry"},  # counters, metric families, remote write
    {"gpu_worker.config", "gpu_worker.env"},  # settings and the container's environment
    {"gpu_worker.sources"},  # S3 GETs, the run's files, ranged shard reads
    {"gpu_worker.decode", "gpu_worker.output"},  # bytes -> pixels; chunks, markers, the shard's result
    {"gpu_worker.models"},  # builtins, specs, loading, the engine, the text tower
    {"gpu_worker.kinds", "gpu_worker.watchdog"},  # text and video embedders; progress beats
    {"gpu_worker.passes", "gpu_worker.export"},  # a rank's pass over its keys; `sluice model export`
    {"gpu_worker.rank", "gpu_worker.autotune", "gpu_worker.door"},  # a rank; the batch-size probe; the CLI's door
    {"gpu_worker.main", "gpu_worker.__main__"},  # the node: `python -m gpu_worker`
]
# The worker's one door (docs/worker.md): what sluice's CLI may use of it, imported only from DOOR_ROOMS.
WORKER_DOOR = "gpu_worker.door"
DOOR_ROOMS = {"sluice.commands"}


def modules(root: Path = ROOT) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for p in sorted((root / pkg).rglob("*.py")):
            name = ".".join(p.relative_to(root).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[int, str, bool]]:
    """(line, module, deferred) for every import of one of ours in the file, resolved to the module it loads;
    deferred: the import does not run with the module (it is in a function or under `if TYPE_CHECKING:`)."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    deferred = {id(n) for body in _deferred_bodies(tree) for stmt in body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                yield node.lineno, t, id(node) in deferred


def _deferred_bodies(tree: ast.AST) -> Iterator[list[ast.stmt]]:
    """The statement lists that do not run when the module is imported: function bodies, `if TYPE_CHECKING:`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.body
        elif isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            yield node.body


def room(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] not in ("sluice", "gpu_worker") else ".".join(parts[:2])


def floor_of(r: str) -> tuple[int, int]:
    """(floor in FLOORS, floor in WORKER_FLOORS: 0 outside the worker); compared as a pair."""
    if r.split(".")[0] == "gpu_worker":
        worker = next(i for i, rooms in enumerate(FLOORS) if "gpu_worker" in rooms)
        for j, rooms in enumerate(WORKER_FLOORS):
            if r in rooms:
                return worker, j + 1
        raise SystemExit(f"check_imports: room {r} is on no floor: add it to WORKER_FLOORS in .ci/check_imports.py")
    for i, rooms in enumerate(FLOORS):
        if r in rooms:
            return i, 0
    raise SystemExit(f"check_imports: room {r} is on no floor: add it to FLOORS in .ci/check_imports.py")


def floor_text(r: str) -> str:
    f, w = floor_of(r)
    return f"floor {f}" + (f".{w}" if w else "")


def crossing(a: str, b: str) -> bool:
    """True when room `a` may not import room `b`: b is on a higher floor, or a worker room reaches past the foundation."""
    if floor_of(b) > floor_of(a):
        return True
    return a.startswith("gpu_worker") and not b.startswith("gpu_worker") and b not in FLOORS[0]


def through_door(a: str, target: str, deferred: bool) -> bool:
    """False when room `a` reaches into the worker other than by a deferred import of the door from DOOR_ROOMS."""
    if a.partition(".")[0] == "gpu_worker" or target.partition(".")[0] != "gpu_worker":
        return True
    return target == WORKER_DOOR and a in DOOR_ROOMS and deferred


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def problems(root: Path = ROOT) -> list[str]:
    known = modules(root)
    out: list[str] = []  # how many modules a folder holds: .ci/check_sizes.py
    mod_graph: dict[str, set[str]] = {m: set() for m in known}
    room_graph: dict[str, set[str]] = {}
    for name, path in known.items():
        for line, target, deferred in imports(name, path, known):
            mod_graph[name].add(target)
            a, b = room(name), room(target)
            if a == b:
                continue
            room_graph.setdefault(a, set()).add(b)
            where = path.relative_to(root)
            if crossing(a, b):
                out.append(f"{where}:{line}: {name} imports {target}: {a} ({floor_text(a)}) may not import {b} ({floor_text(b)})")
            if not through_door(a, target, deferred):
                out.append(
                    f"{where}:{line}: {name} imports {target}: outside the worker only {', '.join(sorted(DOOR_ROOMS))} "
                    f"may import it, through {WORKER_DOOR}, inside a function"
                )
    out += [f"import circle between modules: {' <-> '.join(c)}" for c in circles(mod_graph)]
    out += [f"import circle between rooms: {' <-> '.join(c)}" for c in circles(room_graph)]
    return out


def main() -> int:
    bad = problems()
    for line in bad:
        print(line)
    print(
        f"check_imports: {len(bad)} problem(s)"
        if bad
        else "check_imports: no circle, no import runs back up, none into the worker but by its door"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
