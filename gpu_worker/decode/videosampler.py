"""An open video's sample plan, and the decoding walk to each sample: keyframe seeks, decoding on, damage noted."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO

import av
import av.container
import av.error
import av.video
from PIL import Image

from gpu_worker.decode.videolimits import VideoFailure, VideoFailureReason, VideoFrame, VideoLimits, check_pixels

# Seeking is worth it only past this gap, even before a keyframe interval has been seen.
_MIN_SEEK_GAP_S = 1.0
# Targets that fail to decode in a row before the rest of the video is given up as damaged.
_MAX_FAILED_TARGETS = 3


def plan_targets(duration_s: float, limits: VideoLimits) -> list[float]:
    """Sample times in seconds from the start of the video, ascending."""
    if limits.frames_per_video is None:
        n = max(1, math.ceil(duration_s * limits.frames_per_second - 1e-9))
        if n <= limits.max_frames:
            return [i / limits.frames_per_second for i in range(n)]
    n = min(limits.frames_per_video or limits.max_frames, limits.max_frames)
    return [duration_s * (i + 0.5) / n for i in range(n)]


class VideoSampler:
    """An open video and its sample plan; iterating decodes the sampled frames in order."""

    def __init__(
        self, container: av.container.InputContainer, limits: VideoLimits, on_close: IO[bytes] | None = None
    ) -> None:
        """Check the header against the limits (VideoFailure) and plan the samples; decodes nothing."""
        self.container, self.limits, self._on_close = container, limits, on_close
        self.damaged, self.note = False, ""
        self.stream = container.streams.video[0]
        if self.stream.codec_context is None:  # no decoder for the stream's codec id
            raise VideoFailure(
                VideoFailureReason.CORRUPT,
                "no decoder for its video stream: a damaged header, or a codec FFmpeg cannot decode; re-encode it",
            )
        # One decode thread: a worker decodes many videos at once, one per loader process.
        self.stream.codec_context.thread_count = 1
        check_pixels(self.stream.codec_context.width, self.stream.codec_context.height, limits)
        self.time_base = float(self.stream.time_base or 0) or 1e-6
        self.start_s = (self.stream.start_time or 0) * self.time_base
        self.duration_s = _duration(container, self.stream, self.time_base)
        if self.duration_s > limits.max_duration_s:
            raise VideoFailure(
                VideoFailureReason.TOO_LONG,
                f"{self.duration_s:.0f} s > max_duration_s {limits.max_duration_s:.0f}; raise the limit or cut it",
            )
        self.frame_period_s = 1.0 / float(self.stream.average_rate or self.stream.guessed_rate or 25)
        # A stream that states no duration (a raw elementary stream) is sampled from the start until it ends.
        self.targets: Iterable[float] = (
            plan_targets(self.duration_s, limits) if self.duration_s > 0 else _open_ended(limits)
        )
        self.frames_decoded = 0  # every frame the decoder produced, sampled or not (the cost)
        self.seeks = 0

    def __enter__(self) -> VideoSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the container (and the file this module opened)."""
        self.container.close()
        if self._on_close is not None:
            self._on_close.close()

    def __iter__(self) -> Iterator[VideoFrame]:
        walk = _Walk(self, can_seek=self.duration_s > 0)  # a raw stream without a duration cannot seek
        part = 0
        for frame in walk.frames():
            yield VideoFrame(part, frame[0], frame[1])
            part += 1
        if part == 0:
            why = f" ({self.note})" if self.note else ""
            raise VideoFailure(VideoFailureReason.NO_FRAMES, f"no frame decodes{why}; the video is damaged or empty")

    def mark_damaged(self, note: str) -> None:
        """Record damage (the first note is kept: it says where the video broke)."""
        if not self.damaged:
            self.damaged, self.note = True, note


def _open_ended(limits: VideoLimits) -> Iterator[float]:
    """Targets at frames_per_second from 0, for a video of unknown duration (at most max_frames)."""
    return (i / limits.frames_per_second for i in range(limits.max_frames))


def _duration(container: av.container.InputContainer, stream: av.video.VideoStream, time_base: float) -> float:
    """Seconds of video: the stream's duration, else the container's (0 when neither is known)."""
    if stream.duration:
        return float(stream.duration * time_base)
    if container.duration:
        return float(container.duration / av.time_base)
    return 0.0


class _Overshot:
    """A seek landed past its target: the frames before it were not decoded."""


_OVERSHOT = _Overshot()


