"""Audio decoding (gpu_worker.decode.audio): containers, mono, resampling, windows, reasons, damage."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_worker.decode.audio import AudioFailure, AudioLimits, decode_audio, windows
from gpu_worker.kinds.audiomodel import AudioModel, pad_window
from tests.audio import FORMATS, make_audio, make_video_with_audio, tone
from tests.videos import make_video


@pytest.mark.parametrize("suffix", sorted(FORMATS))
def test_every_common_container_decodes_to_mono_at_the_models_rate(suffix):
    rate = 48_000 if suffix == "opus" else 44_100
    audio = decode_audio(make_audio(tone(2.0, rate, seed=1), suffix, rate), AudioLimits(sample_rate=16_000))
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert audio.seconds == pytest.approx(2.0, abs=0.05) and not audio.damaged  # AAC adds its priming, < 25 ms


def test_the_audio_track_of_a_video_decodes():
    audio = decode_audio(make_video_with_audio(tone(1.5, seed=2)), AudioLimits(sample_rate=16_000))
    assert audio.seconds == pytest.approx(1.5, abs=0.05)


def test_resampling_is_exact_and_the_downmix_is_the_channels_mean():
    # A 440 Hz sine at 44.1 kHz, left and right of different amplitude, resampled to 16 kHz: the mean of
    # the two, sampled at 16 kHz, to 16-bit precision away from the edges (the resampler's filter warms up).
    rate, n = 44_100, 44_100 * 2
    t = np.arange(n) / rate
    stereo = np.stack([0.6 * np.sin(2 * np.pi * 440 * t), 0.2 * np.sin(2 * np.pi * 440 * t)]).astype(np.float32)
    got = decode_audio(make_audio(stereo, "wav"), AudioLimits(sample_rate=16_000)).samples
    want = 0.4 * np.sin(2 * np.pi * 440 * np.arange(len(got)) / 16_000)
    assert np.abs(got[400:-400] - want[400:-400]).max() < 2e-3


def test_bad_files_have_their_own_reasons():
    def reason(data: bytes) -> str:
        with pytest.raises(AudioFailure) as info:
            decode_audio(data)
        return info.value.reason.value

    assert reason(b"") == "not_audio"
    assert reason(b"just some text, not audio" * 10) == "not_audio"
    assert reason(make_video(1.0)) == "not_audio"  # a video without an audio track
    assert reason(make_audio(np.zeros((2, 44_100), np.float32), "wav")) == "silent"
    assert reason(make_audio(tone(0.02, seed=3), "wav")) == "empty"
    assert reason(b"RIFF\x00\x00\x00\x00WAVEfmt " + bytes(40)) == "corrupt"
    with pytest.raises(AudioFailure) as info:
        decode_audio(make_audio(tone(3.0, seed=4), "flac"), AudioLimits(max_duration_s=2.0))
    assert info.value.reason.value == "too_long"


def test_a_file_broken_part_way_keeps_the_audio_before_the_damage():
    flac = make_audio(tone(6.0, seed=5), "flac")
    audio = decode_audio(flac[: len(flac) // 2], AudioLimits(sample_rate=16_000))
    assert audio.damaged and "broke near" in audio.note and 1.0 < audio.seconds < 4.0
    mp3 = make_audio(tone(6.0, seed=5), "mp3")
    audio = decode_audio(mp3[: len(mp3) // 2], AudioLimits(sample_rate=16_000))
    assert audio.damaged and "the data ends at" in audio.note and 2.0 < audio.seconds < 4.0


def test_windows_cover_the_audio_once_and_drop_a_sliver_at_the_end():
    assert windows(100, 40, 40, 10) == [(0, 40), (40, 80), (80, 100)]
    assert windows(85, 40, 40, 10) == [(0, 40), (40, 80)]  # 5 samples left: under min_tail
    assert windows(5, 40, 40, 10) == [(0, 5)]  # the only window is kept, however short
    assert windows(100, 40, 20, 10) == [(0, 40), (20, 60), (40, 80), (60, 100)]
    assert windows(100, 20, 50, 1) == [(0, 20), (50, 70)]  # a hop past the window leaves gaps


def test_a_short_window_is_padded_as_the_models_feature_extractor_pads():
    x = np.arange(1, 4, dtype=np.float32)
    clap = AudioModel(None, 48_000, 10.0, 8, "repeatpad")
    assert pad_window(x, clap).tolist() == [1, 2, 3, 1, 2, 3, 0, 0]  # ClapFeatureExtractor's repeatpad
    whisper = AudioModel(None, 16_000, 30.0, 8, "zeros")
    assert pad_window(x, whisper).tolist() == [1, 2, 3, 0, 0, 0, 0, 0]
    speech = AudioModel(None, 16_000, 10.0, None, "none", min_samples=5)
    assert pad_window(x, speech).tolist() == [1, 2, 3, 0, 0] and len(pad_window(np.ones(9, np.float32), speech)) == 9


def test_the_torch_log_mel_equals_the_librarys_feature_extractor():
    from transformers import ClapFeatureExtractor

    from gpu_worker.export.audiofeatures import LogMel, WaveNorm

    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal(48_000 * 3)).astype(np.float32)
    for truncation in ("fusion", "rand_trunc"):
        fe = ClapFeatureExtractor(truncation=truncation, max_length_s=3)
        want = fe(x, sampling_rate=48_000, return_tensors="np")["input_features"][0, 0]
        mel = fe.mel_filters if truncation == "fusion" else fe.mel_filters_slaney
        import torch

        got = LogMel(mel, fe.fft_window_size, fe.hop_length)(torch.from_numpy(x)[None])[0].numpy()
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-4  # dB
    from transformers import Wav2Vec2FeatureExtractor

    want = Wav2Vec2FeatureExtractor(do_normalize=True)(x, sampling_rate=16_000, return_tensors="np")["input_values"][0]
    got = WaveNorm()(torch.from_numpy(x)[None])[0].numpy()
    assert np.abs(got - want).max() < 1e-5
