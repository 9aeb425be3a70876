"""Audio artifacts for audio runs (input.kind audio): one TorchScript file, waveform in, embedding out.

`sluice model export hf:REPO` on an audio model writes `<out>` (spec inside as `sluice.json` and
beside as `<out>.json`: kinds ["audio"], sample_rate, window_s, input_samples, pad, min_samples):

* CLAP (`ClapModel`): the log-mel of ClapFeatureExtractor (gpu_worker.export.audiofeatures.LogMel,
  its own filter bank), the audio tower and its projection into the joint audio-text space
  (`get_audio_features`); a 10 s window at 48 kHz, a shorter one repeat-padded as the extractor
  pads it. The text tower goes beside it (`<out>.text.pt`, gpu_worker.models.texttower), so
  `sluice search --text` works on an audio index. A fusion model's extractor stacks the mel four
  times and, for a batch of one, marks it `is_longer`: the artifact does the same for every
  window (the library's result on one window at a time, whatever the batch).
* wav2vec2, HuBERT, WavLM, data2vec-audio: the waveform normalised as Wav2Vec2FeatureExtractor
  does (WaveNorm) when it says do_normalize, the encoder, the mean of its last hidden state over
  time; any window length (default 10 s at 16 kHz).
* Whisper (`WhisperModel`): its extractor's log-mel (WhisperLogMel), the encoder only, on windows
  zero-padded to 30 s as the extractor pads; the mean over all 1,500 frames (the padding's too).

Before the file is kept it is loaded the way the worker loads it and run on test windows (a full
one and a short one) against the library's own pipeline (its feature extractor, then the model):
the features' max abs difference and every window's cosine (>= MIN_COSINE) go into the spec's
`reference`; below it the export fails.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import numpy as np
import torch
from torch import nn

from gpu_worker.errors import ExportError
from gpu_worker.export.audiofeatures import LogMel, WaveNorm, WhisperLogMel
from gpu_worker.export.sources import RANDOM_INIT, hf_config
from gpu_worker.models.spec import META_NAME

MIN_COSINE = 0.999
SPEECH_FAMILIES = frozenset({"wav2vec2", "hubert", "wavlm", "data2vec-audio", "wav2vec2-conformer"})
SPEECH_WINDOW_S = 10.0


class ClapAudio(nn.Module):
    """(B, N) waveform at 48 kHz -> (B, D): log-mel, CLAP's audio tower, its projection."""

    def __init__(self, model: nn.Module, logmel: LogMel, fusion: bool) -> None:
        super().__init__()
        self.audio_model: Any = model.audio_model
        self.audio_projection: Any = model.audio_projection
        self.logmel = logmel
        self.fusion = fusion

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        mel = self.logmel(wave)[:, None]  # (B, 1, frames, mels)
        longer = (wave[:, :1] == wave[:, :1]) if self.fusion else (wave[:, :1] != wave[:, :1])  # (B, 1) all one value
        if self.fusion:
            mel = mel.expand(-1, 4, -1, -1)
        pooled = self.audio_model(input_features=mel, is_longer=longer).pooler_output
        return self.audio_projection(pooled)  # type: ignore[no-any-return]


class ClapText(nn.Module):
    """(ids, mask) -> (B, D): CLAP's text tower and projection (the texttower sidecar)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model: Any = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model.get_text_features(input_ids=ids, attention_mask=mask).pooler_output  # type: ignore[no-any-return]


class MeanPooled(nn.Module):
    """(B, N) waveform at 16 kHz -> (B, D): normalised (when its extractor normalises), encoded, mean over time."""

    def __init__(self, model: nn.Module, normalize: bool) -> None:
        super().__init__()
        self.model = model
        self.norm = WaveNorm() if normalize else nn.Identity()

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        hidden = self.model(input_values=self.norm(wave)).last_hidden_state
        return hidden.mean(dim=1)  # type: ignore[no-any-return]


class WhisperMean(nn.Module):
    """(B, 480000) waveform at 16 kHz -> (B, D): Whisper's log-mel, its encoder, mean over time."""

    def __init__(self, encoder: nn.Module, logmel: WhisperLogMel) -> None:
        super().__init__()
        self.encoder = encoder
        self.logmel = logmel

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_features=self.logmel(wave)).last_hidden_state
        return hidden.mean(dim=1)  # type: ignore[no-any-return]


