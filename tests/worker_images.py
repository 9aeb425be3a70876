"""Deterministic test images: varied JPEGs, and every kind of bad object the worker must survive.

`make_demo_images(n, seed)` is also what a `--demo N` generator can upload.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image


def _picture(rng: random.Random, w: int, h: int) -> np.ndarray:
    """A gradient with a few rectangles and a little noise: cheap, varied, JPEG-friendly."""
    nrng = np.random.default_rng(rng.randrange(2**32))
    c0, c1 = nrng.integers(0, 256, 3), nrng.integers(0, 256, 3)
    t = np.linspace(0.0, 1.0, w)[None, :, None] if rng.random() < 0.5 else np.linspace(0.0, 1.0, h)[:, None, None]
    img = (c0 * (1 - t) + c1 * t) * np.ones((h, w, 1))
    for _ in range(rng.randint(1, 4)):
        x0, y0 = rng.randrange(w), rng.randrange(h)
        x1, y1 = min(w, x0 + rng.randint(4, max(5, w // 2))), min(h, y0 + rng.randint(4, max(5, h // 2)))
        img[y0:y1, x0:x1] = nrng.integers(0, 256, 3)
    img += nrng.normal(0.0, 6.0, img.shape)
    return img.clip(0, 255).astype(np.uint8)


def jpeg(arr: np.ndarray, quality: int = 85, **save: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, **save)
    return buf.getvalue()


def make_demo_images(n: int, seed: int = 0, min_side: int = 32, max_side: int = 96) -> list[tuple[str, bytes]]:
    """n JPEGs named img-00000.jpg..., sides in [min_side, max_side], varied colours and aspect ratios."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        w, h = rng.randint(min_side, max_side), rng.randint(min_side, max_side)
        out.append((f"img-{i:05d}.jpg", jpeg(_picture(rng, w, h), quality=rng.randint(70, 95))))
    return out


def png_image(seed: int = 1, size: tuple[int, int] = (70, 50), mode: str = "RGBA") -> bytes:
    rng = random.Random(seed)
    im = Image.fromarray(_picture(rng, *size)).convert(mode)
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def cmyk_jpeg(seed: int = 2, size: tuple[int, int] = (60, 80)) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_picture(random.Random(seed), *size)).convert("CMYK").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def exif_rotated_jpeg(orientation: int = 6, size: tuple[int, int] = (80, 40)) -> bytes:
    """Left half red, right half blue, stored with an EXIF Orientation tag."""
    w, h = size
    arr = np.zeros((h, w, 3), np.uint8)
    arr[:, : w // 2] = (255, 0, 0)
    arr[:, w // 2 :] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = orientation
    return jpeg(arr, quality=95, exif=exif.tobytes())


def bomb_png(side: int = 12_000) -> bytes:
    """A real decompression bomb: side x side 1-bit pixels (144 MP by default) in ~20 KB of PNG."""
    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def corrupt_images(seed: int = 3) -> list[tuple[str, bytes]]:
    """Five objects that look like images (right magic bytes) and do not decode."""
    rng = random.Random(seed)
    good = jpeg(_picture(rng, 90, 70))
    png = png_image(seed, (90, 70), "RGB")
    noise = bytes(rng.randrange(256) for _ in range(2000))
    return [
        ("corrupt-truncated-half.jpg", good[: len(good) // 2]),
        ("corrupt-truncated-header.jpg", good[:200]),
        ("corrupt-garbage-after-soi.jpg", b"\xff\xd8\xff" + noise),
        ("corrupt-truncated.png", png[: len(png) // 2]),
        ("corrupt-png-header-only.png", png[:40]),
    ]


def bad_and_special_objects() -> dict[str, tuple[bytes | None, str | None]]:
    """name -> (bytes or None for 'never uploaded', expected failure reason or None if readable)."""
    objs: dict[str, tuple[bytes | None, str | None]] = {name: (data, "corrupt") for name, data in corrupt_images()}
    objs["missing-1.jpg"] = (None, "missing")
    objs["missing-2.jpg"] = (None, "missing")
    objs["bomb.png"] = (bomb_png(), "bomb")
    objs["not-an-image.jpg"] = (b"this is a text file, not a picture\n" * 3, "not_image")
    objs["rgba.png"] = (png_image(), None)
    objs["cmyk.jpg"] = (cmyk_jpeg(), None)
    objs["exif-rotated.jpg"] = (exif_rotated_jpeg(), None)
    return objs


def pillow_standin_jpeg(datas: Sequence[bytes], device: str) -> list[Any]:
    """A stand-in for nvJPEG built on Pillow (full-size decode, no draft): tests the device path
    where torchvision's decoder cannot load. Raises on bytes it cannot decode, as nvJPEG does."""
    import torch

    out = []
    for d in datas:
        with Image.open(io.BytesIO(d)) as im:
            im.load()
            rgb = np.asarray(im.convert("RGB"))
        out.append(torch.from_numpy(rgb.copy()).permute(2, 0, 1).to(device))
    return out


def decode_on_threads(decode: Any, datas: Sequence[bytes], timeout_s: float) -> dict[int, Any]:
    """{i: decode(datas[i]) or the ObjectFailure it raised}, every call on its own thread at once."""
    import threading

    from gpu_worker.errors import ObjectFailure

    results: dict[int, Any] = {}

    def one(i: int) -> None:
        try:
            results[i] = decode(datas[i])
        except ObjectFailure as f:
            results[i] = f

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(datas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    return results
