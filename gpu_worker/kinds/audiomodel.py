"""An audio run's model: an audio artifact on windows of each file, one row a window (docs/audio.md).

Files are decoded by gpu_worker.decode.audio (PyAV: mono at the model's rate) and cut into
windows of `window_s` every `hop_s` (defaults: the model's window, no overlap). A window's row
has part = its index, part_start / part_end = its first and last second. A file that breaks
part way keeps the windows before the damage (Part.note says where: logged and counted by
gpu_worker.passes.parts).

An audio artifact is one TorchScript file: (B, N) float32 waveforms at `sample_rate` -> (B, D),
its feature extraction inside (log-mel for CLAP and Whisper, normalised waveform for wav2vec2:
gpu_worker.export.audio), its spec inside as `sluice.json` (kinds ["audio"], sample_rate,
window_s, input_samples, pad, min_samples). A model with a fixed input (`input_samples`) takes
every window padded to it the way its feature extractor pads: `repeatpad` (CLAP: the window
repeated whole, then zeros) or `zeros` (Whisper); a model without (`pad` none: wav2vec2,
HuBERT) takes each window at its own length, zero-padded only up to `min_samples`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gpu_worker.decode.audio import MIN_TAIL_S, AudioFailure, AudioLimits, decode_audio, windows
from gpu_worker.errors import ConfigError, ObjectFailure
from gpu_worker.kinds.base import Loading, Part, PartsInfo
from gpu_worker.models.load import load_scripted
from gpu_worker.models.spec import parse_spec
from sluice.contracts.status import FailureReason

PADS = ("repeatpad", "zeros", "none")


@dataclass(frozen=True)
class AudioModel:
    """A loaded audio artifact: its network and what its spec says of its input."""

    net: Any
    sample_rate: int
    window_s: float  # the model's own window (its default)
    input_samples: int | None  # the fixed input length; None: any length
    pad: str  # how a shorter window is padded to input_samples (PADS)
    min_samples: int = 1
    version: str = ""

    @property
    def max_window_s(self) -> float | None:
        return None if self.input_samples is None else self.input_samples / self.sample_rate


def pad_window(x: np.ndarray, model: AudioModel) -> np.ndarray:
    """One window as the model takes it: padded as its feature extractor pads (module docstring)."""
    n = len(x)
    if model.input_samples is None:
        return x if n >= model.min_samples else np.pad(x, (0, model.min_samples - n))
    size = model.input_samples
    if n >= size:
        return x[:size]
    if model.pad == "repeatpad":  # transformers' ClapFeatureExtractor: whole repeats, then zeros
        x = np.tile(x, size // n)
    return np.pad(x, (0, size - len(x)))


class AudioEmbedder:
    """Decodes and windows a file (split); embeds windows in batches of `batch` of one length (embed)."""

    def __init__(self, model: AudioModel, window_s: float, hop_s: float, limits: AudioLimits, how: Loading) -> None:
        rate = model.sample_rate
        if model.max_window_s is not None and window_s > model.max_window_s + 1e-9:
            raise ConfigError(
                f"model {how.planned.uri}: window_s {window_s:g} is over the {model.max_window_s:g} s its input "
                "holds: give input.window_s at most that"
            )
        self.model, self.limits = model, limits
        self.window, self.hop = round(window_s * rate), round(hop_s * rate)
        self._device = torch.device(how.device)
        self._net = model.net.to(self._device)
        self._batch = max(1, how.batch)
        self.sort_batches = 1 if model.input_samples else 4  # own-length windows: gathered so tails batch together
        self.info = PartsInfo(how.planned.name, model.version)
        self.output_dim = int(self.embed([np.zeros(min(self.window, rate), np.float32) + 0.1]).shape[1])

    def split(self, data: bytes) -> list[Part]:
        try:
            audio = decode_audio(data, self.limits)
        except AudioFailure as f:
            raise ObjectFailure(FailureReason(f.reason.value), f.detail) from None
        rate = audio.sample_rate
        spans = windows(len(audio.samples), self.window, self.hop, round(MIN_TAIL_S * rate))
        parts = [Part(i, a / rate, b / rate, audio.samples[a:b]) for i, (a, b) in enumerate(spans)]
        if audio.note:
            parts[0] = Part(0, parts[0].start, parts[0].end, parts[0].payload, audio.note)
        return parts

    def embed(self, payloads: Sequence[Any]) -> np.ndarray:
        """(len(payloads), D) unit vectors in the payloads' order; each batch holds windows of one length."""
        ready = [pad_window(np.asarray(p, np.float32), self.model) for p in payloads]
        by_len: dict[int, list[int]] = {}
        for i, x in enumerate(ready):
            by_len.setdefault(len(x), []).append(i)
        out: np.ndarray | None = None
        for idx in by_len.values():
            for j in range(0, len(idx), self._batch):
                chunk = idx[j : j + self._batch]
                batch = torch.from_numpy(np.stack([ready[i] for i in chunk])).to(self._device)
                with torch.inference_mode():
                    y = F.normalize(self._net(batch).float(), dim=1).cpu().numpy()
                if out is None:
                    out = np.empty((len(payloads), y.shape[1]), np.float32)
                out[chunk] = y
        assert out is not None, "no payloads"
        return out


