"""Hugging Face vision encoders: `hf:<repo id>` (or a local folder holding its config.json).

CLIP models export their projected image embedding (CLIPVisionModelWithProjection's
`image_embeds`, the vector that is compared with text), SigLIP models the attention-pooled
`pooler_output` of SiglipVisionModel; any other vision model loads through AutoModel and
exports `pooler_output` (its first token where it has none). A repository holding a full
CLIP / SigLIP model (vision and text) is fine: only the vision tower is built.

The input side is the config's image_size (its position embeddings fix it); mean/std come
from the repository's image processor, or for a folder without one the model family's
defaults (the OpenAI CLIP mean/std for CLIP, 0.5 for SigLIP, ImageNet's otherwise).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from gpu_worker.errors import ExportError
from gpu_worker.export.pipelines import hf_preprocess
from gpu_worker.export.sources import Source, _rgb, hf_names
from gpu_worker.export.tvcompat import ensure_importable

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class HFImageTower(nn.Module):
    """pixel_values -> one (B, D) embedding taken from the model's output."""

    def __init__(self, model: nn.Module, field: str) -> None:
        super().__init__()
        self.model = model
        self.field = field

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model(pixel_values=pixel_values)
        y = getattr(out, self.field, None)
        if y is None:  # no pooler: the first (CLS) token
            y = out.last_hidden_state[:, 0]
        return y


def _family(model_type: str) -> tuple[str, str, tuple[float, ...], tuple[float, ...]]:
    """(transformers class name, output field, default mean, default std) for a config's model_type."""
    if model_type in ("clip", "clip_vision_model"):
        return "CLIPVisionModelWithProjection", "image_embeds", CLIP_MEAN, CLIP_STD
    if model_type in ("siglip", "siglip_vision_model"):
        return "SiglipVisionModel", "pooler_output", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    return "AutoModel", "pooler_output", IMAGENET_MEAN, IMAGENET_STD


def _processor(repo: str) -> Any:
    """The repository's image processor (its Pillow backend: the reference), or None when it has none."""
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(repo, backend="pil")
    except (OSError, ValueError):
        return None


def _normalization(proc: Any, mean: Any, std: Any) -> tuple[Any, Any]:
    """(mean, std) from the repository's image processor, else the family's defaults."""
    if proc is None:
        return mean, std
    return getattr(proc, "image_mean", None) or mean, getattr(proc, "image_std", None) or std


def load_hf(repo: str, pretrained: bool, image_size: int | None) -> Source:
    """`hf:REPO`: the vision tower of a Hugging Face model, pretrained or randomly initialised."""
    ensure_importable()
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(repo)
    except (OSError, ValueError) as exc:
        raise ExportError(f"hf:{repo}: cannot read its config: {exc}") from None
    cls_name, field, mean, std = _family(config.model_type)
    cls = getattr(transformers, cls_name)
    if cls_name == "AutoModel":
        model = cls.from_pretrained(repo) if pretrained else cls.from_config(config)
    else:
        vcfg = cls.config_class.from_pretrained(repo)  # the vision part of a full CLIP / SigLIP config
        if config.model_type == "clip":  # CLIPModel projects to the outer config's size: so must we
            vcfg.projection_dim = config.projection_dim
        model = cls.from_pretrained(repo, config=vcfg) if pretrained else cls(vcfg)
    native = int(getattr(model.config, "image_size", 0) or 224)
    proc = _processor(repo)
    mean, std = _normalization(proc, mean, std)
    if image_size and image_size != native:
        raise ExportError(f"hf:{repo} runs at its config's image_size {native}; --image-size {image_size} differs")
    name, version = hf_names(repo, model.config, pretrained)
    return Source(
        module=HFImageTower(model, field).eval(),
        name=name,
        version=version,
        image_size=native,  # the position embeddings fix it
        mean=_rgb(mean),
        std=_rgb(std),
        library="transformers",
        # without an image processor the folder says nothing of its pipeline: the legacy one
        preprocess=hf_preprocess(proc, native) if proc is not None else None,
    )
