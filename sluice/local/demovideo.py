"""Demo videos for `sluice local run --demo-videos N`: small MP4s encoded with PyAV (the worker extra)."""

from __future__ import annotations

import random
import tempfile
from collections.abc import Iterator
from pathlib import Path


def demo_video(seconds: float, seed: int, size: tuple[int, int] = (96, 64), fps: int = 10) -> bytes:
    """An MPEG-4 video of `seconds`: a colour field that changes every second, a square moving across it."""
    import av
    import numpy as np

    rnd = random.Random(seed)
    w, h = size
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.mp4"
        with av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"}) as out:
            stream = out.add_stream("mpeg4", rate=fps)
            stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
            canvas = np.zeros((h, w, 3), np.uint8)
            colours = [tuple(rnd.randrange(256) for _ in range(3)) for _ in range(int(seconds) + 1)]
            for i in range(round(seconds * fps)):
                canvas[:] = colours[i // fps]
                x = (i * 3) % max(1, w - 16)
                canvas[h // 2 - 8 : h // 2 + 8, x : x + 16] = 255
                for packet in stream.encode(av.VideoFrame.from_ndarray(canvas, format="rgb24")):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        return path.read_bytes()


def demo_videos(n: int, seed: int = 1234) -> Iterator[tuple[str, bytes]]:
    """(key, MP4 bytes): n videos of 2 to 8 seconds."""
    rnd = random.Random(seed)
    for i in range(n):
        yield f"demo/{i // 100:03d}/video-{i:05d}.mp4", demo_video(rnd.uniform(2.0, 8.0), seed + i)
