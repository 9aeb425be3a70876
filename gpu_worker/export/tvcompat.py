"""Import torchvision where its compiled ops cannot load (a CPU-only torch).

PyPI's torchvision wheels are built against the CUDA torch of the same version. Next to a
CPU-only torch their C extension fails to load, and torchvision 0.28's import then fails too:
it registers fake kernels for `torchvision::nms` and `torchvision::qnms` whether or not the
extension defined them. Defining those two schemas first lets the pure-Python parts (every
classification model, the transforms) import; the detection ops (nms, roi_align ...) stay
unavailable and raise if called, which no image encoder does. Where the extension loads (a
CUDA torch), this does nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

_LIB: list[Any] = []  # the Library object must live as long as the process


def _extension_loads() -> bool:
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # not installed: the import will say so itself
    for folder in spec.submodule_search_locations:
        for lib in Path(folder).glob("_C*.so"):
            try:
                torch.ops.load_library(str(lib))
                return True
            except (OSError, RuntimeError):
                return False
    return False


def ensure_importable() -> None:
    """Make `import torchvision` work on this torch (idempotent)."""
    if _LIB or "torchvision" in sys.modules or _extension_loads():
        return
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIB.append(lib)
