"""Deterministic test videos encoded with PyAV: one flat colour per second, so a sampled frame says its second.

`make_video(...)` returns the bytes of an MP4 (moov first, so a truncated copy still opens) or
of another container (`container="h264"`: a raw stream that states no duration);
`colour_of(second)` is the colour every frame of that second is painted.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import av
import numpy as np


def colour_of(second: int) -> tuple[int, int, int]:
    """The RGB colour of every frame in `second` (far apart for neighbouring seconds)."""
    return ((second * 97 + 40) % 256, (second * 61 + 200) % 256, (second * 151 + 90) % 256)


def make_video(
    seconds: float,
    fps: int = 10,
    size: tuple[int, int] = (64, 48),
    codec: str = "mpeg4",
    gop: int | None = None,
    container: str = "mp4",
) -> bytes:
    """A video of `seconds` x `fps` frames of `size` (w, h); `gop` frames between keyframes (encoder's default)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"v.{container}"
        # faststart moves the mp4 index to the front (a second pass over a real file, hence not BytesIO).
        options = {"movflags": "+faststart"} if container == "mp4" else {}
        with av.open(str(path), "w", format=container, options=options) as out:
            _encode(out, round(seconds * fps), fps, size, codec, gop)
        return path.read_bytes()


def _encode(
    out: av.container.OutputContainer, frames: int, fps: int, size: tuple[int, int], codec: str, gop: int | None
) -> None:
    stream = out.add_stream(codec, rate=fps)
    stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
    if gop is not None:
        stream.codec_context.gop_size = gop
        # No extra keyframes at scene cuts: every colour change would be one.
        stream.codec_context.options = {"sc_threshold": "0" if codec == "libx264" else "1000000000"}
    canvas = np.zeros((size[1], size[0], 3), np.uint8)
    for i in range(frames):
        canvas[:] = colour_of(i // fps)
        frame = av.VideoFrame.from_ndarray(canvas, format="rgb24")
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