@dataclass
class AudioSource:
    """An audio model ready to export: the artifact's module, its input rules, the library's own pipeline."""

    module: nn.Module
    name: str
    version: str
    sample_rate: int
    window_s: float
    input_samples: int | None
    pad: str
    features: str
    library: Any  # (window (N,) float32) -> ((features, embedding)): the library's pipeline on one window
    min_samples: int = 1
    text: Any = None  # CLAP: (ClapText, fast tokenizer, context length)
    spec_extra: dict[str, Any] = field(default_factory=dict)


def is_audio_type(model_type: str) -> bool:
    return model_type in ("clap", "whisper") or model_type in SPEECH_FAMILIES


def load_clap(repo: str, pretrained: bool) -> AudioSource:
    """`hf:REPO` of a ClapModel: the audio tower with its feature extraction, the text tower beside."""
    import transformers

    model = transformers.ClapModel.from_pretrained(repo) if pretrained else _random(transformers.ClapModel, repo)
    model.eval()
    try:
        fe = transformers.ClapFeatureExtractor.from_pretrained(repo)
        tok = transformers.AutoTokenizer.from_pretrained(repo, use_fast=True)
    except (OSError, ValueError) as exc:
        raise ExportError(f"hf:{repo}: cannot read its feature extractor or tokenizer: {exc}") from None
    fusion = fe.truncation == "fusion"
    if fe.padding != "repeatpad":
        raise ExportError(f"hf:{repo}: its feature extractor pads with {fe.padding!r}; Sluice pads repeatpad only")
    mel = fe.mel_filters if fusion else fe.mel_filters_slaney
    logmel = LogMel(mel, fe.fft_window_size, fe.hop_length)

    def library(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = fe(window, sampling_rate=fe.sampling_rate, return_tensors="pt")
        with torch.no_grad():
            emb = model.get_audio_features(**inputs).pooler_output
        return inputs["input_features"][0, 0].numpy(), emb[0].numpy()

    length = int(getattr(model.config.text_config, "max_position_embeddings", 514)) - 2  # RoBERTa's offset
    length = min(length, int(tok.model_max_length) if tok.model_max_length < 10**6 else length)
    return AudioSource(
        module=ClapAudio(model, logmel, fusion).eval(),
        name=f"hf:{repo}",
        version=_version(model, repo, pretrained),
        sample_rate=int(fe.sampling_rate),
        window_s=fe.nb_max_samples / fe.sampling_rate,
        input_samples=int(fe.nb_max_samples),
        pad="repeatpad",
        features=f"log-mel {fe.feature_size} ({'htk, fusion' if fusion else 'slaney'}), n_fft {fe.fft_window_size}, "
        f"hop {fe.hop_length}",
        library=library,
        text=(ClapText(model).eval(), tok, length),
    )


def load_speech(repo: str, config: Any, pretrained: bool) -> AudioSource:
    """`hf:REPO` of a wav2vec2-like encoder: its extractor's normalisation, the encoder, mean pooling."""
    import transformers

    if pretrained:
        model = transformers.AutoModel.from_pretrained(repo)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = transformers.AutoModel.from_config(config)
    model.eval()
    try:
        fe = transformers.AutoFeatureExtractor.from_pretrained(repo)
    except (OSError, ValueError) as exc:
        raise ExportError(f"hf:{repo}: cannot read its feature extractor: {exc}") from None
    normalize = bool(getattr(fe, "do_normalize", False))
    kernels = getattr(model.config, "conv_kernel", (400,))
    strides = getattr(model.config, "conv_stride", (1,))
    reach = 1
    for k, s in zip(reversed(list(kernels)), reversed(list(strides))):
        reach = (reach - 1) * s + k  # samples the conv stack needs for one frame

    def library(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = fe(window, sampling_rate=fe.sampling_rate, return_tensors="pt")
        with torch.no_grad():
            hidden = model(input_values=inputs["input_values"]).last_hidden_state
        return inputs["input_values"][0].numpy(), hidden.mean(dim=1)[0].numpy()

    return AudioSource(
        module=MeanPooled(model, normalize).eval(),
        name=f"hf:{repo}",
        version=_version(model, repo, pretrained),
        sample_rate=int(fe.sampling_rate),
        window_s=SPEECH_WINDOW_S,
        input_samples=None,
        pad="none",
        features="waveform, zero mean and unit variance" if normalize else "waveform",
        library=library,
        min_samples=reach,
    )


def load_whisper(repo: str, pretrained: bool) -> AudioSource:
    """`hf:REPO` of a WhisperModel: its log-mel and encoder, mean pooling (the decoder is left out)."""
    import transformers

    cls = transformers.WhisperModel
    model = (cls.from_pretrained(repo) if pretrained else _random(cls, repo)).eval()
    try:
        fe = transformers.WhisperFeatureExtractor.from_pretrained(repo)
    except (OSError, ValueError) as exc:
        raise ExportError(f"hf:{repo}: cannot read its feature extractor: {exc}") from None
    if getattr(fe, "dither", 0.0):
        raise ExportError(f"hf:{repo}: its feature extractor dithers (random noise): Sluice embeds deterministically")
    encoder = model.get_encoder()

    def library(window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        inputs = fe(window, sampling_rate=fe.sampling_rate, return_tensors="pt")
        with torch.no_grad():
            hidden = encoder(input_features=inputs["input_features"]).last_hidden_state
        return inputs["input_features"][0].numpy(), hidden.mean(dim=1)[0].numpy()

    return AudioSource(
        module=WhisperMean(encoder, WhisperLogMel(fe.mel_filters, fe.n_fft, fe.hop_length)).eval(),
        name=f"hf:{repo}",
        version=_version(model, repo, pretrained),
        sample_rate=int(fe.sampling_rate),
        window_s=fe.n_samples / fe.sampling_rate,
        input_samples=int(fe.n_samples),
        pad="zeros",
        features=f"log-mel {fe.feature_size} (slaney), n_fft {fe.n_fft}, hop {fe.hop_length}, Whisper's scale",
        library=library,
    )


def _random(cls: Any, repo: str) -> Any:
    """`cls` built from the folder's config with random weights (seeded: the same file every export)."""
    config = cls.config_class.from_pretrained(repo)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return cls(config)


def _version(model: Any, repo: str, pretrained: bool) -> str:
    return (getattr(model.config, "_commit_hash", None) or repo) if pretrained else RANDOM_INIT


def audio_source(spec: str, pretrained: bool) -> AudioSource | None:
    """The audio model `hf:REPO` names, or None when it is not one."""
    found = hf_config(spec)
    if found is None:
        return None
    repo, config = found
    if config.model_type == "clap":
        return load_clap(repo, pretrained)
    if config.model_type in SPEECH_FAMILIES:
        return load_speech(repo, config, pretrained)
    if config.model_type == "whisper":
        return load_whisper(repo, pretrained)
    return None


def test_windows(src: AudioSource) -> list[np.ndarray]:
    """A full window and a short one (padded by the model's rule) of tones and noise, at the model's rate."""
    rate = src.sample_rate
    n = src.input_samples or round(src.window_s * rate)
    rng = np.random.default_rng(7)
    t = np.arange(n) / rate
    full = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(n)
    full[n // 2 :] += 0.2 * np.sin(2 * np.pi * 1320 * t[n // 2 :])
    short = 0.4 * np.sin(2 * np.pi * 220 * t[: round(n * 0.37)]) + 0.02 * rng.standard_normal(round(n * 0.37))
    return [full.astype(np.float32), short.astype(np.float32)]


def spec_of(src: AudioSource, output_dim: int) -> dict[str, Any]:
    """The artifact's sluice.json."""
    from gpu_worker.export.artifact import weights_sha256

    return {
        "name": src.name,
        "version": src.version,
        "source": src.name,
        "format": "torchscript",
        "kinds": ["audio"],
        "output_dim": output_dim,
        "sample_rate": src.sample_rate,
        "window_s": src.window_s,
        "input_samples": src.input_samples,
        "pad": src.pad,
        "min_samples": src.min_samples,
        "features": src.features,
        "weights_sha256": weights_sha256(src.module),
        "exported_with": {k: metadata.version(k) for k in ("torch", "transformers", "av")},
    } | src.spec_extra


def write_audio_model(src: AudioSource, path: str) -> tuple[dict[str, Any], float]:
    """Trace, save (spec inside and beside), check against the library: (spec, lowest cosine)."""
    wins = test_windows(src)
    n = src.input_samples or len(wins[0])
    example = torch.from_numpy(np.stack([wins[0][:n], wins[0][::-1][:n].copy()]))
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(src.module, example, check_trace=False)
        dim = int(src.module(example).shape[1])
    spec = spec_of(src, dim)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(traced, path, _extra_files={META_NAME: json.dumps(spec, sort_keys=True)})
    try:
        spec["reference"] = compare_with_library(src, path, wins)
    except ExportError:
        os.unlink(path)
        raise
    with warnings.catch_warnings():  # the spec inside again, with what the comparison found
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(traced, path, _extra_files={META_NAME: json.dumps(spec, sort_keys=True)})
    with open(path + ".json", "w") as fh:
        json.dump(spec, fh, indent=2, sort_keys=True)
    if src.text is not None:
        write_clap_text(src, path, spec["weights_sha256"])
    return spec, float(spec["reference"]["min_cosine"])


def compare_with_library(src: AudioSource, path: str, wins: list[np.ndarray]) -> dict[str, Any]:
    """The file as the worker runs it against the library's pipeline on the same windows (ExportError when off)."""
    from gpu_worker.kinds.audiomodel import audio_embedder, pad_window

    embedder = audio_embedder(path)
    got = embedder.embed(wins)
    feat_diff, cosines = 0.0, []
    for win, vec in zip(wins, got):
        feats, want = src.library(win)
        ours = _features(src, pad_window(win, embedder.model))
        feat_diff = max(feat_diff, float(np.abs(ours - feats).max()))
        cosines.append(float(vec @ want / max(float(np.linalg.norm(want)), 1e-12)))
    low = min(cosines)
    if low < MIN_COSINE:
        raise ExportError(
            f"{src.name}: the exported file's embedding differs from transformers' own pipeline (cosine {low:.5f} < "
            f"{MIN_COSINE}; features off by {feat_diff:.2e}): report it with the model's name"
        )
    return {
        "library": f"transformers {metadata.version('transformers')}",
        "features_max_abs_diff": feat_diff,
        "min_cosine": low,
        "windows": [len(w) for w in wins],
    }


def _features(src: AudioSource, window: np.ndarray) -> np.ndarray:
    """The artifact's own features of one padded window (what it feeds its encoder)."""
    x = torch.from_numpy(np.ascontiguousarray(window))[None]
    module = src.module
    with torch.no_grad():
        if isinstance(module, (ClapAudio, WhisperMean)):
            return module.logmel(x)[0].numpy()  # type: ignore[no-any-return]
        assert isinstance(module, MeanPooled)
        return module.norm(x)[0].numpy()  # type: ignore[no-any-return]


def write_clap_text(src: AudioSource, path: str, audio_sha256: str) -> None:
    """CLAP's text tower beside the audio artifact (gpu_worker.models.texttower), checked against the library."""
    from gpu_worker.models.texttower import SPEC_SUFFIX, TEXT_SUFFIX, TOKENIZER_SUFFIX, TextSpec, encode_texts

    module, fast, length = src.text
    samples = ["a dog barking in the rain", "a piano melody, slow and quiet", "speech"]
    enc = fast(samples, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, (enc["input_ids"], enc["attention_mask"]), check_trace=False)
        want = nn.functional.normalize(module(enc["input_ids"], enc["attention_mask"]).float(), dim=1)
        torch.jit.save(traced, path + TEXT_SUFFIX)
    tok = fast.backend_tokenizer
    spec = TextSpec(length, int(fast.pad_token_id or 0), int(want.shape[1]), ("input_ids", "attention_mask"))
    spec = TextSpec(
        **(spec.__dict__ | {"name": src.name, "version": src.version, "image_weights_sha256": audio_sha256})
    )
    tok.save(path + TOKENIZER_SUFFIX)
    with open(path + SPEC_SUFFIX, "w") as fh:
        fh.write(spec.to_json())
    got = torch.from_numpy(encode_texts(path, samples))
    diff = float((got - want).abs().max())
    if diff > 1e-3:
        raise ExportError(f"{src.name}: the exported text tower differs from transformers' by {diff:.2e}")
