"""transformers' audio feature extractors in torch, so they trace into an audio artifact (docs/audio.md).

LogMel is `transformers.audio_utils.spectrogram` as ClapFeatureExtractor calls it: frames centred
(the waveform reflect-padded by half a frame), a periodic Hann window, |rfft|^2, the extractor's
own mel filter bank (copied from it, so the filters are the library's to the last bit), floored at
1e-10, 10 log10 (dB, no top_db). WaveNorm is Wav2Vec2FeatureExtractor's do_normalize: zero mean
and unit variance over the window (variance + 1e-7). LogMel computes in float64 as the library does
(in float32 a bin near the floor is off by up to 1 dB); the export measures the difference on
real windows and records it in the spec.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class LogMel(nn.Module):
    """(B, N) waveforms -> (B, frames, mels) log-mel in dB, frames = 1 + N // hop."""

    mel: torch.Tensor
    window: torch.Tensor

    def __init__(self, mel_filters: np.ndarray, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("mel", torch.from_numpy(np.asarray(mel_filters, np.float64)))  # (n_fft // 2 + 1, mels)
        self.register_buffer("window", torch.hann_window(n_fft, periodic=True, dtype=torch.float64))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        half = self.n_fft // 2
        x = nn.functional.pad(wave[:, None, :].double(), (half, half), mode="reflect")[:, 0]
        frames = x.unfold(-1, self.n_fft, self.hop) * self.window  # (B, frames, n_fft)
        power = torch.fft.rfft(frames, n=self.n_fft).abs() ** 2
        mel = torch.clamp(power @ self.mel, min=1e-10)
        return (10.0 * torch.log10(mel)).float()


class WaveNorm(nn.Module):
    """(B, N) -> (B, N): each waveform to zero mean and unit variance, as Wav2Vec2FeatureExtractor normalises."""

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        mean = wave.mean(dim=1, keepdim=True)
        var = ((wave - mean) ** 2).mean(dim=1, keepdim=True)
        return (wave - mean) / torch.sqrt(var + 1e-7)
