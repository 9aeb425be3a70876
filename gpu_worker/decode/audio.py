"""Audio bytes -> mono float32 samples at the model's rate -> windows (docs/audio.md).

Decoding is PyAV (FFmpeg in the wheel): any container and codec FFmpeg reads (WAV, FLAC, MP3,
Ogg/Opus, M4A/AAC, and the first audio stream of a video file). The decoded frames go through
FFmpeg's own resampler (libswresample via av.AudioResampler: windowed-sinc, the filter FFmpeg
uses everywhere) to planar float at the model's rate, each channel apart; the channels are then
averaged (the mono downmix librosa and torchaudio users get; swresample's own mono matrix weighs
a stereo pair by 0.707 each, louder than either channel). Resampling each channel then averaging
equals averaging then resampling: the resampler is linear.

Windows (`windows`): starts at 0, hop, 2 x hop, ... while the window before did not reach the
end; each holds `window` samples, the last what is left. A last window shorter than MIN_TAIL_S
is dropped unless it is the only one. How a short window is padded is the model's rule (its
feature extractor's), applied by gpu_worker.kinds.audiomodel.

Failures raise AudioFailure; a file that breaks part way keeps the samples before the damage,
with `damaged` set and a note saying where it broke (as a video does).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import av
import av.error
import numpy as np

GIB = 1024**3
MIN_TAIL_S = 0.5  # a last window with less audio than this is not a window of its own (unless the only one)
# Audio signatures beside the video containers' (gpu_worker.decode.videoprobe): bytes that start like
# one but do not open are "corrupt", anything else "not_audio".
_AUDIO_MAGIC = (b"fLaC", b"ID3", b"#!AMR", b"caff", b"MAC ", b"wvpk")


class AudioFailureReason(StrEnum):
    """Why an audio file gave no windows: each value is the failure reason a run records for it."""

    NOT_AUDIO = "not_audio"  # 0 bytes, bytes no demuxer recognises, or a container without an audio stream
    CORRUPT = "corrupt"  # starts like a container but does not open, or not one sample decodes
    TOO_LARGE = "too_large"  # more bytes than max_bytes
    TOO_LONG = "too_long"  # longer than max_duration_s
    SILENT = "silent"  # every sample below the silence threshold
    EMPTY = "empty"  # decodes, but to less than min_audio_s of audio


class AudioFailure(Exception):
    """An audio file that yields no windows: `reason` for the failure line, the message says what to do."""

    def __init__(self, reason: AudioFailureReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.detail = message[:300]


@dataclass(frozen=True)
class AudioLimits:
    """What decoding takes and what a file may cost (defaults in docs/audio.md)."""

    sample_rate: int = 48_000  # the model's rate: every file is resampled to it
    max_duration_s: float = 2 * 3600.0  # longer files fail too_long from the header, before any decoding
    max_bytes: int = 8 * GIB  # larger objects fail too_large before the container is opened
    silence_peak: float = 1e-4  # -80 dBFS: a file whose every sample is below it is silent
    min_audio_s: float = 0.1  # less decoded audio than this is empty

    def __post_init__(self) -> None:
        if self.sample_rate < 1000 or self.max_duration_s <= 0 or self.max_bytes < 1:
            raise ValueError("sample_rate must be >= 1000, max_duration_s and max_bytes > 0")


@dataclass
class Audio:
    """One file's mono samples at the limits' rate, and whether it broke part way."""

    samples: np.ndarray  # float32 (n,)
    sample_rate: int
    duration_s: float  # what the header says (0 when it says nothing)
    damaged: bool = False
    note: str = ""

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def looks_like_audio(head: bytes) -> bool:
    """Whether the first bytes are an audio or video container's signature."""
    from gpu_worker.decode.videoprobe import looks_like_video

    if head.startswith(_AUDIO_MAGIC) or (head[:4] in (b"RIFF", b"RF64") and head[8:12] == b"WAVE"):
        return True
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return True
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0:  # an MPEG audio / ADTS frame sync
        return True
    return looks_like_video(io.BytesIO(head))


def _bytes(source: bytes | str | Path, limits: AudioLimits) -> bytes:
    """The source's bytes, after the empty and max_bytes checks."""
    size = len(source) if isinstance(source, bytes) else Path(source).stat().st_size
    if size == 0:  # reported as not_audio (as a 0-byte video is not_video), said plainly
        raise AudioFailure(AudioFailureReason.NOT_AUDIO, "empty: the object has 0 bytes; upload the file again")
    if size > limits.max_bytes:
        raise AudioFailure(
            AudioFailureReason.TOO_LARGE, f"{size} bytes > max_bytes {limits.max_bytes}; raise the limit or split it"
        )
    return source if isinstance(source, bytes) else Path(source).read_bytes()


