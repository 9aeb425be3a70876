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
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO

import av
import av.container
import av.error
import av.video
from PIL import Image

GIB = 1024**3
# Seeking is worth it only past this gap, even before a keyframe interval has been seen.
_MIN_SEEK_GAP_S = 1.0
# Targets that fail to decode in a row before the rest of the video is given up as damaged.
_MAX_FAILED_TARGETS = 3
# Container signatures: bytes that start like a video but do not open are "corrupt", anything else "not_video".
_MAGIC_AT_0 = (b"\x1a\x45\xdf\xa3", b"OggS", b"FLV", b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3", b"\x30\x26\xb2\x75")
_MAGIC_AT_4 = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip")


class VideoFailureReason(StrEnum):
    """Why a video gave no frames: each value is the failure reason a run records for it."""

    NOT_VIDEO = "not_video"  # 0 bytes, bytes no demuxer recognises, or a container without a video stream
    CORRUPT = "corrupt"  # starts like a video container but does not open, or its stream has no decoder
    TOO_LARGE = "too_large"  # more bytes than max_bytes
    TOO_LONG = "too_long"  # longer than max_duration_s
    BOMB = "bomb"  # a frame larger than max_frame_pixels
    NO_FRAMES = "no_frames"  # the container opens but not one frame decodes


class VideoFailure(Exception):
    """A video that yields no frames: `reason` for the failure line, the message says what to do."""

    def __init__(self, reason: VideoFailureReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.detail = message[:300]


@dataclass(frozen=True)
class VideoLimits:
    """How frames are sampled and what a video may cost (defaults in docs/video.md)."""

    frames_per_second: float = 1.0  # samples per second of video, when frames_per_video is None
    frames_per_video: int | None = None  # N samples spread over the whole duration instead
    max_frames: int = 1800  # most samples from one video (30 min at 1/s); longer ones get this many, spread
    max_duration_s: float = 4 * 3600.0  # longer videos fail too_long before any decoding
    max_frame_pixels: int = 7680 * 4320  # 8K UHD; a larger frame (header or decoded) fails bomb
    max_bytes: int = 8 * GIB  # larger objects fail too_large before the container is opened

    def __post_init__(self) -> None:
        if not self.frames_per_second > 0:
            raise ValueError(f"frames_per_second must be > 0, got {self.frames_per_second}")
        if self.frames_per_video is not None and self.frames_per_video < 1:
            raise ValueError(f"frames_per_video must be >= 1 or None, got {self.frames_per_video}")
        if self.max_frames < 1 or self.max_frame_pixels < 1 or self.max_bytes < 1 or self.max_duration_s <= 0:
            raise ValueError("max_frames, max_frame_pixels, max_bytes and max_duration_s must be > 0")


@dataclass(frozen=True)
class VideoFrame:
    """One sampled frame: its part index, its timestamp from the start of the video, and its pixels."""

    part: int
    timestamp_s: float
    image: Image.Image  # RGB, the video's own size: the image model's preprocessing applies unchanged


@dataclass
class VideoFrames:
    """Every sampled frame of one video, and whether the video broke part way."""

    frames: list[VideoFrame]
    duration_s: float
    damaged: bool = False
    note: str = ""


Source = bytes | str | Path | IO[bytes]


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
    fileobj = _as_fileobj(source, limits)
    like_video = _looks_like_video(fileobj)
    try:
        container = av.open(fileobj, "r", metadata_errors="replace")
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        _close(fileobj, source)
        raise _open_failure(like_video, str(exc)) from None
    try:
        if not container.streams.video:
            kinds = ", ".join(sorted({s.type for s in container.streams}))
            raise _open_failure(like_video and kinds in ("", "data"), f"no video stream; streams: {kinds or 'none'}")
        still = container.format.name
        if still == "image2" or still.endswith("_pipe"):  # FFmpeg reads a lone JPEG or PNG as a 1-frame "video"
            raise VideoFailure(
                VideoFailureReason.NOT_VIDEO,
                f"a still image ({still.removesuffix('_pipe')}), not a video: run it as an image (input.kind image)",
            )
        return VideoSampler(container, limits, on_close=fileobj if fileobj is not source else None)
    except BaseException:
        container.close()
        _close(fileobj, source)
        raise


def _as_fileobj(source: Source, limits: VideoLimits) -> IO[bytes]:
    """The source as a seekable binary file, after the empty and max_bytes checks."""
    if isinstance(source, bytes):
        size: int | None = len(source)
    elif isinstance(source, str | Path):
        size = os.stat(source).st_size
    else:
        size = _size_of(source)
    if size == 0:  # reported as not_video (like a 0-byte image is not_image), said plainly
        raise VideoFailure(VideoFailureReason.NOT_VIDEO, "empty: the object has 0 bytes; upload the video again")
    if size is not None and size > limits.max_bytes:
        raise VideoFailure(
            VideoFailureReason.TOO_LARGE, f"{size} bytes > max_bytes {limits.max_bytes}; raise the limit or split it"
        )
    if isinstance(source, bytes):
        return io.BytesIO(source)
    if isinstance(source, str | Path):
        return open(source, "rb")  # closed with the container
    return source


def _size_of(fileobj: IO[bytes]) -> int | None:
    """Bytes left in a seekable file (None when it cannot seek)."""
    try:
        here = fileobj.tell()
        end = fileobj.seek(0, io.SEEK_END)
        fileobj.seek(here)
    except (OSError, AttributeError, ValueError):
        return None
    return end - here


def _close(fileobj: IO[bytes], source: Source) -> None:
    if fileobj is not source:
        fileobj.close()


def _looks_like_video(fileobj: IO[bytes]) -> bool:
    """Whether the first bytes are a video container's signature (the file is left where it was)."""
    try:
        here = fileobj.tell()
        head = fileobj.read(189)
        fileobj.seek(here)
    except (OSError, ValueError):
        return False
    return (
        head.startswith(_MAGIC_AT_0)
        or head[4:8] in _MAGIC_AT_4
        or (head[:4] == b"RIFF" and head[8:12] == b"AVI ")
        or (len(head) == 189 and head[0] == head[188] == 0x47)  # MPEG-TS: a sync byte every 188
    )


def _open_failure(like_video: bool, why: str) -> VideoFailure:
    """The failure of a container that does not open, or opens without a video stream."""
    if like_video:
        return VideoFailure(
            VideoFailureReason.CORRUPT,
            f"starts like a video container but does not open ({why}); it is truncated or damaged: upload it again",
        )
    return VideoFailure(VideoFailureReason.NOT_VIDEO, f"not a video ({why}); is this object a video?")


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
        _check_pixels(self.stream.codec_context.width, self.stream.codec_context.height, limits)
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


def _check_pixels(width: int, height: int, limits: VideoLimits) -> None:
    if width * height > limits.max_frame_pixels:
        raise VideoFailure(
            VideoFailureReason.BOMB,
            f"frame {width}x{height} = {width * height} pixels > max_frame_pixels {limits.max_frame_pixels}",
        )


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
                    _check_pixels(frame.width, frame.height, v.limits)
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
