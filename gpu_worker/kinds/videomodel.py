"""A video run's model: an image model (gpu_worker.models.load) on sampled frames, one row a frame (docs/kinds.md).

Frames come from gpu_worker.decode.video (PyAV, keyframe seeks, its limits), one decoded frame alive
at a time; each goes through the image path's preprocessing (shorter side to the model's
input size, centre crop) and the image Engine (normalisation, autocast, L2). A frame's row
has part = its sample index, part_start = its timestamp, part_end = the next sample's (the
duration for the last). A video that breaks part way keeps the frames before the damage
(Part.note says where it broke: logged and counted by gpu_worker.passes.parts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from gpu_worker.decode.preprocess import Preprocess, resize_crop
from gpu_worker.decode.video import open_video
from gpu_worker.decode.videolimits import VideoFailure, VideoLimits
from gpu_worker.errors import ObjectFailure
from gpu_worker.kinds.base import Loading, Part, PartsInfo
from gpu_worker.models.engine import Engine, EngineOptions
from gpu_worker.models.load import load_model
from sluice.contracts.status import FailureReason


def frame_array(image: Image.Image, prep: Preprocess) -> np.ndarray:
    """One frame as the image path preprocesses an image (the model's pipeline, or the legacy one), uint8 HWC."""
    return np.asarray(resize_crop(image.convert("RGB"), prep))


class VideoEmbedder:
    """Samples a video's frames (split) and embeds them with an image model in fixed batches (embed)."""

    def __init__(self, engine: Engine, limits: VideoLimits, name: str) -> None:
        self.engine = engine
        self.limits = limits
        self.info = PartsInfo(name, engine.info.version)
        self.output_dim = engine.output_dim
        self.sort_batches = 1  # frames are one size: nothing to sort
        self._size = engine.input_size
        self._prep = engine.info.preprocess  # the model's pipeline, or the legacy one at its input side

    def split(self, data: bytes) -> list[Part]:
        try:
            with open_video(data, self.limits) as video:
                arrays = [(f.part, f.timestamp_s, frame_array(f.image, self._prep)) for f in video]
                duration, note = video.duration_s, video.note if video.damaged else ""
        except VideoFailure as f:
            raise ObjectFailure(FailureReason(f.reason.value), f.detail) from None
        ends = [t for _, t, _ in arrays[1:]] + [max(duration, arrays[-1][1] if arrays else 0.0)]
        parts = [Part(i, t, end, a) for (i, t, a), end in zip(arrays, ends)]
        if parts and note:
            parts[0] = Part(parts[0].part, parts[0].start, parts[0].end, parts[0].payload, note)
        if not parts:
            raise ObjectFailure(FailureReason.NO_FRAMES, note or "no sampled frame decoded")
        return parts

    def embed(self, payloads: Sequence[Any]) -> np.ndarray:
        b, size = self.engine.batch_size, self._size
        out = []
        for i in range(0, len(payloads), b):
            chunk = payloads[i : i + b]
            host = np.zeros((b, size, size, 3), np.uint8)
            host[: len(chunk)] = np.stack(chunk)
            got = self.engine.submit(torch.from_numpy(host), len(chunk)) + self.engine.drain()
            out += [emb[:n] for n, emb in got]
        return np.concatenate(out).astype(np.float32, copy=False)


def load_video(how: Loading) -> VideoEmbedder:
    """The image model of `how.planned` on its device, sampling as the run's content says."""
    model, info = load_model(how.path, how.planned.image_size)
    options = EngineOptions(autocast=how.cfg.autocast, jit=how.cfg.jit, input_size=info.image_size)
    engine = Engine(model, info, how.device, how.batch, options)
    content = how.content
    limits = VideoLimits(
        frames_per_second=content.frames_per_second or VideoLimits.frames_per_second,
        frames_per_video=content.frames_per_video,
        max_frame_pixels=how.cfg.max_image_pixels,
        max_bytes=how.cfg.max_object_bytes,
    )
    return VideoEmbedder(engine, limits, how.planned.name)
