"""Video bytes -> sampled RGB frames (PIL): keyframe seeks, duration and frame-size limits, typed failures.

Sampling (docs/video.md): `frames_per_second` targets t = 0, 1/fps, 2/fps, ... before the end;
`frames_per_video` N targets the centres of N equal slices of the duration; either way at most
`max_frames` (past it, `max_frames` spread evenly). Each target takes the first frame at or
after it (within half a frame), never the same frame twice. To reach a target the sampler seeks
to the keyframe before it and decodes forward, unless no keyframe lies between the frame it has
just decoded and the target (then decoding on is cheaper): the container's index says where the
keyframes are (MP4, AVI), else the keyframe interval seen so far stands in for it (Matroska,
MPEG-TS). So a two-hour video costs at most about one keyframe interval of decoding per
sample, not every frame. Iterating open_video keeps one decoded frame alive at a time, and the
bytes are read through a file-like object, so memory does not grow with the file.

Failures raise VideoFailure with a `reason` (VideoFailureReason); a video that breaks part way
keeps the frames before the damage, with `damaged` set and a note saying where it broke.

This module opens a video; videolimits holds the limits, frames and failures, videoprobe the
checks on the bytes before any decoding, videosampler the sample plan and the keyframe seeks.
"""

from __future__ import annotations

import av
import av.error

from gpu_worker.decode.videolimits import VideoFailure, VideoFailureReason, VideoFrames, VideoLimits
from gpu_worker.decode.videoprobe import Source, as_fileobj, close_source, looks_like_video, open_failure
from gpu_worker.decode.videosampler import VideoSampler


def sample_frames(source: Source, limits: VideoLimits | None = None) -> VideoFrames:
    """Sample a whole video, holding every sampled frame (for long or large videos iterate open_video)."""
    with open_video(source, limits) as video:
        frames = list(video)
        return VideoFrames(frames, video.duration_s, video.damaged, video.note)


def open_video(source: Source, limits: VideoLimits | None = None) -> VideoSampler:
    """Open, check the limits, and plan the samples; iterate the result to decode them one by one.

    Raises VideoFailure; so may the iteration (no_frames, bomb for a frame larger than its
    header said, too_long for a stream of unknown duration that plays past the limit).
    """
    limits = limits or VideoLimits()
    fileobj = as_fileobj(source, limits)
    like_video = looks_like_video(fileobj)
    try:
        container = av.open(fileobj, "r", metadata_errors="replace")
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        close_source(fileobj, source)
        raise open_failure(like_video, str(exc)) from None
    try:
        if not container.streams.video:
            kinds = ", ".join(sorted({s.type for s in container.streams}))
            raise open_failure(like_video and kinds in ("", "data"), f"no video stream; streams: {kinds or 'none'}")
        still = container.format.name
        if still == "image2" or still.endswith("_pipe"):  # FFmpeg reads a lone JPEG or PNG as a 1-frame "video"
            raise VideoFailure(
                VideoFailureReason.NOT_VIDEO,
                f"a still image ({still.removesuffix('_pipe')}), not a video: run it as an image (input.kind image)",
            )
        return VideoSampler(container, limits, on_close=fileobj if fileobj is not source else None)
    except BaseException:
        container.close()
        close_source(fileobj, source)
        raise
