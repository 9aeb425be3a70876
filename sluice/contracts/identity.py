"""A model's identity without I/O: its artifact's static id and the preprocessing that changes its vectors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.contracts.sections import ContentSpec, ModelSpec

if TYPE_CHECKING:
    pass


# Bump when a builtin network's construction or seed changes: its earlier embeddings are then stale.
BUILTIN_WEIGHTS = "1"


def static_id(uri: str) -> str:
    """The identity that needs no I/O: exact for builtins, a placeholder naming the uri otherwise."""
    if uri.startswith("builtin:"):
        return f"{uri}@{BUILTIN_WEIGHTS}"
    return f"uri:{uri}"


def artifact(model_id: str) -> str:
    """The artifact part of a model_id (what `resolve` returns), its preprocessing left off."""
    return model_id.split(";", 1)[0]


def preprocessing(kind: str, image_size: int, content: ContentSpec) -> str:
    """The `;name=value` suffix of the preprocessing that changes a model's vectors for input `kind`."""
    if kind == "text":
        return f";chunk_tokens={or_default(content.chunk_tokens)};overlap_tokens={or_default(content.overlap_tokens)}"
    if kind == "audio":
        return f";window_s={or_default(content.window_s)};hop_s={or_default(content.hop_s)}"
    suffix = f";image_size={image_size}"
    if kind == "video":
        if content.frames_per_video is not None:
            return suffix + f";frames_per_video={content.frames_per_video}"
        return suffix + f";frames_per_second={or_default(content.frames_per_second)}"
    return suffix


def static_identity(spec: ModelSpec, content: ContentSpec) -> str:
    """`identity` without I/O (plans made without the coordinator): the static artifact id, the manifest's sizes."""
    return static_id(spec.uri) + preprocessing(content.kind, spec.image_size, content)


def or_default(value: float | None) -> str:
    return "default" if value is None else f"{value:g}"
