"""Test tiers: markers applied from where a test lives and what it uses, and checked when it runs.

    unit        tests/unit: pure (no moto, no process); `make test-fast` runs exactly these
    moto        uses moto: in-process mock_aws, or a moto server
    subprocess  starts a process: a moto server, Prometheus, promtool, workers, the CLI
    property    hypothesis-driven (SLUICE_PROPERTY_EXAMPLES sets longer runs: tests/properties.py)
    e2e         tests/e2e: `sluice local run` and the local executor, as a person runs them

A test is `moto` when it uses a moto fixture (MOTO_FIXTURES, directly or through another
fixture) or its module names moto (MOTO_NAMES); `subprocess` likewise (PROCESS_FIXTURES,
PROCESS_NAMES). So a new test is classified by what it uses, with nothing to remember. The
classification is checked at run time: a test that starts moto or a process without its
marker fails, naming what it started (then add the marker, or the name to the lists here);
a test under tests/unit that is not pure fails, saying to move it to tests/integration.
"""

from __future__ import annotations

import ast
import functools
import multiprocessing.process
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
MOTO_FIXTURES = frozenset({"aws", "moto_server"})
PROCESS_FIXTURES = frozenset({"moto_server", "prometheus"})
MOTO_NAMES = frozenset({"moto", "mock_aws", "moto_s3", "moto_objects", "MotoServer", "FaultServer"})
PROCESS_NAMES = frozenset(
    {
        "subprocess",
        "multiprocessing",
        "Popen",
        "MotoServer",
        "FaultServer",
        "LocalPrometheus",
        "start_worker",
        "run_worker",
    }
)
MOTO_SERVER_MODULES = ("moto.server", "tests.worker_s3server")
LDCONFIG = "/sbin/ldconfig"


@functools.cache
def module_names(path: Path) -> frozenset[str]:
    """Every module, imported name and identifier a test module mentions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(part for a in node.names for part in a.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            names.update((node.module or "").split("."))
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
    return frozenset(names)


def tier_markers(item: pytest.Item) -> set[str]:
    """The tier markers a collected test gets from its place, its fixtures and its module."""
    path = Path(str(item.path))
    fixtures = set(getattr(item, "fixturenames", ()))
    names = module_names(path) if path.suffix == ".py" else frozenset()
    out = set()
    if TESTS / "e2e" in path.parents:
        out.add("e2e")
    if fixtures & MOTO_FIXTURES or names & MOTO_NAMES:
        out.add("moto")
    if fixtures & PROCESS_FIXTURES or names & PROCESS_NAMES:
        out.add("subprocess")
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        out.add("property")
    return out


def classify(items: list[pytest.Item]) -> None:
    """pytest_collection_modifyitems: add the tier markers (explicit ones stay)."""
    for item in items:
        for name in sorted(tier_markers(item) - {m.name for m in item.iter_markers()}):
            item.add_marker(getattr(pytest.mark, name))


def is_unit(item: pytest.Item) -> bool:
    return TESTS / "unit" in Path(str(item.path)).parents


class Starts:
    """What the running test started: moto (in-process or a server) and processes (one line each)."""

    def __init__(self) -> None:
        self.moto: list[str] = []
        self.processes: list[str] = []
        self.active = False

    def note_popen(self, args: Any) -> None:
        if not self.active:
            return
        argv = [str(a) for a in args] if isinstance(args, list | tuple) else [str(args)]
        if argv[:2] == [LDCONFIG, "-p"]:
            return  # ctypes.util.find_library's library lookup (torchvision's first import), not a test's process
        self.processes.append(" ".join(argv[:4]))
        if any(m in argv for m in MOTO_SERVER_MODULES):
            self.moto.append("a moto server: " + " ".join(argv[:4]))

    def note(self, kind: str, what: str) -> None:
        if self.active:
            (self.moto if kind == "moto" else self.processes).append(what)


STARTS = Starts()


def install_probes() -> None:
    """Wrap subprocess.Popen, multiprocessing's Process.start and moto's mock_aws start (once)."""
    from moto.core.models import MockAWS

    if getattr(subprocess.Popen.__init__, "_sluice_probe", False):
        return
    popen_init = subprocess.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start
    moto_start = MockAWS.start

    def popen(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        STARTS.note_popen(args)
        popen_init(self, args, *a, **kw)

    def start(self: Any) -> None:
        STARTS.note("process", f"multiprocessing {self.name}")
        process_start(self)

    def mock(self: Any, *a: Any, **kw: Any) -> Any:
        STARTS.note("moto", "mock_aws")
        return moto_start(self, *a, **kw)

    popen._sluice_probe = True  # type: ignore[attr-defined]
    subprocess.Popen.__init__ = popen  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
    MockAWS.start = mock  # type: ignore[method-assign]


def checked(item: pytest.Item) -> Iterator[None]:
    """Autouse fixture body: fail a unit test that is not pure, or a test that starts what its markers deny."""
    marks = {m.name for m in item.iter_markers()}
    if is_unit(item) and marks & {"moto", "subprocess", "e2e"}:
        pytest.fail(
            f"{item.nodeid} is marked {sorted(marks & {'moto', 'subprocess', 'e2e'})}: unit tests are pure "
            "(no moto, no process); move it (or its impure cases) to tests/integration",
            pytrace=False,
        )
    STARTS.moto.clear()
    STARTS.processes.clear()
    STARTS.active = True
    try:
        yield
    finally:
        STARTS.active = False
    unmarked = []
    if STARTS.moto and "moto" not in marks:
        unmarked.append(f"moto ({STARTS.moto[0]})")
    if STARTS.processes and "subprocess" not in marks:
        unmarked.append(f"a process ({STARTS.processes[0]})")
    if unmarked:
        where = "move it to tests/integration" if is_unit(item) else "mark it, or teach tests/tiers.py the name"
        pytest.fail(f"{item.nodeid} started {' and '.join(unmarked)} but is not marked so: {where}", pytrace=False)
