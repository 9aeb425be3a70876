"""Decode throughput on this machine: CPU images/s per core (the worker's Pillow path) and GPU images/s (nvJPEG).

`python -m gpu_worker.autotune` prints both after its batch table; `sluice plan --decode-per-core-s N`
takes the CPU figure. Images are synthetic photo-like JPEGs of `side` x 3/4 `side` (default 500 px).
"""

from __future__ import annotations

import io
import time

import numpy as np
from PIL import Image

from gpu_worker.config import MAX_IMAGE_PIXELS
from gpu_worker.decode.image import decode_image
from gpu_worker.decode.nvjpeg import DeviceDecoder, JpegDecode, nvjpeg_problem, torchvision_jpeg
from gpu_worker.decode.preprocess import Preprocess


def sample_jpegs(n: int, side: int = 500, seed: int = 0) -> list[bytes]:
    """n photo-like JPEGs (gradients and noise, so the entropy coder has work), side x 3/4 side."""
    rng = np.random.default_rng(seed)
    h = side * 3 // 4
    out = []
    for _ in range(n):
        ramp = np.linspace(0, 1, side)[None, :, None] * rng.uniform(60, 200, 3)
        noise = rng.normal(0, 25, (h, side, 3))
        arr = (ramp + np.linspace(0, 50, h)[:, None, None] + noise).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=int(rng.integers(75, 95)))
        out.append(buf.getvalue())
    return out


def cpu_per_core(images: list[bytes], prep: Preprocess, seconds: float) -> float:
    """Images/s one thread decodes and preprocesses by `prep` through decode_image."""
    done, t0 = 0, time.perf_counter()
    while done < len(images) or time.perf_counter() - t0 < seconds:
        decode_image(images[done % len(images)], prep, MAX_IMAGE_PIXELS)
        done += 1
    return done / (time.perf_counter() - t0)


def device_rate(
    images: list[bytes], prep: Preprocess, device: str, seconds: float, jpeg: JpegDecode = torchvision_jpeg
) -> float:
    """Images/s DeviceDecoder turns into (size, size, 3) host arrays, in batches of len(images)."""
    dec = DeviceDecoder(device, prep, MAX_IMAGE_PIXELS, jpeg)
    dec.decode_batch(images)  # warm-up: decoder handles, kernels
    done, t0 = 0, time.perf_counter()
    while done < 2 * len(images) or time.perf_counter() - t0 < seconds:
        dec.decode_batch(images)
        done += len(images)
    return done / (time.perf_counter() - t0)


def decode_report(prep: Preprocess, device: str, seconds: float, batch: int = 128) -> list[str]:
    """Lines for autotune: CPU decode per core, and GPU decode where CUDA and nvJPEG run, by the model's `prep`."""
    images = sample_jpegs(min(batch, 64) if not device.startswith("cuda") else batch)
    size = prep.size
    per_core = cpu_per_core(images, prep, seconds)
    lines = [
        f"CPU decode: {per_core:,.0f} images/s per core at {size} px (sluice plan --decode-per-core-s {per_core:.0f})"
    ]
    if not device.startswith("cuda"):
        return [*lines, "GPU decode: not measured (no CUDA device)"]
    why = nvjpeg_problem(device)
    if why:
        return [*lines, f"GPU decode: not measured ({why})"]
    rate = device_rate(images, prep, device, seconds)
    return [*lines, f"GPU decode: {rate:,.0f} images/s (nvJPEG, batches of {len(images)}, to {size} px on the device)"]
