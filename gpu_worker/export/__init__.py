"""`sluice model export`: a model from torchvision, timm, open_clip or Hugging Face -> a Sluice artifact.

    torchvision:NAME          e.g. torchvision:resnet50 (the DEFAULT weights)
    timm:NAME                 e.g. timm:vit_small_patch16_224
    open_clip:MODEL/TAG       e.g. open_clip:ViT-B-32/laion2b_s34b_b79k (the image tower, and the text
                              tower and tokenizer beside it: gpu_worker.models.texttower)
    hf:REPO                   e.g. hf:openai/clip-vit-base-patch32, hf:google/siglip-base-patch16-224; a text
                              encoder (sentence-transformers, BERT-like) becomes a text artifact for text
                              runs, its tokenizer inside (gpu_worker.export.textrun); an audio model (CLAP,
                              wav2vec2, HuBERT, Whisper) an audio artifact for audio runs (gpu_worker.export.audio)

The artifact is a TorchScript (`torch.jit.save`) or torch.export (`*.pt2`) file plus its spec
(`<file>.json`, also embedded): input size, mean/std, output dim, name, version, weights
hash (docs/models.md). Pretrained weights are fetched here, the way each library fetches
them, on a machine with internet, or read from a local state dict (`--weights FILE`:
gpu_worker.export.weights); the worker only ever loads the file. The spec also records the
library's eval image pipeline (gpu_worker.export.pipelines): pixels as stored, or turned upright
by their EXIF tag with `orientation="exif"`. Before the file is written, it is loaded the way
the worker loads it and compared with the eager model.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, replace
from typing import Any, TypedDict, Unpack

from gpu_worker.decode.preprocess import ORIENTATIONS
from gpu_worker.errors import ExportError
from gpu_worker.export.sources import Source

__all__ = ["ExportError", "ExportResult", "export", "load_source"]

PREFIXES = ("torchvision", "timm", "open_clip", "hf")


@dataclass(frozen=True)
class ExportResult:
    uri: str  # where the model file went (its spec is uri + ".json")
    spec: dict[str, Any]
    max_abs_diff: float
    max_abs_diff_normalized: float
    text: Any = None  # gpu_worker.models.texttower.TextSpec when the text tower was written beside it (CLIP-style)


class SourceArgs(TypedDict, total=False):
    """How `export` builds the encoder: load_source's keywords."""

    pretrained: bool
    image_size: int | None
    weights: str | None
    orientation: str | None


def load_source(
    spec: str,
    *,
    pretrained: bool = True,
    image_size: int | None = None,
    weights: str | None = None,
    orientation: str | None = None,
) -> Source:
    """The eager encoder a spec names (LIBRARY:NAME), with its preprocessing; `weights`: a local state dict
    loaded into the architecture built with random weights (gpu_worker.export.weights); `orientation`: the
    pipeline's (None: the library's own, the pixels as stored)."""
    lib, sep, name = spec.partition(":")
    if not sep or not name or lib not in PREFIXES:
        raise ExportError(f"model spec {spec!r}: expected one of {', '.join(p + ':NAME' for p in PREFIXES)}")
    _check_orientation(orientation)
    from gpu_worker.export import hf, sources

    loaders = {
        "torchvision": sources.load_torchvision,
        "timm": sources.load_timm,
        "open_clip": sources.load_open_clip,
        "hf": hf.load_hf,
    }
    if weights is None:
        return _oriented(loaders[lib](name, pretrained, image_size), orientation, spec)
    if lib == "hf":
        raise ExportError(f"{spec}: hf: takes a local folder already (its config.json and weights): no --weights")
    from gpu_worker.export.weights import load_weights, read_weights

    state = read_weights(weights)  # a file that cannot be read is refused before the model is built
    return _oriented(load_weights(loaders[lib](name, False, image_size), state), orientation, spec)


def _check_orientation(orientation: str | None) -> None:
    if orientation is not None and orientation not in ORIENTATIONS:
        raise ExportError(f"--orientation {orientation}: expected one of {', '.join(ORIENTATIONS)}")


def _oriented(src: Source, orientation: str | None, spec: str) -> Source:
    """`src` with its pipeline's orientation set; refused where the export records no pipeline."""
    if orientation is None:
        return src
    if src.preprocess is None:
        raise ExportError(
            f"{spec}: --orientation sets the orientation of the library's image pipeline, and this export "
            "records none (a Hugging Face folder without an image processor): its images are preprocessed "
            "the legacy way, which always turns them upright by their EXIF tag; leave --orientation out"
        )
    return replace(src, preprocess=replace(src.preprocess, orientation=orientation))


def _target(spec: str, out: str, fmt: str | None) -> tuple[str, str]:
    """(file URI, format). The worker tells the formats apart by the name: *.pt2 is torch.export."""
    if out.endswith("/"):
        fmt = fmt or "torchscript"
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", spec).strip("-")
        return out + stem + (".pt2" if fmt == "pt2" else ".pt"), fmt
    is_pt2 = out.endswith(".pt2")
    fmt = fmt or ("pt2" if is_pt2 else "torchscript")
    if (fmt == "pt2") != is_pt2:
        raise ExportError(
            f"--out {out}: the worker loads *.pt2 files as torch.export programs and any other name as "
            f"TorchScript, so a {fmt} file must {'' if fmt == 'pt2' else 'not '}end in .pt2"
        )
    return out, fmt


