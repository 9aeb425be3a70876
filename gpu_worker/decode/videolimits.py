"""What sampling a video takes and gives: its limits, the sampled frames, and the typed failures."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from PIL import Image

GIB = 1024**3


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


def check_pixels(width: int, height: int, limits: VideoLimits) -> None:
    if width * height > limits.max_frame_pixels:
        raise VideoFailure(
            VideoFailureReason.BOMB,
            f"frame {width}x{height} = {width * height} pixels > max_frame_pixels {limits.max_frame_pixels}",
        )
