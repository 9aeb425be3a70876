"""Loading a model a worker can run, and the spec it carries (input size, mean/std, output dim).

    builtin:NAME            a builtin network (gpu_worker.models.builtins), seeded, untrained
    <path or s3://>.pt2     a torch.export program (torch.export.save)
    <path or s3://> other   a TorchScript module (torch.jit.save)

A file's spec comes from, in order: a sidecar `<file>.json`, an embedded extra file
`sluice.json` (torch.jit.save _extra_files / torch.export.save extra_files), defaults
(ImageNet mean/std, the plan's image_size, output dim found by a dry run); gpu_worker.models.spec
reads it. Nothing is ever downloaded from a model hub: weights live in the file
(`sluice model export` makes such files from torchvision, timm, open_clip and Hugging Face).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gpu_worker.decode.preprocess import Preprocess, from_spec, legacy
from gpu_worker.errors import ConfigError
from gpu_worker.models.builtins import BUILTINS, build_builtin
from gpu_worker.models.spec import IMAGENET_MEAN, IMAGENET_STD, META_NAME, parse_spec
from sluice.contracts.sections import file_kinds


@dataclass(frozen=True)
class ModelInfo:
    """What the pipeline needs to know about a model."""

    name: str
    kind: str  # builtin | torchscript | export
    image_size: int
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    output_dim: int | None = None  # None: found by the dry run
    version: str = ""  # the spec's version (exported artifacts: the weights' tag)
    eager: bool = False  # a plain nn.Module (may be traced on CPU)
    precision: str = "bf16"  # the spec's: "fp32" when bf16 changed its embeddings at export (no autocast)
    prep: Preprocess | None = field(default=None, compare=False)  # the spec's `preprocess`; None: legacy

    @property
    def preprocess(self) -> Preprocess:
        """How images become this model's input (gpu_worker.decode.preprocess)."""
        return self.prep if self.prep is not None and self.prep.size == self.image_size else legacy(self.image_size)


def load_scripted(path: str, what: str, *files: str) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """A TorchScript artifact of a kind (text, audio): the module, its extra files and its parsed spec.

    `files` names the extra files besides the spec (a tokenizer); a file that does not load is a
    ConfigError naming `what`.
    """
    extra = {META_NAME: "", **dict.fromkeys(files, "")}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated, still supported
            net = torch.jit.load(path, map_location="cpu", _extra_files=extra).eval()
    except Exception as exc:
        raise ConfigError(f"cannot load {what} model {path}: {type(exc).__name__}: {str(exc)[:200]}") from None
    return net, extra, parse_spec(path, extra[META_NAME] or None)


def _apply_meta(info: ModelInfo, meta: dict[str, Any]) -> ModelInfo:
    changes: dict[str, Any] = {}
    if "name" in meta:
        changes["name"] = str(meta["name"])
    if "version" in meta:
        changes["version"] = str(meta["version"])
    if "image_size" in meta:
        changes["image_size"] = int(meta["image_size"])
    if "mean" in meta:
        changes["mean"] = tuple(float(v) for v in meta["mean"])
    if "std" in meta:
        changes["std"] = tuple(float(v) for v in meta["std"])
    if "output_dim" in meta:
        changes["output_dim"] = int(meta["output_dim"])
    if meta.get("precision") in ("bf16", "fp32"):
        changes["precision"] = str(meta["precision"])
    if meta.get("preprocess") is not None:  # parse_spec checked it
        changes["prep"] = from_spec(meta["preprocess"], int(changes.get("image_size", info.image_size)))
    return replace(info, **changes)


def load_model(uri: str, image_size: int) -> tuple[Any, ModelInfo]:
    """(callable model on CPU in eval mode, its spec). `uri` is builtin:NAME or a local file."""
    if uri.startswith("builtin:"):
        name = uri.split(":", 1)[1]
        model = build_builtin(name)
        return model, ModelInfo(
            name=uri, kind="builtin", image_size=image_size, output_dim=BUILTINS[name][1], eager=True
        )
    if not os.path.isfile(uri):
        raise ConfigError(f"model file {uri!r} does not exist (expected builtin:NAME, a path or an s3:// URI)")
    base = ModelInfo(
        name=os.path.basename(uri), kind="export" if uri.endswith(".pt2") else "torchscript", image_size=image_size
    )
    try:
        if base.kind == "export":
            extra: dict[str, Any] = {META_NAME: ""}
            program = torch.export.load(uri, extra_files=extra)
            model = program.module()
        else:
            extra = {META_NAME: ""}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated, still supported
                model = torch.jit.load(uri, map_location="cpu", _extra_files=extra)
            model.eval()
    except ConfigError:
        raise
    except Exception as exc:
        hint = "torch.export.save" if base.kind == "export" else "torch.jit.save (or name the file *.pt2)"
        raise ConfigError(f"cannot load model {uri}: {type(exc).__name__}: {exc}; expected a {hint} file") from None
    meta = parse_spec(uri, extra.get(META_NAME))
    if "image" not in file_kinds(meta):  # a text artifact named in an image or video run
        raise ConfigError(f"model {uri} embeds {' or '.join(file_kinds(meta))} (its spec's kinds), not images")
    info = _apply_meta(base, meta)
    if info.image_size != image_size:
        from gpu_worker.log import logger

        logger.info(  # expected for an exported model: its spec is what it was trained and checked at
            "model spec overrides the plan's image_size",
            extra={"model_image_size": info.image_size, "plan_image_size": image_size},
        )
    return model, info
