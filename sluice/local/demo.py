"""Deterministic demo images for `sluice local run --demo N` (needs Pillow: the worker extra)."""

from __future__ import annotations

import io
import random
from collections.abc import Iterator


def demo_images(n: int, seed: int = 1234) -> Iterator[tuple[str, bytes]]:
    """(key, JPEG bytes): varied sizes (48-640 px), aspect ratios, colours and shapes."""
    from PIL import Image, ImageDraw

    rnd = random.Random(seed)
    for i in range(n):
        w, h = rnd.randint(48, 640), rnd.randint(48, 640)
        base = tuple(rnd.randrange(256) for _ in range(3))
        img = Image.new("RGB", (w, h), base)  # type: ignore[arg-type]
        draw = ImageDraw.Draw(img)
        for _ in range(rnd.randint(2, 8)):
            x0, y0 = rnd.randrange(w), rnd.randrange(h)
            x1, y1 = min(w, x0 + rnd.randint(4, w)), min(h, y0 + rnd.randint(4, h))
            colour = tuple(rnd.randrange(256) for _ in range(3))
            (draw.ellipse if rnd.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)  # type: ignore[arg-type]
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=rnd.randint(60, 95))
        yield f"demo/{i // 100:03d}/img-{i:05d}.jpg", buf.getvalue()
