"""Deterministic demo objects for `sluice local run`: --demo N images (Pillow), --demo-texts N, --demo-videos N."""

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


_WORDS = [
    "sluice",
    "river",
    "gate",
    "water",
    "flow",
    "basin",
    "channel",
    "lock",
    "weir",
    "bank",
    "stream",
    "current",
    "tide",
    "harbour",
    "canal",
    "bridge",
    "embedding",
    "vector",
    "model",
    "batch",
    "shard",
    "worker",
    "queue",
    "manifest",
    "index",
    "search",
    "query",
    "chunk",
    "token",
    "window",
    "overlap",
    "the",
    "a",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "it",
    "this",
    "be",
    "are",
    "was",
    "or",
    "an",
]


def demo_texts(n: int, seed: int = 1234) -> Iterator[tuple[str, bytes]]:
    """(key, UTF-8 text): short notes and, every tenth, a long report of several thousand words."""
    rnd = random.Random(seed)
    for i in range(n):
        words = rnd.randint(3_000, 6_000) if i % 10 == 9 else rnd.randint(20, 200)
        sentences, left = [], words
        while left > 0:
            k = min(left, rnd.randint(5, 18))
            sentences.append(" ".join(rnd.choice(_WORDS) for _ in range(k)).capitalize() + ".")
            left -= k
        suffix = "md" if i % 4 == 3 else "txt"
        yield f"demo/{i // 100:03d}/text-{i:05d}.{suffix}", (" ".join(sentences) + "\n").encode()


def demo_objects(kind: str, n: int) -> Iterator[tuple[str, bytes]]:
    """The demo objects of a kind: --demo (images), --demo-texts."""
    if kind == "text":
        return demo_texts(n)
    if kind == "video":
        from sluice.local.demovideo import demo_videos

        return demo_videos(n)
    return demo_images(n)
