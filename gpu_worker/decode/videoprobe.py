"""A video's bytes before any decoding: as a seekable file, against the size limits, and why they do not open."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import IO

from gpu_worker.decode.videolimits import VideoFailure, VideoFailureReason, VideoLimits

# Container signatures: bytes that start like a video but do not open are "corrupt", anything else "not_video".
_MAGIC_AT_0 = (b"\x1a\x45\xdf\xa3", b"OggS", b"FLV", b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3", b"\x30\x26\xb2\x75")
_MAGIC_AT_4 = (b"ftyp", b"moov", b"mdat", b"wide", b"free", b"skip")

Source = bytes | str | Path | IO[bytes]


def as_fileobj(source: Source, limits: VideoLimits) -> IO[bytes]:
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


def close_source(fileobj: IO[bytes], source: Source) -> None:
    """Close the file as_fileobj opened for `source` (a caller's own file object is the caller's to close)."""
    if fileobj is not source:
        fileobj.close()


def looks_like_video(fileobj: IO[bytes]) -> bool:
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


def open_failure(like_video: bool, why: str) -> VideoFailure:
    """The failure of a container that does not open, or opens without a video stream."""
    if like_video:
        return VideoFailure(
            VideoFailureReason.CORRUPT,
            f"starts like a video container but does not open ({why}); it is truncated or damaged: upload it again",
        )
    return VideoFailure(VideoFailureReason.NOT_VIDEO, f"not a video ({why}); is this object a video?")