def _open(data: bytes) -> tuple[av.container.InputContainer, av.audio.AudioStream]:
    """The container and its first audio stream; AudioFailure when there is none."""
    like = looks_like_audio(data[:189])
    try:
        container = av.open(io.BytesIO(data), "r", metadata_errors="replace")
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise _open_failure(like, str(exc)) from None
    if not container.streams.audio:
        kinds = ", ".join(sorted({s.type for s in container.streams}))
        container.close()
        why = f"no audio stream; streams: {kinds or 'none'}"
        raise _open_failure(like and kinds in ("", "data"), why)
    stream = container.streams.audio[0]
    if stream.codec_context is None:
        container.close()
        raise AudioFailure(
            AudioFailureReason.CORRUPT, "no decoder for its audio stream: a damaged header or an unknown codec"
        )
    return container, stream


def _open_failure(like_container: bool, why: str) -> AudioFailure:
    if like_container:
        return AudioFailure(
            AudioFailureReason.CORRUPT,
            f"starts like an audio container but does not open ({why}); it is truncated or damaged: upload it again",
        )
    return AudioFailure(AudioFailureReason.NOT_AUDIO, f"not audio ({why}); is this object an audio file?")


def _duration(container: av.container.InputContainer, stream: av.audio.AudioStream) -> float:
    """Seconds of audio the header states (0 when it states none)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return float(container.duration / av.time_base)
    return 0.0


def decode_audio(source: bytes | str | Path, limits: AudioLimits | None = None) -> Audio:
    """Decode the first audio stream to mono float32 at `limits.sample_rate` (AudioFailure when nothing to embed)."""
    limits = limits or AudioLimits()
    container, stream = _open(_bytes(source, limits))
    try:
        duration = _duration(container, stream)
        if duration > limits.max_duration_s:
            raise AudioFailure(
                AudioFailureReason.TOO_LONG,
                f"{duration:.0f} s > max_duration_s {limits.max_duration_s:.0f}; raise the limit or cut it",
            )
        stream.codec_context.thread_count = 1  # a worker decodes many files at once
        chunks, note = _decode(container, stream, limits)
    finally:
        container.close()
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    got = len(samples) / limits.sample_rate
    if not note and duration and got < duration - max(0.25, 0.02 * duration):
        note = f"the data ends at {got:.2f} s of {duration:.2f} s: truncated"
    return _checked(Audio(samples, limits.sample_rate, duration, bool(note), note), limits)


def _decode(
    container: av.container.InputContainer, stream: av.audio.AudioStream, limits: AudioLimits
) -> tuple[list[np.ndarray], str]:
    """(mono chunks, damage note): every frame resampled, channels averaged; decoding stops at the first error."""
    resampler = av.AudioResampler(format="fltp", rate=limits.sample_rate)
    chunks: list[np.ndarray] = []
    seen = 0  # samples at the model's rate so far
    cap = int(limits.max_duration_s * limits.sample_rate)
    note = ""
    try:
        for frame in container.decode(stream):
            frame.pts = None  # the resampler keeps no timestamps: samples are concatenated in order
            for out in resampler.resample(frame):
                chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
                seen += out.samples
            if seen > cap:  # a header that said nothing (or less) of its duration
                raise AudioFailure(
                    AudioFailureReason.TOO_LONG,
                    f"still playing at {seen / limits.sample_rate:.0f} s > max_duration_s "
                    f"{limits.max_duration_s:.0f}; raise the limit or cut it",
                )
    except av.error.FFmpegError as exc:
        note = f"decoding broke near {seen / limits.sample_rate:.2f} s: {exc}"
    for out in resampler.resample(None):
        chunks.append(out.to_ndarray().mean(axis=0, dtype=np.float32))
    return chunks, note


def _checked(audio: Audio, limits: AudioLimits) -> Audio:
    """The audio, unless it holds nothing to embed (corrupt, empty, silent)."""
    if not len(audio.samples) and audio.note:
        raise AudioFailure(AudioFailureReason.CORRUPT, f"not one sample decodes ({audio.note}): re-encode it")
    if audio.seconds < limits.min_audio_s:
        raise AudioFailure(
            AudioFailureReason.EMPTY, f"{audio.seconds:.3f} s of audio < {limits.min_audio_s:g} s: nothing to embed"
        )
    peak = float(np.abs(audio.samples).max())
    if peak < limits.silence_peak:
        db = 20 * np.log10(peak) if peak > 0 else -np.inf
        raise AudioFailure(
            AudioFailureReason.SILENT,
            f"every sample is below {limits.silence_peak:g} (peak {db:.0f} dBFS over {audio.seconds:.1f} s): silence",
        )
    return audio


def windows(n: int, window: int, hop: int, min_tail: int) -> list[tuple[int, int]]:
    """[start, end) sample ranges: a window every `hop` samples until one reaches the end (module docstring)."""
    if window < 1 or hop < 1:
        raise ValueError(f"window and hop must be >= 1 sample, got {window}, {hop}")
    out = [(0, min(window, n))]
    while out[-1][0] + window < n:
        start = out[-1][0] + hop
        if start >= n:  # a hop longer than the window stepped past the end
            break
        out.append((start, min(start + window, n)))
    if len(out) > 1 and out[-1][1] - out[-1][0] < window and out[-1][1] - out[-1][0] < min_tail:
        out.pop()
    return out
