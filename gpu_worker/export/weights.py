"""`sluice model export SPEC --weights FILE`: a local state dict loaded into the architecture SPEC names.

The loader builds the architecture with random weights (the --no-pretrained path) and drops
its classifier head as usual; the file's tensors are then loaded into it, and the spec's
version names the file (file:<basename>@sha256:<hex of its bytes>). A file saved with its
head fits too: a key the model lacks is ignored when it lies under a module the loader
replaced by nn.Identity (torchvision's last Linear, timm's num_classes=0 classifier). An
open_clip file holding the whole CLIP model (visual.* plus the text tower) loads into the
whole model, so the text tower written beside the image tower is the file's too; a bare image
tower (no prefix, or every key under visual.) loads into model.visual and no text tower is
written. Anything else is refused naming the first tensor that does not fit.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from gpu_worker.errors import ExportError
from gpu_worker.export.sources import Source

SUFFIXES = (".pth", ".pt", ".safetensors")
WRAPPERS = ("state_dict", "model")  # where training checkpoints keep the state dict
SAVE_HINT = "save the state dict alone: torch.save(model.state_dict(), FILE) or safetensors.torch.save_file"


@dataclass(frozen=True)
class WeightsFile:
    """A state dict read from a local file, and the version it gives the spec."""

    path: str
    tensors: dict[str, torch.Tensor]
    version: str  # file:<basename>@sha256:<hex of the file's bytes>


def read_weights(path: str) -> WeightsFile:
    """The state dict in `path`: .pth / .pt through torch.load(weights_only=True), or .safetensors."""
    if not path.endswith(SUFFIXES):
        raise ExportError(f"--weights {path}: expected a state dict file ending in {', '.join(SUFFIXES)}")
    if not os.path.isfile(path):
        raise ExportError(f"--weights {path}: no such file")
    try:
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            obj: Any = load_file(path, device="cpu")
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        why = (
            f"it holds a {found.group(1)}, which torch.load(weights_only=True) does not unpickle"
            if found
            else f"{type(exc).__name__}: {str(exc)[:200]}"
        )
        raise ExportError(f"--weights {path}: cannot read it as a state dict ({why}); {SAVE_HINT}") from None
    return WeightsFile(path, _state_dict(obj, path), f"file:{os.path.basename(path)}@sha256:{_sha256(path)}")


def _state_dict(obj: Any, path: str) -> dict[str, torch.Tensor]:
    """`obj` itself, or the dict a checkpoint wraps under "state_dict" or "model", if it maps names to tensors."""
    if isinstance(obj, dict):
        obj = next((obj[k] for k in WRAPPERS if isinstance(obj.get(k), dict)), obj)
    if not isinstance(obj, dict) or not obj:
        raise ExportError(f"--weights {path}: holds a {type(obj).__name__}, not a state dict; {SAVE_HINT}")
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ExportError(
                f"--weights {path}: not a state dict (names -> tensors): {key!r} holds a {type(value).__name__}; "
                f"expected model.state_dict(), or a checkpoint holding it under {' or '.join(map(repr, WRAPPERS))}"
            )
    return obj


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_weights(src: Source, weights: WeightsFile) -> Source:
    """`src` with the file's tensors loaded into its module (in place) and the file as its version."""
    tensors, version = weights.tensors, weights.version
    if src.text is None:  # torchvision, timm: the headless model
        _load(src.module, tensors, src.name, weights.path)
        return replace(src, version=version)
    whole, spec, _ = src.text  # a CLIP-style model: src.module is whole.visual
    visual = {k.removeprefix("visual."): v for k, v in tensors.items() if k.startswith("visual.")}
    if visual and len(visual) < len(tensors):  # image and text towers
        _load(whole, tensors, src.name, weights.path)
        return replace(src, version=version, text=(whole, spec, version))
    _load(src.module, visual or tensors, src.name, weights.path)
    return replace(src, version=version, text=None)  # the file holds no text tower


def _load(model: nn.Module, tensors: dict[str, torch.Tensor], name: str, path: str) -> None:
    """Copy `tensors` into `model` when every tensor fits (the head's aside); else refuse naming the first."""
    own = model.state_dict()
    problems = mismatches(model, own, tensors)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ExportError(
            f"--weights {path} does not fit {name}: {problems[0]}{more}; export the spec (and --image-size) the "
            "file's model was built with, or save that model's state dict"
        )
    # strict=False only for what mismatches() lets pass: head tensors, missing BatchNorm step counters
    model.load_state_dict({k: tensors[k] for k in own if k in tensors}, strict=False)


def mismatches(model: nn.Module, own: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]) -> list[str]:
    """What does not fit, in the model's order then the file's: missing, reshaped, unexpected tensors."""
    problems = []
    for key, want in own.items():
        if key not in tensors:
            if not key.endswith(".num_batches_tracked"):  # a step counter, unused in eval: older files lack it
                problems.append(f"tensor {key} {tuple(want.shape)} is missing from the file")
        elif tensors[key].shape != want.shape:
            got = tuple(tensors[key].shape)
            problems.append(f"tensor {key} has shape {got} in the file, {tuple(want.shape)} in the model")
    problems += [
        f"the file's tensor {k} is not in the model" for k in tensors if k not in own and not _in_head(model, k)
    ]
    return problems


def _in_head(model: nn.Module, key: str) -> bool:
    """Whether `key` lies under a module the loader replaced by Identity (the classifier it dropped)."""
    parent = model
    for part in key.split(".")[:-1]:
        child = dict(parent.named_children()).get(part)
        if child is None:
            return False
        if isinstance(child, nn.Identity):
            return True
        parent = child
    return False
