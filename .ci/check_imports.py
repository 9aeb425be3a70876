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

This file is the floor plan's one source: the docs' floor tables (docs/architecture.md, "Modules";
docs/worker.md, "Floor plan") are made from FLOORS and WORKER_FLOORS between <!-- floors:NAME -->
and <!-- /floors --> markers. `--docs` rewrites them; the plain run also fails when one is stale.

Exit 1 and list every offending import (and every stale table).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sluice", "gpu_worker", "functions")


class Floor(NamedTuple):
    """A floor's rooms (packages, or top-level modules) and what lives there (one line: the docs' tables)."""

    rooms: tuple[str, ...]  # in the order `what` speaks of them
    what: str


# Lowest first, numbered from 0. The foundation is what every role shares; each floor above may use it.
FLOORS: list[Floor] = [
    Floor(
        (
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
        ),
        "what every role shares: contracts, models, paths, settings, errors, logs, the shard codec, output columns, "
        "model identity, and the AWS boundary",
    ),
    Floor(
        ("sluice.input", "sluice.preflight"),
        "what a run reads (the manifest and its keys) and the limits it is checked against",
    ),
    Floor(
        ("sluice.plan",),
        "the planner: keys -> unique keys -> shards -> plan.json (every plan is built and written here)",
    ),
    Floor(
        ("sluice.prepare", "sluice.index"),
        "the same at scale on CPU Batch jobs, with the incremental map and reduce halves; the search index and its "
        "stage's CPU job (docs/index.md)",
    ),
    Floor(
        ("sluice.control", "gpu_worker"),
        "the control plane (the two Lambdas' cores) and the GPU worker container (its own floors: docs/worker.md)",
    ),
    Floor(
        ("sluice.ops", "functions"),
        "what operators run (plan report, status, metrics, recipes) and the thin Lambda handlers",
    ),
    Floor(("sluice.local",), "`sluice local run`: the same code on an emulator"),
    Floor(
        ("sluice.cli", "sluice.commands"),
        "the `sluice` console script: its top-level parser, and its commands (one module a subsystem)",
    ),
]
# The worker's rooms, lowest first, numbered from 1 inside FLOORS' "gpu_worker" floor (4.1, 4.2, ...).
WORKER_FLOORS: list[Floor] = [
    Floor(
        ("gpu_worker", "gpu_worker.errors", "gpu_worker.log", "gpu_worker.procs"),
        "exceptions and the exit-code ladder, JSON logs, process helpers",
    ),
    Floor(
        ("gpu_worker.telemetry",),
        "counters (`stats.py`), metric families, the collector, /metrics and remote write to AMP",
    ),
    Floor(
        ("gpu_worker.config", "gpu_worker.env"),
        "the worker's settings; which shard, node and attempt; the instance type",
    ),
    Floor(
        ("gpu_worker.sources",),
        "one S3 GET with its retries (`fetch.py`), the S3 clients and the run's files over the control one "
        "(`clients.py`: `control_store()`, an ObjectStore of sluice/aws/store.py; shards read by sluice/aws/ranged.py)",
    ),
    Floor(
        ("gpu_worker.decode", "gpu_worker.output"),
        "bytes to pixels (Pillow, nvJPEG, video frames); chunks, markers, the shard's result and verdict",
    ),
    Floor(
        ("gpu_worker.models",),
        "builtins, a model file's spec, loading, the inference engine, the text tower",
    ),
    Floor(
        ("gpu_worker.kinds", "gpu_worker.watchdog", "gpu_worker.fence"),
        "text and video embedders; progress beats and the stall watchdog; the tail's fence",
    ),
    Floor(
        ("gpu_worker.passes", "gpu_worker.export"),
        "a rank's pass over its keys (the image pass and its loaders, the parts pass, their shared base); "
        "`sluice model export`",
    ),
    Floor(
        ("gpu_worker.rank", "gpu_worker.autotune", "gpu_worker.door"),
        "one rank (the process entry), the batch-size probe; the CLI's one door into the worker",
    ),
    Floor(("gpu_worker.main", "gpu_worker.__main__"), "the node: `python -m gpu_worker`"),
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


def worker_floor() -> int:
    """The floor of FLOORS the worker's house stands on."""
    return next(i for i, floor in enumerate(FLOORS) if "gpu_worker" in floor.rooms)


def floor_of(r: str) -> tuple[int, int]:
    """(floor in FLOORS, floor in WORKER_FLOORS: 0 outside the worker); compared as a pair."""
    if r.split(".")[0] == "gpu_worker":
        for j, floor in enumerate(WORKER_FLOORS):
            if r in floor.rooms:
                return worker_floor(), j + 1
        raise SystemExit(f"check_imports: room {r} is on no floor: add it to WORKER_FLOORS in .ci/check_imports.py")
    for i, floor in enumerate(FLOORS):
        if r in floor.rooms:
            return i, 0
    raise SystemExit(f"check_imports: room {r} is on no floor: add it to FLOORS in .ci/check_imports.py")


def label(f: int, w: int = 0) -> str:
    """A floor's number, in the messages and the docs alike: 4, or 4.3 for the worker's third floor."""
    return f"{f}.{w}" if w else str(f)


def floor_text(r: str) -> str:
    return "floor " + label(*floor_of(r))


def crossing(a: str, b: str) -> bool:
    """True when room `a` may not import room `b`: b is on a higher floor, or a worker room reaches past the foundation."""
    if floor_of(b) > floor_of(a):
        return True
    return a.startswith("gpu_worker") and not b.startswith("gpu_worker") and b not in FLOORS[0].rooms


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
                out.append(
                    f"{where}:{line}: {name} imports {target}: {a} ({floor_text(a)}) may not import {b} ({floor_text(b)})"
                )
            if not through_door(a, target, deferred):
                out.append(
                    f"{where}:{line}: {name} imports {target}: outside the worker only {', '.join(sorted(DOOR_ROOMS))} "
                    f"may import it, through {WORKER_DOOR}, inside a function"
                )
    out += [f"import circle between modules: {' <-> '.join(c)}" for c in circles(mod_graph)]
    out += [f"import circle between rooms: {' <-> '.join(c)}" for c in circles(room_graph)]
    return out


def misplaced_rooms(root: Path = ROOT) -> list[str]:
    """Rooms FLOORS or WORKER_FLOORS name that are no module, or name twice (the tables would show them)."""
    known, out = modules(root), []
    for house in (FLOORS, WORKER_FLOORS):  # gpu_worker is on both: the worker's house, and its __init__ room
        placed = [r for floor in house for r in floor.rooms]
        out += [f"{r} is on a floor in .ci/check_imports.py but is no module" for r in placed if r not in known]
        out += [f"{r} is on two floors in .ci/check_imports.py" for r in sorted(set(placed)) if placed.count(r) > 1]
    return out


# Each generated table, and the doc that must hold it between <!-- floors:NAME --> and <!-- /floors -->.
DOC_TABLES = {"sluice": "docs/architecture.md", "gpu_worker": "docs/worker.md"}
TABLE = re.compile(r"(<!-- floors:(?P<name>\w+) -->\n)(?P<body>.*?)(<!-- /floors -->)", re.S)
DOCS_COMMAND = "python .ci/check_imports.py --docs"


def room_path(r: str, house: str) -> str:
    """Room `r` as `house`'s table names it: a package's folder, a module's file, the house's own __init__.py."""
    rel = r.replace(".", "/")
    if r == house:
        rel += "/__init__.py"
    else:
        rel += "/" if (ROOT / rel).is_dir() else ".py"
    return rel.removeprefix(house + "/") if house == "gpu_worker" else rel


def floor_table(house: str) -> str:
    """The docs' table of `house`'s floors ("sluice": FLOORS, "gpu_worker": WORKER_FLOORS), lowest first."""
    if house not in DOC_TABLES:
        raise SystemExit(f"check_imports: no floor table {house!r} (the tables: {', '.join(DOC_TABLES)})")
    rows = (
        [(label(i), f) for i, f in enumerate(FLOORS)]
        if house == "sluice"
        else [(label(worker_floor(), j + 1), f) for j, f in enumerate(WORKER_FLOORS)]
    )
    lines = ["| floor | rooms | what lives there |", "|---|---|---|"]
    for number, floor in rows:
        rooms = ", ".join(f"`{room_path(r, house)}`" for r in floor.rooms)
        lines.append(f"| {number} | {rooms} | {floor.what} |")
    return "\n".join(lines) + "\n\n"  # a blank line: the closing marker is not a row


def with_tables(text: str) -> str:
    """`text` with every floor table between its markers made afresh."""
    return TABLE.sub(lambda m: m.group(1) + floor_table(m.group("name")) + m.group(4), text)


def stale_docs(root: Path = ROOT) -> list[str]:
    """The docs under `root` whose floor table is missing or differs from FLOORS and WORKER_FLOORS, and what to do."""
    out = []
    for house, doc in DOC_TABLES.items():
        text = (root / doc).read_text()
        if f"<!-- floors:{house} -->" not in text:
            out.append(
                f"{doc}: no floor table (<!-- floors:{house} --> ... <!-- /floors -->): add its markers, "
                f"then run `{DOCS_COMMAND}`"
            )
        elif with_tables(text) != text:
            out.append(f"{doc}: the floor table is stale: run `{DOCS_COMMAND}`")
    return out


def write_docs(root: Path = ROOT) -> list[str]:
    """Rewrite the floor tables between their markers in the docs under `root`; the docs that changed."""
    written = []
    for doc in sorted(set(DOC_TABLES.values())):
        text = (root / doc).read_text()
        if (new := with_tables(text)) != text:
            (root / doc).write_text(new)
            written.append(doc)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python .ci/check_imports.py", description=__doc__.splitlines()[0])
    p.add_argument("--docs", action="store_true", help="rewrite the docs' floor tables from FLOORS and WORKER_FLOORS")
    if p.parse_args(argv).docs:
        for doc in write_docs():
            print(f"wrote {doc}")
        return 0
    bad = problems() + misplaced_rooms() + stale_docs()
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
