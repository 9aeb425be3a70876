"""Query embeddings for `sluice search`: image files through the worker's own decode and model step.

The same path a run's images take (gpu_worker.decode.image: shorter side to the model's input size,
centre crop; gpu_worker.models.engine.Engine: normalisation, the model, L2 normalisation), so an
image embedded here lands where its run put it.
"""

from __future__ import annotations

import numpy as np

from gpu_worker.config import MAX_IMAGE_PIXELS
from gpu_worker.decode.image import decode_image
from gpu_worker.errors import ConfigError, ObjectFailure


def embed_images(model_path: str, image_size: int, images: list[tuple[str, bytes]]) -> np.ndarray:
    """(len(images), D) unit vectors of (name, bytes) images with the model at `model_path` (builtin:NAME or a file)."""
    import torch

    from gpu_worker.models.engine import Engine
    from gpu_worker.models.load import load_model

    model, info = load_model(model_path, image_size)
    arrays = []
    for name, data in images:
        try:
            arrays.append(decode_image(data, info.image_size, MAX_IMAGE_PIXELS))
        except ObjectFailure as exc:
            raise ConfigError(f"{name}: cannot be embedded ({exc.reason.value}: {exc.detail})") from None
    engine = Engine(model, info, "cpu", len(arrays))
    [(_, out)] = engine.submit(torch.from_numpy(np.stack(arrays)), None)
    return np.asarray(out, dtype=np.float32)
