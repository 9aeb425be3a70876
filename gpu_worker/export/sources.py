"""Image encoders from the libraries users already have: torchvision, timm, open_clip.

Each loader returns the encoder (classifier removed, eval mode) and the preprocessing its
weights were trained with. With `pretrained` the weights come the way the library itself
gets them (its hub or download URL: this needs the internet, and runs on the user's
machine, never in the worker); without, the same architecture is built with random
weights, through the same code, so the rest of the export path is the same. Hugging Face
models are in gpu_worker/export/hf.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from gpu_worker.decode.preprocess import Preprocess
from gpu_worker.errors import ExportError
from gpu_worker.export.pipelines import open_clip_preprocess, timm_preprocess, torchvision_preprocess
from gpu_worker.export.tvcompat import ensure_importable

RANDOM_INIT = "random-init"
# A local model folder's name says nothing by itself when it is one of these: its parent's name goes with it.
GENERIC_FOLDERS = frozenset({"model", "models", "weights", "checkpoint", "snapshot", "hf", "files"})
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "config.json")


def hf_config(spec: str) -> tuple[str, Any] | None:
    """(repo, its transformers config) for `hf:REPO`; None for another library or a folder without a config.

    None, not an error: the text and audio exports try it first, and the image export says what
    is wrong with a repository that is none of theirs.
    """
    lib, _, repo = spec.partition(":")
    if lib != "hf" or not repo:
        return None
    ensure_importable()
    import transformers

    try:
        return repo, transformers.AutoConfig.from_pretrained(repo)
    except (OSError, ValueError):
        return None


def hf_names(repo: str, config: Any, pretrained: bool) -> tuple[str, str]:
    """(name, version) a spec records for hf:REPO: a hub id as given, a local folder by its own name, never its path.

    A hub cache folder (models--ORG--NAME/snapshots/HASH) is ORG/NAME at HASH; another folder is its
    name (with its parent's when generic: pkg/model) at the SHA-256 of its weights and config.
    """
    import hashlib
    import os
    from pathlib import Path

    version = (getattr(config, "_commit_hash", None) or "") if pretrained else RANDOM_INIT
    if not os.path.isdir(repo):
        return f"hf:{repo}", version or repo
    parts = Path(repo).resolve().parts
    cached = next((p for p in parts if p.startswith("models--")), None)
    if cached is not None:
        snapshot = parts[-1] if len(parts) > 1 and parts[-2] == "snapshots" else ""
        return "hf:" + cached.removeprefix("models--").replace("--", "/"), version or snapshot
    name = "/".join(parts[-2:]) if parts[-1].lower() in GENERIC_FOLDERS and len(parts) > 1 else parts[-1]
    if version:
        return f"hf:{name}", version
    digest = hashlib.sha256()
    for f in WEIGHT_FILES:
        path = os.path.join(repo, f)
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
    return f"hf:{name}", "sha256:" + digest.hexdigest()[:16]


@dataclass(frozen=True)
class Source:
    """An encoder ready to export, and what the worker must know to feed it."""

    module: nn.Module
    name: str  # the spec it came from, e.g. timm:vit_small_patch16_224
    version: str  # the weights' tag, or random-init
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    library: str  # the package whose version the spec records
    # (whole model, spec, version) of a CLIP-style model: gpu_worker.export.text exports its text tower
    text: tuple[nn.Module, str, str] | None = None
    # the library's eval pipeline (gpu_worker.export.pipelines); None: the legacy preprocessing
    preprocess: Preprocess | None = None


def _rgb(values: Any) -> tuple[float, float, float]:
    vals = tuple(float(v) for v in values)
    if len(vals) != 3:
        raise ExportError(f"expected 3 channel values, got {vals}")
    return vals[0], vals[1], vals[2]


def _drop_classifier(model: nn.Module, name: str) -> None:
    """Replace the final Linear of torchvision's classifier head by Identity: the pooled features remain."""
    for attr in ("fc", "classifier", "heads", "head"):
        head = getattr(model, attr, None)
        if isinstance(head, nn.Linear):
            setattr(model, attr, nn.Identity())
            return
        if isinstance(head, nn.Sequential):
            for i in range(len(head) - 1, -1, -1):
                if isinstance(head[i], nn.Linear):
                    head[i] = nn.Identity()
                    return
    raise ExportError(f"torchvision:{name}: no classifier head (fc, classifier, heads, head) to remove")


def load_torchvision(name: str, pretrained: bool, image_size: int | None) -> Source:
    """`torchvision:NAME`: the model's DEFAULT weights (or random), pooled features."""
    ensure_importable()
    import torchvision

    try:
        weights = torchvision.models.get_model_weights(name).DEFAULT
    except (ValueError, KeyError):
        known = ", ".join(sorted(torchvision.models.list_models(module=torchvision.models))[:12])
        raise ExportError(f"torchvision has no classification model {name!r} (e.g. {known}, ...)") from None
    model = torchvision.models.get_model(name, weights=weights if pretrained else None)
    _drop_classifier(model, name)
    tf = weights.transforms()  # the weights' own preprocessing: crop size, mean, std
    size = image_size or int(tf.crop_size[0])
    return Source(
        module=model.eval(),
        name=f"torchvision:{name}",
        version=str(weights) if pretrained else RANDOM_INIT,
        image_size=size,
        mean=_rgb(tf.mean),
        std=_rgb(tf.std),
        library="torchvision",
        preprocess=torchvision_preprocess(weights, size),
    )


def load_timm(name: str, pretrained: bool, image_size: int | None) -> Source:
    """`timm:NAME[.TAG]`: num_classes=0 gives timm's pooled (pre-logits) features."""
    ensure_importable()
    import timm
    from timm.data import resolve_data_config
    from timm.models import get_pretrained_cfg

    if not timm.is_model(name.split(".", 1)[0]):
        raise ExportError(f"timm has no model {name!r} (timm.list_models() lists them)")
    cfg = get_pretrained_cfg(name)
    kwargs: dict[str, Any] = {}
    if image_size and cfg is not None and cfg.to_dict().get("fixed_input_size"):
        kwargs["img_size"] = image_size  # ViT-like: position embeddings are resized to the new grid
    model = timm.create_model(name, pretrained=pretrained, num_classes=0, **kwargs)
    data = resolve_data_config(model=model)
    used: dict[str, Any] = dict(getattr(model, "pretrained_cfg", None) or {})
    tag = used.get("tag") or ""
    arch = used.get("architecture") or name
    size = image_size or int(data["input_size"][-1])
    return Source(
        module=model.eval(),
        name=f"timm:{name}",
        version=(f"{arch}.{tag}" if tag else arch) if pretrained else RANDOM_INIT,
        image_size=size,
        mean=_rgb(data["mean"]),
        std=_rgb(data["std"]),
        library="timm",
        preprocess=timm_preprocess(model, size),
    )


def load_open_clip(spec: str, pretrained: bool, image_size: int | None) -> Source:
    """`open_clip:MODEL/TAG`: the image tower (model.visual), projected into the joint space."""
    ensure_importable()
    import open_clip

    name, _, tag = spec.partition("/")
    if name not in open_clip.list_models():
        raise ExportError(f"open_clip has no model {name!r} (open_clip.list_models() lists them)")
    pcfg: dict[str, Any] = open_clip.get_pretrained_cfg(name, tag) if tag else {}
    if tag and not pcfg:
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(name)) or "none"
        raise ExportError(f"open_clip {name} has no pretrained tag {tag!r} (known: {tags})")
    if pretrained and not tag:
        raise ExportError(f"open_clip:{name}: name the weights, open_clip:{name}/TAG, or pass --no-pretrained")
    model = open_clip.create_model(
        name, pretrained=tag if pretrained else None, force_image_size=image_size, load_weights=pretrained
    )
    pre = open_clip.get_model_preprocess_cfg(model)
    size = pre.get("size", image_size or 224)
    version = f"{name}/{tag}" if pretrained else RANDOM_INIT
    side = int(size[0] if isinstance(size, tuple | list) else size)
    return Source(
        module=model.visual.eval(),
        name=f"open_clip:{spec}",
        version=version,
        image_size=side,
        preprocess=open_clip_preprocess(model, side),
        mean=_rgb(pcfg.get("mean") or pre["mean"]),
        std=_rgb(pcfg.get("std") or pre["std"]),
        library="open_clip_torch",
        text=(model.eval(), spec, version),
    )
