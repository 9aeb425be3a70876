"""Benchmark video frame sampling: keyframe seeks (gpu_worker/decode/videosampler.py) vs decoding every frame.

    .venv/bin/python bench/video.py                                  # 120 s of 640x360 at 25 fps
    .venv/bin/python bench/video.py --seconds 600 --size 1280x720 --gops 2 10

Encodes synthetic H.264 MP4s once under --workdir (a textured scene that pans, so every
P-frame carries data; keyframes every GOP seconds, no extra ones at cuts, B-frames on: what
an x264 default encode looks like), then samples each with every mode in --modes. Ours:
sample_frames. Baseline: decode every frame in order and keep the first frame at or after each
target (the same targets, so both return the same frames: the bench checks it). Both decode in
one thread, one after the other, best of --repeat, timed in CPU seconds of the process (one
core's work, less moved by other load on a shared machine than wall time). Printed per video
and mode: sampled frames, frames decoded, CPU seconds, sampled frames/s per core, decode CPU
seconds per minute of video, and baseline / ours.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import av
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_worker.decode.video import open_video
from gpu_worker.decode.videolimits import VideoLimits
from gpu_worker.decode.videosampler import plan_targets


def encode(path: Path, seconds: int, size: tuple[int, int], fps: int, gop_s: int) -> None:
    """A panning, textured H.264 MP4 with a keyframe every gop_s seconds."""
    w, h = size
    rng = np.random.default_rng(7)
    texture = rng.integers(0, 256, (h, w * 2, 3), dtype=np.uint8)
    texture = (texture // 64 * 64).astype(np.uint8)  # blocky: compressible, still costly to decode
    with av.open(str(path), "w", format="mp4", options={"movflags": "+faststart"}) as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.codec_context.gop_size = gop_s * fps
        stream.codec_context.options = {"sc_threshold": "0", "preset": "veryfast", "crf": "28"}
        for i in range(seconds * fps):
            x = (i * 3) % w
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(texture[:, x : x + w]), format="rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def ours(path: Path, limits: VideoLimits) -> tuple[list[float], int]:
    """Sampled timestamps and frames decoded by gpu_worker.decode.video."""
    with open_video(path, limits) as video:
        stamps = [f.timestamp_s for f in video]
        return stamps, video.frames_decoded


def baseline(path: Path, limits: VideoLimits) -> tuple[list[float], int]:
    """Decode every frame; keep (as RGB) the first at or after each target, within half a frame."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        duration = float(stream.duration * stream.time_base) if stream.duration else 0.0
        half = 0.5 / float(stream.average_rate or 25)
        targets = plan_targets(duration, limits)
        stamps: list[float] = []
        decoded, i = 0, 0
        for frame in container.decode(stream):
            decoded += 1
            t = float(frame.time or 0.0)
            if i < len(targets) and t >= targets[i] - half:
                frame.to_image()
                stamps.append(t)
                i += 1  # this target, and every later one the frame already covers
                while i < len(targets) and targets[i] <= t:
                    i += 1
        return stamps, decoded


def best(fn: object, path: Path, limits: VideoLimits, repeat: int) -> tuple[float, list[float], int]:
    """Fastest of `repeat` runs in CPU seconds of this process: (seconds, timestamps, frames decoded)."""
    times, out = [], ([], 0)
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn(path, limits)  # type: ignore[operator]
        times.append(time.process_time() - t0)
    return min(times), out[0], out[1]


def parse_mode(text: str) -> tuple[str, VideoLimits]:
    """'fps=1' or 'per_video=16' -> its label and limits."""
    name, _, value = text.partition("=")
    if name == "fps":
        return text, VideoLimits(frames_per_second=float(value), max_frames=10**6)
    if name == "per_video":
        return text, VideoLimits(frames_per_video=int(value))
    raise SystemExit(f"--modes: {text!r} is neither fps=<float> nor per_video=<int>")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=int, default=120)
    p.add_argument("--size", default="640x360")
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--gops", type=int, nargs="+", default=[2, 10], help="keyframe intervals, seconds")
    p.add_argument("--modes", nargs="+", default=["fps=1", "fps=0.2", "per_video=16"])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/sluice-bench-video"))
    a = p.parse_args()
    w, h = (int(x) for x in a.size.split("x"))
    a.workdir.mkdir(parents=True, exist_ok=True)
    print(f"video: {a.seconds} s, {w}x{h}, {a.fps} fps, H.264 (x264 veryfast, crf 28); one decode thread")
    head = "| GOP s | mode | samples | decoded ours / base | ours CPU s | base CPU s | ours frames/s per core "
    head += "| ours s per min of video | base s per min | base / ours |"
    print(head + "\n|" + "---|" * 10)
    for gop in a.gops:
        path = a.workdir / f"v{a.seconds}s_{w}x{h}_{a.fps}fps_gop{gop}.mp4"
        if not path.exists():
            encode(path, a.seconds, (w, h), a.fps, gop)
        for label, limits in map(parse_mode, a.modes):
            t_ours, s_ours, d_ours = best(ours, path, limits, a.repeat)
            t_base, s_base, d_base = best(baseline, path, limits, a.repeat)
            same = len(s_ours) == len(s_base) and all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(s_ours, s_base))
            if not same:
                raise SystemExit(f"{label} gop {gop}: ours and the baseline sampled different frames")
            minutes = a.seconds / 60
            print(
                f"| {gop} | {label} | {len(s_ours)} | {d_ours} / {d_base} | {t_ours:.2f} | {t_base:.2f} "
                f"| {len(s_ours) / t_ours:.1f} | {t_ours / minutes:.2f} | {t_base / minutes:.2f} "
                f"| {t_base / t_ours:.1f} |"
            )


if __name__ == "__main__":
    main()
