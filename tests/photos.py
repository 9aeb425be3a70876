"""Real photographs for the preprocessing tests: scikit-image's and scikit-learn's sample photos.

Synthetic noise does not exercise resizing as photographs do (edges, textures, smooth skies),
and only a trained network's embedding moves when the pixels do. The photographs ship in the
two packages' wheels (no download): a cat, coffee, a rocket, a motorcycle, an astronaut, a
retina, a Chinese temple, a flower, a camera man (greyscale). `photos()` gives them as files a
user would have: JPEG and PNG, from 200 px to 3000 px, landscape and portrait (photographs
scaled with Lanczos and cropped, then encoded), each name saying what it is.
"""

from __future__ import annotations

import functools
import io
import os

from PIL import Image

SKIMAGE = ("chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "astronaut.png", "retina.jpg")
SKLEARN = ("china.jpg", "flower.jpg")
# (source, long side in px, portrait?, format): every size class and both orientations.
VARIANTS = (
    ("chelsea.png", 0, False, "PNG"),
    ("coffee.png", 0, False, "JPEG"),
    ("rocket.jpg", 0, True, "JPEG"),
    ("china.jpg", 3000, False, "JPEG"),
    ("flower.jpg", 2400, True, "JPEG"),
    ("motorcycle_left.png", 1600, False, "PNG"),
    ("astronaut.png", 200, False, "JPEG"),
    ("retina.jpg", 1000, True, "JPEG"),
    ("coffee.png", 257, True, "PNG"),
    ("chelsea.png", 1200, True, "JPEG"),
    ("camera.png", 700, False, "JPEG"),
    ("rocket.jpg", 2000, False, "JPEG"),
)


def source(name: str) -> Image.Image:
    """One of the packages' photographs, as stored."""
    import skimage
    import sklearn.datasets

    pkg = skimage if name in (*SKIMAGE, "camera.png") else sklearn.datasets
    folder = os.path.join(os.path.dirname(pkg.__file__), "data" if pkg is skimage else "images")
    with Image.open(os.path.join(folder, name)) as im:
        im.load()
        return im


def variant(name: str, long_side: int, portrait: bool, fmt: str) -> bytes:
    """One photograph as a file: portrait (the central 2:3 strip) or not, long side `long_side` (0: as stored)."""
    im = source(name)
    w, h = im.size
    if portrait and w > h:  # a portrait crop of a landscape photo: the central 2:3 strip
        cw = h * 2 // 3
        im = im.crop(((w - cw) // 2, 0, (w - cw) // 2 + cw, h))
    if long_side:
        w, h = im.size
        scale = long_side / max(w, h)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS)
    buf = io.BytesIO()
    im.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


@functools.cache
def photos() -> dict[str, bytes]:
    """{file name: bytes}: the photographs above, e.g. china-3000-landscape.jpg."""
    out = {}
    for name, long_side, portrait, fmt in VARIANTS:
        stem = name.rsplit(".", 1)[0].replace("_", "-")
        ext = "jpg" if fmt == "JPEG" else "png"
        label = f"{stem}-{long_side or 'orig'}-{'portrait' if portrait else 'landscape'}.{ext}"
        out[label] = variant(name, long_side, portrait, fmt)
    return out