def file_model(path: str) -> AudioModel:
    """An audio artifact: TorchScript with its spec inside (module docstring)."""
    if not os.path.isfile(path):
        raise ConfigError(f"model file {path!r} does not exist (an audio run takes an audio artifact)")
    net, _, spec = load_scripted(path, "audio")
    kinds = spec.get("kinds") or ["image"]
    if "audio" not in kinds or spec.get("pad", "none") not in PADS:
        raise ConfigError(
            f"model {path} embeds {' or '.join(kinds)}, not audio (its spec's kinds): export an audio model with "
            "`sluice model export hf:<CLAP, wav2vec2, HuBERT or Whisper model>` (docs/audio.md)"
        )
    size = spec.get("input_samples")
    return AudioModel(
        net,
        int(spec["sample_rate"]),
        float(spec["window_s"]),
        int(size) if size else None,
        str(spec.get("pad", "none")),
        int(spec.get("min_samples", 1)),
        str(spec.get("version", "")),
    )


def load_audio(how: Loading) -> AudioEmbedder:
    """The audio embedder of `how.planned`: windows from the manifest, else the model's own."""
    model = file_model(how.path)
    window_s = how.content.window_s or model.window_s
    hop_s = how.content.hop_s or window_s
    limits = AudioLimits(sample_rate=model.sample_rate, max_bytes=how.cfg.max_object_bytes)
    return AudioEmbedder(model, window_s, hop_s, limits, how)


def audio_embedder(path: str, window_s: float | None = None, hop_s: float | None = None) -> AudioEmbedder:
    """The artifact at `path` on the CPU with a run's default settings (queries, export checks, benches)."""
    from gpu_worker.config import WorkerConfig
    from sluice.contracts.plan import PlannedModel
    from sluice.contracts.sections import ContentSpec, ModelSpec

    planned = PlannedModel.of(ModelSpec(uri=path))
    content = ContentSpec(kind="audio", window_s=window_s, hop_s=hop_s)
    return load_audio(Loading(path, planned, content, "cpu", 8, WorkerConfig.model_validate({})))


def is_audio_model(path: str) -> bool:
    """Whether the local file `path` is an audio artifact (its spec's kinds)."""
    if path.startswith("builtin:") or not os.path.isfile(path):
        return False
    from gpu_worker.models.spec import embedded_spec

    try:
        return "audio" in (parse_spec(path, embedded_spec(path)).get("kinds") or [])
    except ConfigError:
        return False


def embed_audio_query(path: str, data: bytes, name: str) -> np.ndarray:
    """(1, D) unit vector of a query file: windowed and embedded as a run does, the windows' mean, normalised."""
    embedder = audio_embedder(path)
    try:
        parts = embedder.split(data)
    except ObjectFailure as exc:
        raise ConfigError(f"{name}: cannot be embedded ({exc.reason.value}: {exc.detail})") from None
    vecs = embedder.embed([p.payload for p in parts])
    mean = vecs.mean(axis=0, keepdims=True)
    return np.asarray(mean / max(float(np.linalg.norm(mean)), 1e-12), np.float32)