def export(spec: str, out: str, *, fmt: str | None = None, **source: Unpack[SourceArgs]) -> ExportResult:
    """Export `spec` to `out` (a path, an s3:// URI, or either ending in / for a folder); `source`: how the
    encoder is built (load_source's keywords: pretrained, image_size, weights, orientation)."""
    from gpu_worker.export.artifact import FORMATS
    from gpu_worker.log import quiet_libraries

    quiet_libraries()
    if fmt is not None and fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: expected one of {', '.join(FORMATS)}")
    uri, fmt = _target(spec, out, fmt)
    _check_orientation(source.get("orientation"))
    from gpu_worker.export.audio import audio_source

    audio_model = None if source.get("weights") else audio_source(spec, source.get("pretrained", True))
    if audio_model is not None:
        return _export_audio(audio_model, uri, fmt, source)
    from gpu_worker.export.textrun import text_source

    text_model = None if source.get("weights") else text_source(spec, source.get("pretrained", True))
    if text_model is not None:
        if source.get("orientation") is not None:
            raise ExportError(f"{spec} is a text encoder: --orientation is for image models")
        return _export_text(text_model, uri, fmt)
    src = load_source(spec, **source)
    if not uri.startswith("s3://"):
        meta, result, text = _write(src, fmt, uri)
    else:
        from gpu_worker.models.texttower import SIDECARS
        from gpu_worker.sources.clients import control_store

        with tempfile.TemporaryDirectory(prefix="sluice-export-") as tmp:
            local = os.path.join(tmp, uri.rsplit("/", 1)[-1])
            meta, result, text = _write(src, fmt, local)
            store = control_store()
            for suffix in ("", ".json", *(SIDECARS if text else ())):
                with open(local + suffix, "rb") as fh:
                    kind = "application/json" if suffix.endswith(".json") else "application/octet-stream"
                    store.put(uri + suffix, fh.read(), content_type=kind)
    return ExportResult(uri, meta, result.max_abs_diff, result.max_abs_diff_normalized, text)


def _export_text(src: Any, uri: str, fmt: str) -> ExportResult:
    """A text encoder -> a text artifact at `uri` (TorchScript only: its extra files hold the tokenizer)."""
    from gpu_worker.export.textrun import write_text_model

    if fmt != "torchscript":
        raise ExportError(f"{src.name} is a text encoder: text artifacts are TorchScript files (not *.pt2)")
    if not uri.startswith("s3://"):
        meta, diff = write_text_model(src, uri)
        return ExportResult(uri, meta, diff, diff)
    from gpu_worker.sources.clients import control_store

    with tempfile.TemporaryDirectory(prefix="sluice-export-") as tmp:
        local = os.path.join(tmp, uri.rsplit("/", 1)[-1])
        meta, diff = write_text_model(src, local)
        for suffix in ("", ".json"):
            with open(local + suffix, "rb") as fh:
                kind = "application/json" if suffix else "application/octet-stream"
                control_store().put(uri + suffix, fh.read(), content_type=kind)
    return ExportResult(uri, meta, diff, diff)


def _export_audio(src: Any, uri: str, fmt: str, source: SourceArgs) -> ExportResult:
    """An audio model -> an audio artifact at `uri` (+ CLAP's text tower beside it: gpu_worker.export.audio)."""
    from gpu_worker.export.audio import write_audio_model
    from gpu_worker.models.texttower import SIDECARS

    if fmt != "torchscript" or source.get("orientation") is not None or source.get("image_size"):
        raise ExportError(f"{src.name} is an audio model: TorchScript only, no --orientation or --image-size")
    if not uri.startswith("s3://"):
        meta, cosine = write_audio_model(src, uri)
        return ExportResult(uri, meta, 1.0 - cosine, 1.0 - cosine)
    from gpu_worker.sources.clients import control_store

    with tempfile.TemporaryDirectory(prefix="sluice-export-") as tmp:
        local = os.path.join(tmp, uri.rsplit("/", 1)[-1])
        meta, cosine = write_audio_model(src, local)
        for suffix in ("", ".json", *(SIDECARS if src.text is not None else ())):
            with open(local + suffix, "rb") as fh:
                kind = "application/json" if suffix.endswith(".json") else "application/octet-stream"
                control_store().put(uri + suffix, fh.read(), content_type=kind)
    return ExportResult(uri, meta, 1.0 - cosine, 1.0 - cosine)


def _write(src: Source, fmt: str, path: str) -> tuple[dict[str, Any], Any, Any]:
    """The image tower to `path` (+ its spec), and a CLIP-style model's text tower beside it."""
    from gpu_worker.export.artifact import write_local

    meta, result = write_local(src, fmt, path)
    if src.text is None:
        return meta, result, None
    from gpu_worker.export.text import open_clip_text, write_text

    text = open_clip_text(*src.text)
    return meta, result, None if text is None else write_text(text, path, meta["weights_sha256"])