@dataclass
class _Walk:
    """Decoding state while sampling: where the decoder is, and the longest keyframe gap seen."""

    video: VideoSampler
    position_s: float = -math.inf  # timestamp of the last decoded frame
    gop_s: float = _MIN_SEEK_GAP_S
    last_key_s: float | None = None
    seeked_to: float | None = None  # where the last seek aimed, until its first frame is decoded
    can_seek: bool = True
    failed_in_row: int = 0
    decoder: Iterator[av.VideoFrame] | None = field(default=None, repr=False)

    def frames(self) -> Iterator[tuple[float, Image.Image]]:
        """(timestamp, RGB image) for each target that a frame satisfies, in order."""
        taken = -math.inf
        for target in self.video.targets:
            if target <= taken:
                continue  # the frame taken for an earlier target already covers this one
            found = self._reach(target)
            if found is None:
                if self.decoder is None and self.failed_in_row < _MAX_FAILED_TARGETS:
                    continue  # a decode error: seek on to the next target
                break  # end of file, or too many errors in a row
            self.failed_in_row = 0
            taken = found[0]
            yield found

    def _reach(self, target: float) -> tuple[float, Image.Image] | None:
        """Seek if it skips decoding, then decode forward to `target`; aim further back while a seek overshoots."""
        if self.decoder is None or (self.can_seek and self._worth_seeking(target)):
            self._seek(target)
        back = self.gop_s
        while True:
            found = self._advance(target)
            if not isinstance(found, _Overshot):
                return found
            # The demuxer landed past the target, or past the last keyframe (MPEG-TS seeks by bytes,
            # then the decoder waits for a keyframe): aim earlier, doubling, down to the start; and
            # seek less eagerly from now on.
            self.gop_s = max(self.gop_s, back)
            self._seek(max(0.0, target - back))
            back *= 2

    def _worth_seeking(self, target: float) -> bool:
        """Whether a keyframe lies after the last decoded frame and at or before `target`.

        From the container's index when it covers the target (MP4, AVI); else guessed from the
        keyframe interval seen so far (Matroska, MPEG-TS: their index grows as they are read).
        """
        v = self.video
        entries = v.stream.index_entries
        i = entries.search_timestamp(round((v.start_s + target) / v.time_base), backward=True)
        if 0 <= i < len(entries) - 1:
            return entries[i].timestamp * v.time_base - v.start_s > self.position_s + 1e-6
        return target - self.position_s > self.gop_s

    def _seek(self, aim: float) -> None:
        """Seek to the keyframe at or before `aim` (none needed to start near the beginning)."""
        v = self.video
        starting = self.decoder is None and self.position_s == -math.inf and aim <= self.gop_s
        if starting or not self.can_seek:
            self.decoder = self.decoder or v.container.decode(v.stream)
            return
        # Aiming at the start, aim before it: MPEG-TS lands on the next keyframe when asked for the first one.
        at = v.start_s + aim if aim > 0 else v.start_s - 1.0
        try:
            v.container.seek(round(at / v.time_base), stream=v.stream, backward=True)
        except av.error.FFmpegError as exc:
            # Decoded forward from here on; what the failed seek did to the demuxer is unknown.
            v.mark_damaged(f"seek to {aim:.2f} s failed ({exc}): later samples may be missing")
            self.can_seek, self.seeked_to = False, None
            self.decoder = self.decoder or v.container.decode(v.stream)
            return
        v.seeks += 1
        self.seeked_to, self.last_key_s = aim, None
        self.decoder = v.container.decode(v.stream)

    def _advance(self, target: float) -> tuple[float, Image.Image] | _Overshot | None:
        """Decode forward to the first frame at or after `target` (within half a frame)."""
        v, half = self.video, self.video.frame_period_s / 2
        assert self.decoder is not None
        try:
            for frame in self.decoder:
                t, seeked_to = self._timestamp(frame), self.seeked_to
                self._learn_gop(frame, t, target)
                if t >= target - half:
                    if seeked_to is not None and seeked_to > 0 and t > target + half:
                        return _OVERSHOT
                    check_pixels(frame.width, frame.height, v.limits)
                    return t, frame.to_image()
        except av.error.FFmpegError as exc:
            v.mark_damaged(f"decoding broke near {max(self.position_s, 0):.2f} s: {exc}")
            self.decoder, self.failed_in_row = None, self.failed_in_row + 1
            return None
        if self.seeked_to is not None and self.seeked_to > 0:
            return _OVERSHOT  # not one frame after the seek: it landed past the last keyframe it could use
        if target < v.duration_s - v.frame_period_s * 1.5:
            v.mark_damaged(f"the data ends at {max(self.position_s, 0):.2f} s of {v.duration_s:.2f} s: truncated")
        return None

    def _timestamp(self, frame: av.VideoFrame) -> float:
        """Seconds from the start of the video (one frame on from the last when the frame has no pts)."""
        self.video.frames_decoded += 1
        v, t = self.video, frame.time
        if t is not None:
            self.position_s = t - v.start_s
        else:
            self.position_s = self.position_s + v.frame_period_s if self.position_s > -math.inf else 0.0
        if v.duration_s == 0 and self.position_s > v.limits.max_duration_s:  # it did not state its duration
            raise VideoFailure(
                VideoFailureReason.TOO_LONG,
                f"still playing at {self.position_s:.0f} s > max_duration_s {v.limits.max_duration_s:.0f}; "
                "raise the limit or cut it",
            )
        return self.position_s

    def _learn_gop(self, frame: av.VideoFrame, t: float, target: float) -> None:
        """Grow the keyframe interval estimate: gaps between keyframes, and how far back a seek landed."""
        if self.seeked_to is not None and t < target:
            self.gop_s = max(self.gop_s, target - t)
        self.seeked_to = None
        if frame.key_frame:
            if self.last_key_s is not None:
                self.gop_s = max(self.gop_s, t - self.last_key_s)
            self.last_key_s = t
