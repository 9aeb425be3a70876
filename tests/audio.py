"""Deterministic test audio encoded with PyAV: tones whose pitch says which file and which second they are.

`tone(seconds, rate, seed)` is the signal (float32, stereo rows: the channels differ, so a downmix
shows); `make_audio(...)` encodes it into a container and codec (FORMATS: the common ones);
`make_video_with_audio(...)` is an MP4 with a video and an AAC audio track.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import av
import numpy as np

# suffix -> (container format, codec, sample format): the containers and codecs a run meets most.
FORMATS = {
    "wav": ("wav", "pcm_s16le", "s16"),
    "flac": ("flac", "flac", "s16"),
    "mp3": ("mp3", "libmp3lame", "fltp"),
    "opus": ("ogg", "libopus", "flt"),
    "m4a": ("ipod", "aac", "fltp"),
}


def tone(seconds: float, rate: int = 44_100, seed: int = 0, channels: int = 2) -> np.ndarray:
    """(channels, n) float32 in [-0.5, 0.5]: a chord that changes every second, its notes set by `seed`."""
    rng = np.random.default_rng(seed)
    n = round(seconds * rate)
    t = np.arange(n) / rate
    out = np.zeros((channels, n), np.float64)
    for second in range(int(np.ceil(seconds))):
        f = rng.uniform(150, 2500, size=3)
        at = (t >= second) & (t < second + 1)
        for c in range(channels):
            out[c, at] = sum(np.sin(2 * np.pi * fi * (c + 1) ** 0.5 * t[at]) for fi in f) / 6
    return out.astype(np.float32)


def make_audio(signal: np.ndarray, suffix: str = "wav", rate: int = 44_100) -> bytes:
    """`signal` ((channels, n) float32) encoded as FORMATS[suffix]."""
    fmt, codec, sample_fmt = FORMATS[suffix]
    if codec == "libopus" and rate not in (8_000, 12_000, 16_000, 24_000, 48_000):
        raise ValueError(f"Opus takes 8, 12, 16, 24 or 48 kHz, not {rate}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"a.{suffix}"
        with av.open(str(path), "w", format=fmt) as out:
            _encode_audio(out, signal, codec, sample_fmt, rate)
        return path.read_bytes()


def _encode_audio(
    out: av.container.OutputContainer, signal: np.ndarray, codec: str, sample_fmt: str, rate: int
) -> None:
    layout = "stereo" if signal.shape[0] == 2 else "mono"
    stream = _audio_stream(out, codec, sample_fmt, rate, layout)
    _encode_into(out, stream, signal, sample_fmt, rate)


def _audio_stream(
    out: av.container.OutputContainer, codec: str, sample_fmt: str, rate: int, layout: str
) -> av.audio.AudioStream:
    stream = out.add_stream(codec, rate=rate, layout=layout)
    stream.format = sample_fmt
    return stream


def _encode_into(
    out: av.container.OutputContainer, stream: av.audio.AudioStream, signal: np.ndarray, sample_fmt: str, rate: int
) -> None:
    layout = "stereo" if signal.shape[0] == 2 else "mono"
    frame_size = stream.codec_context.frame_size or 1024
    planar = sample_fmt.endswith("p")
    for i in range(0, signal.shape[1], frame_size):
        block = signal[:, i : i + frame_size]
        if sample_fmt.startswith("s16"):
            data = (np.clip(block, -1, 1) * 32767).astype(np.int16)
        else:
            data = block.astype(np.float32)
        arr = data if planar else data.T.reshape(1, -1).copy()
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(arr), format=sample_fmt, layout=layout)
        frame.sample_rate = rate
        frame.pts = i
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)


def make_video_with_audio(signal: np.ndarray, rate: int = 44_100, fps: int = 5) -> bytes:
    """An MP4 holding a small MPEG-4 video and `signal` as its AAC audio track."""
    seconds = signal.shape[1] / rate
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.mp4"
        with av.open(str(path), "w", format="mp4") as out:
            video = out.add_stream("mpeg4", rate=fps)
            video.width, video.height, video.pix_fmt = 32, 32, "yuv420p"
            audio = _audio_stream(out, "aac", "fltp", rate, "stereo" if signal.shape[0] == 2 else "mono")
            canvas = np.full((32, 32, 3), 80, np.uint8)
            for _ in range(round(seconds * fps)):
                for packet in video.encode(av.VideoFrame.from_ndarray(canvas, format="rgb24")):
                    out.mux(packet)
            for packet in video.encode():
                out.mux(packet)
            _encode_into(out, audio, signal, "fltp", rate)
        return path.read_bytes()
