""".ci/check_sizes.py's module and folder limits: at the limit passes, one past it is named; no name is exempt."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _check_sizes() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_sizes", ROOT / ".ci" / "check_sizes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cs = _check_sizes()


def _module(path: Path, lines: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"X{i} = {i}\n" for i in range(lines)))


def test_a_module_at_the_limit_passes_and_one_line_more_is_named(tmp_path):
    _module(tmp_path / "sluice" / "ok.py", cs.MAX_MODULE)
    _module(tmp_path / "gpu_worker" / "decode" / "long.py", cs.MAX_MODULE + 1)
    _module(tmp_path / "functions" / "__init__.py", cs.MAX_MODULE + 5)  # no name is exempt, __init__ neither
    assert cs.offenders(tmp_path) == [
        f"functions/__init__.py: module: {cs.MAX_MODULE + 5} lines (limit {cs.MAX_MODULE})",
        f"gpu_worker/decode/long.py: module: {cs.MAX_MODULE + 1} lines (limit {cs.MAX_MODULE})",
    ]


def test_a_folder_is_counted_flat_without_init_and_main(tmp_path):
    full = tmp_path / "sluice" / "local"
    for name in ("__init__.py", "__main__.py", *(f"m{i:02d}.py" for i in range(cs.MAX_FOLDER))):
        _module(full / name, 1)
    for i in range(cs.MAX_FOLDER):  # a subfolder's modules count for it, not for its parent
        _module(full / "emulator" / f"e{i:02d}.py", 1)
    assert cs.offenders(tmp_path) == []

    _module(full / "emulator" / "one_more.py", 1)
    (line,) = cs.offenders(tmp_path)
    assert line.startswith(f"sluice/local/emulator/: folder: {cs.MAX_FOLDER + 1} modules (limit {cs.MAX_FOLDER}): ")
    assert "one_more.py" in line and "__init__.py" not in line
