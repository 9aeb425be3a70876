"""The worker's one door for sluice's CLI: query embeddings (`sluice search`), `sluice model export`, the CUDA check.

sluice/ imports the worker through this module alone, and only inside its commands' functions
(.ci/check_imports.py). It imports nothing heavy itself: each function imports torch and the
worker's code it needs when called, so `sluice --help` stays fast.

A query image takes the path a run's images take (gpu_worker.decode.image: shorter side to the
model's input size, centre crop; gpu_worker.models.engine.Engine: normalisation, the model, L2
normalisation), a query text the path of a text run's texts or a CLIP-style (or CLAP) text tower, and a
query audio file the path of an audio run's files (its windows' mean), so a query lands where its run put
its objects.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpu_worker.errors import ConfigError, ExportError  # the worker's errors the CLI maps to exit codes

if TYPE_CHECKING:
    import numpy as np

    from gpu_worker.export import ExportResult

__all__ = [
    "ConfigError",
    "ExportError",
    "cuda_problem",
    "embed_audio",
    "embed_images",
    "embed_text",
    "exporter",
    "fetch_model",
]


def fetch_model(uri: str, work: str) -> str:
    """The model file at `uri` and its sidecars (spec, text tower) copied into `work`: the local path."""
    from gpu_worker.models.texttower import SIDECARS
    from gpu_worker.sources.clients import control_store

    store = control_store()
    local = os.path.join(work, uri.rsplit("/", 1)[-1] or "model")
    for suffix in ("", ".json", *SIDECARS):
        try:
            data = store.get(uri + suffix)
        except Exception:
            if not suffix:
                raise
            continue
        with open(local + suffix, "wb") as fh:
            fh.write(data)
    return local


def embed_images(model_path: str, image_size: int, images: list[tuple[str, bytes]]) -> np.ndarray:
    """(len(images), D) unit vectors of (name, bytes) images with the model at `model_path` (builtin:NAME or a file)."""
    import numpy as np
    import torch

    from gpu_worker.config import MAX_IMAGE_PIXELS
    from gpu_worker.decode.image import decode_image
    from gpu_worker.errors import ObjectFailure
    from gpu_worker.models.engine import Engine
    from gpu_worker.models.load import load_model

    model, info = load_model(model_path, image_size)
    arrays = []
    for name, data in images:
        try:
            arrays.append(decode_image(data, info.preprocess, MAX_IMAGE_PIXELS))
        except ObjectFailure as exc:
            raise ConfigError(f"{name}: cannot be embedded ({exc.reason.value}: {exc.detail})") from None
    engine = Engine(model, info, "cpu", len(arrays))
    [(_, out)] = engine.submit(torch.from_numpy(np.stack(arrays)), None)
    return np.asarray(out, dtype=np.float32)


def embed_text(model_path: str, text: str) -> np.ndarray:
    """(1, D) unit vector of a query text: a text run's model embeds it as it embedded the run's texts,
    an image model with it by its text tower (CLIP-style)."""
    from gpu_worker.kinds.textmodel import embed_query, is_text_model
    from gpu_worker.models.texttower import encode_texts

    if is_text_model(model_path):  # an index of a text run: the query goes the way its texts went
        return embed_query(model_path, text)
    return encode_texts(model_path, [text])


def embed_audio(model_path: str, name: str, data: bytes) -> np.ndarray:
    """(1, D) unit vector of a query audio file: decoded and windowed as an audio run does, its windows averaged."""
    from gpu_worker.kinds.audiomodel import embed_audio_query, is_audio_model

    if not is_audio_model(model_path):
        raise ConfigError(f"--audio {name}: the index's model {model_path} is not an audio model (docs/audio.md)")
    return embed_audio_query(model_path, data, name)


def exporter() -> Callable[..., ExportResult]:
    """gpu_worker.export.export; ImportError without torch and the model libraries (the `export` extra)."""
    from gpu_worker.export import export

    return export


def cuda_problem() -> str | None:
    """Why this machine's workers cannot decode on a CUDA GPU (None: they can)."""
    try:
        from gpu_worker.decode.nvjpeg import cuda_problem
    except ImportError:
        return "torch is not installed, so CUDA is not available"
    return cuda_problem()
