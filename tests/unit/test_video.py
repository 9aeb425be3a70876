"""Video frame sampling: timestamps and counts per mode, seeks land on the right frame, limits, bad bytes."""

from __future__ import annotations

import functools
import io
import math
import os
import wave

import av
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.decode.video import open_video, sample_frames
from gpu_worker.decode.videolimits import VideoFailure, VideoFailureReason, VideoLimits
from gpu_worker.decode.videosampler import plan_targets
from tests.properties import examples
from tests.videos import colour_of, make_video

EXAMPLES = examples(10)


@pytest.fixture(scope="module")
def five_seconds() -> bytes:
    return make_video(5, fps=10)


@functools.cache
def bframe_video(gop: int, container: str) -> bytes:
    """12 s of H.264 with B-frames (x264's default), a keyframe every `gop` frames."""
    return make_video(12, fps=10, codec="libx264", gop=gop, container=container)


def second_shown(image: object) -> int:
    """Which second's colour a sampled frame shows (the nearest of the first 40), asserting it is close."""
    pixel = image.getpixel((image.width // 2, image.height // 2))  # type: ignore[attr-defined]
    dist, second = min((sum(abs(a - b) for a, b in zip(pixel, colour_of(s))), s) for s in range(40))
    assert dist < 30, f"pixel {pixel} matches no second's colour"
    return second


def failure(source: object, limits: VideoLimits | None = None) -> VideoFailure:
    with pytest.raises(VideoFailure) as info:
        sample_frames(source, limits)  # type: ignore[arg-type]
    return info.value


def test_one_frame_per_second_by_default(five_seconds: bytes) -> None:
    got = sample_frames(five_seconds)
    assert [f.part for f in got.frames] == [0, 1, 2, 3, 4]
    assert [f.timestamp_s for f in got.frames] == pytest.approx([0, 1, 2, 3, 4])
    assert [second_shown(f.image) for f in got.frames] == [0, 1, 2, 3, 4]
    assert all(f.image.mode == "RGB" and f.image.size == (64, 48) for f in got.frames)
    assert got.duration_s == pytest.approx(5.0)
    assert (got.damaged, got.note) == (False, "")


def test_frames_per_second_two(five_seconds: bytes) -> None:
    got = sample_frames(five_seconds, VideoLimits(frames_per_second=2))
    assert [f.timestamp_s for f in got.frames] == pytest.approx([i / 2 for i in range(10)])
    assert [second_shown(f.image) for f in got.frames] == [i // 2 for i in range(10)]


def test_frames_per_video_spreads_over_the_duration(five_seconds: bytes) -> None:
    got = sample_frames(five_seconds, VideoLimits(frames_per_video=4))
    centres = [5 * (i + 0.5) / 4 for i in range(4)]
    assert len(got.frames) == 4
    for frame, centre in zip(got.frames, centres):
        assert abs(frame.timestamp_s - centre) <= 0.05 + 1e-9  # the frame at the centre, within half a frame
        assert second_shown(frame.image) == math.floor(frame.timestamp_s)


def test_max_frames_caps_and_spreads(five_seconds: bytes) -> None:
    got = sample_frames(five_seconds, VideoLimits(frames_per_second=10, max_frames=3))
    assert [round(f.timestamp_s, 1) for f in got.frames] == [0.8, 2.5, 4.2]


def test_more_samples_than_frames_never_repeats_a_frame() -> None:
    got = sample_frames(make_video(0.5, fps=4), VideoLimits(frames_per_video=10))
    stamps = [f.timestamp_s for f in got.frames]
    assert stamps == sorted(set(stamps)) and len(stamps) == 2


def test_sparse_samples_seek_to_keyframes_and_land_on_the_right_frame() -> None:
    video = make_video(20, fps=10, codec="libx264", gop=10)  # a keyframe every second
    with open_video(video, VideoLimits(frames_per_second=0.2)) as v:
        frames = list(v)
        decoded, seeks = v.frames_decoded, v.seeks
    assert [f.timestamp_s for f in frames] == pytest.approx([0, 5, 10, 15])
    assert [second_shown(f.image) for f in frames] == [0, 5, 10, 15]
    assert seeks == 3
    assert decoded <= 4 * 10  # at most one keyframe interval per sample, of 200 frames


def test_long_keyframe_interval_decodes_forward_rather_than_seeking_back() -> None:
    video = make_video(12, fps=10, codec="libx264", gop=60)  # keyframes at 0 s and 6 s only
    with open_video(video, VideoLimits(frames_per_second=1)) as v:
        frames = list(v)
        decoded = v.frames_decoded
    assert [second_shown(f.image) for f in frames] == list(range(12))
    assert decoded <= 120 + 60  # never much worse than decoding every frame once


def test_the_keyframe_index_lets_samples_skip_whole_keyframe_intervals() -> None:
    video = make_video(10, fps=10, codec="libx264", gop=20)  # keyframes at even seconds; one sample a second
    with open_video(video, VideoLimits(frames_per_second=1)) as v:
        frames = list(v)
        decoded = v.frames_decoded
    assert [second_shown(f.image) for f in frames] == list(range(10))
    assert decoded <= 75  # the odd-to-even second stretches are skipped by seeks, of 100 frames


@pytest.mark.parametrize(("container", "codec"), [("matroska", "libx264"), ("mpegts", "libx264"), ("avi", "mpeg4")])
def test_other_containers_sample_the_same_frames(container: str, codec: str) -> None:
    video = make_video(6, fps=10, codec=codec, gop=20, container=container)
    got = sample_frames(video, VideoLimits(frames_per_second=0.5))
    assert [f.timestamp_s for f in got.frames] == pytest.approx([0, 2, 4])
    assert [second_shown(f.image) for f in got.frames] == [0, 2, 4]
    assert not got.damaged


def test_seeking_past_the_end_of_a_truncated_video_keeps_what_decoded() -> None:
    video = make_video(10, fps=10, codec="libx264", gop=10)
    data = video.index(b"mdat")
    got = sample_frames(video[: data + (len(video) - data) * 6 // 10], VideoLimits(frames_per_second=0.25))
    assert [f.timestamp_s for f in got.frames] == pytest.approx([0, 4])  # the sample at 8 s is cut off
    assert [second_shown(f.image) for f in got.frames] == [0, 4]
    assert got.damaged and ("truncated" in got.note or "decoding broke" in got.note)


def test_a_stream_without_a_duration_is_sampled_until_it_ends() -> None:
    video = make_video(3, fps=25, codec="libx264", container="h264")  # raw H.264: no container, no duration
    got = sample_frames(video)
    assert got.duration_s == 0.0
    assert [f.timestamp_s for f in got.frames] == pytest.approx([0, 1, 2])
    assert [second_shown(f.image) for f in got.frames] == [0, 1, 2]
    assert not got.damaged


def test_a_stream_without_a_duration_is_decoded_forward_for_sparse_samples() -> None:
    video = make_video(12, fps=25, codec="libx264", gop=50, container="h264")
    with open_video(video, VideoLimits(frames_per_second=0.25)) as v:
        frames = list(v)
        seeks, damaged = v.seeks, v.damaged
    assert [second_shown(f.image) for f in frames] == [0, 4, 8]
    assert (seeks, damaged) == (0, False)


def test_a_stream_without_a_duration_fails_too_long_when_it_plays_past_the_limit() -> None:
    video = make_video(3, fps=25, codec="libx264", container="h264")
    with open_video(video, VideoLimits(max_duration_s=1.5)) as v, pytest.raises(VideoFailure) as info:
        list(v)
    assert info.value.reason == VideoFailureReason.TOO_LONG


def test_path_file_and_bytes_sample_the_same(five_seconds: bytes, tmp_path: object) -> None:
    path = tmp_path / "v.mp4"  # type: ignore[operator]
    path.write_bytes(five_seconds)
    stamps = [[f.timestamp_s for f in sample_frames(s).frames] for s in (five_seconds, path, str(path))]
    with path.open("rb") as fh:
        stamps.append([f.timestamp_s for f in sample_frames(fh).frames])
    assert stamps[1:] == stamps[:1] * 3


def test_too_long_fails_before_decoding(five_seconds: bytes) -> None:
    with pytest.raises(VideoFailure) as info:
        open_video(five_seconds, VideoLimits(max_duration_s=4.5))
    assert info.value.reason == VideoFailureReason.TOO_LONG
    assert "max_duration_s" in str(info.value)


def test_frame_size_over_the_limit_is_a_bomb_from_the_header() -> None:
    video = make_video(0.2, fps=5, size=(1280, 720))
    with pytest.raises(VideoFailure) as info:
        open_video(video, VideoLimits(max_frame_pixels=1280 * 720 - 1))
    assert info.value.reason == VideoFailureReason.BOMB
    assert "1280x720" in str(info.value)
    assert len(sample_frames(video, VideoLimits(max_frame_pixels=1280 * 720)).frames) == 1


def test_max_bytes(five_seconds: bytes) -> None:
    err = failure(five_seconds, VideoLimits(max_bytes=len(five_seconds) - 1))
    assert err.reason == VideoFailureReason.TOO_LARGE
    err = failure(io.BytesIO(five_seconds), VideoLimits(max_bytes=100))
    assert err.reason == VideoFailureReason.TOO_LARGE


def test_random_bytes_are_not_video() -> None:
    err = failure(os.urandom(20_000))
    assert err.reason == VideoFailureReason.NOT_VIDEO
    assert "is this object a video" in str(err)


def test_zero_bytes_are_not_video_and_say_empty() -> None:
    err = failure(b"")
    assert err.reason == VideoFailureReason.NOT_VIDEO
    assert "empty" in str(err)


def test_a_video_cut_inside_its_header_is_corrupt(five_seconds: bytes) -> None:
    assert failure(five_seconds[:64]).reason == VideoFailureReason.CORRUPT


def test_audio_only_is_not_video() -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\x00\x01" * 8000)
    err = failure(buf.getvalue())
    assert err.reason == VideoFailureReason.NOT_VIDEO
    assert "no video stream" in str(err)


def test_header_without_frame_data_has_no_frames(five_seconds: bytes) -> None:
    mdat = five_seconds.index(b"mdat") + 4  # moov comes first: cut right after the data box's header
    err = failure(five_seconds[:mdat])
    assert err.reason == VideoFailureReason.NO_FRAMES


def test_truncated_video_keeps_its_early_frames(five_seconds: bytes) -> None:
    got = sample_frames(five_seconds[: len(five_seconds) * 6 // 10])
    assert 1 <= len(got.frames) < 5
    assert [second_shown(f.image) for f in got.frames] == list(range(len(got.frames)))
    assert got.damaged and "truncated" in got.note


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.binary(min_size=1, max_size=64),
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["mp4", "avi", "matroska", "mpegts"]),
)
def test_damage_anywhere_fails_typed_or_keeps_frames(garbage: bytes, where: int, container: str) -> None:
    video = bframe_video(5, container)
    at = where % len(video)
    damaged = video[:at] + garbage + video[at + len(garbage) :]
    try:
        got = sample_frames(damaged)
    except VideoFailure as exc:
        assert exc.reason in set(VideoFailureReason)
    else:
        assert [f.part for f in got.frames] == list(range(len(got.frames)))


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.integers(min_value=5, max_value=40).map(lambda tenths: tenths / 10),
    st.sampled_from([5, 10, 25]),
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
)
def test_any_duration_and_rate(seconds: float, video_fps: int, sample_fps: float) -> None:
    video = make_video(seconds, fps=video_fps)
    got = sample_frames(video, VideoLimits(frames_per_second=sample_fps))
    frames = round(seconds * video_fps)
    targets = plan_targets(frames / video_fps, VideoLimits(frames_per_second=sample_fps))
    # Each target takes the first frame at or after it, within half a frame period.
    chosen = {max(0, math.ceil(t * video_fps - 0.5 - 1e-9)) for t in targets}
    expected = [k / video_fps for k in sorted(chosen) if k < frames]
    assert [f.timestamp_s for f in got.frames] == pytest.approx(expected)
    assert [second_shown(f.image) for f in got.frames] == [math.floor(t + 1e-9) for t in expected]
    assert not got.damaged


def decode_everything(video: bytes, targets: list[float], half: float) -> list[float]:
    """The reference: decode every frame in order, keep the first at or after each target."""
    with av.open(io.BytesIO(video)) as c:
        start = float((c.streams.video[0].start_time or 0) * c.streams.video[0].time_base)
        stamps = [float(f.time) - start for f in c.decode(video=0) if f.time is not None]
    chosen: list[float] = []
    for target in targets:
        later = [t for t in stamps if t >= target - half and (not chosen or t > chosen[-1])]
        if later and (not chosen or target > chosen[-1]):
            chosen.append(later[0])
    return chosen


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    st.sampled_from([5, 20, 60]),
    st.sampled_from(["mp4", "matroska", "mpegts"]),
    st.one_of(
        st.builds(lambda n: VideoLimits(frames_per_video=n), st.integers(1, 30)),
        st.builds(lambda f: VideoLimits(frames_per_second=f), st.sampled_from([0.3, 0.7, 1.5, 4.0])),
    ),
)
def test_seeking_takes_the_frames_decoding_everything_would(gop: int, container: str, limits: VideoLimits) -> None:
    video = bframe_video(gop, container)
    got = sample_frames(video, limits)
    targets = plan_targets(got.duration_s, limits)
    assert [f.timestamp_s for f in got.frames] == pytest.approx(decode_everything(video, targets, 0.05))
    assert [second_shown(f.image) for f in got.frames] == [math.floor(f.timestamp_s + 1e-9) for f in got.frames]


@pytest.mark.parametrize(
    ("duration", "limits", "expected"),
    [
        (3.0, VideoLimits(), [0, 1, 2]),
        (3.2, VideoLimits(), [0, 1, 2, 3]),
        (0.0, VideoLimits(), [0]),
        (4.0, VideoLimits(frames_per_video=2), [1, 3]),
        (10.0, VideoLimits(frames_per_second=1, max_frames=2), [2.5, 7.5]),
        (10.0, VideoLimits(frames_per_video=5, max_frames=2), [2.5, 7.5]),
    ],
)
def test_plan_targets(duration: float, limits: VideoLimits, expected: list[float]) -> None:
    assert plan_targets(duration, limits) == pytest.approx(expected)


@pytest.mark.parametrize(
    "kwargs",
    [{"frames_per_second": 0}, {"frames_per_video": 0}, {"max_frames": 0}, {"max_duration_s": 0}],
)
def test_limits_refuse_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        VideoLimits(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_a_still_image_named_like_a_video_is_not_video(fmt: str) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 10, 10)).save(buf, fmt)
    with pytest.raises(VideoFailure) as err:
        open_video(buf.getvalue())  # FFmpeg would read it as a one-frame video
    assert err.value.reason == VideoFailureReason.NOT_VIDEO and "a still image" in str(err.value)
