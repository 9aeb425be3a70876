"""Benchmark audio: decode + resample + features per core, and a run's pipeline vs the library's, end to end.

    .venv/bin/python bench/audio.py                      # 60 s files: MP3, FLAC, M4A/AAC, 44.1 kHz stereo
    .venv/bin/python bench/audio.py --seconds 300 --repeat 2

Encodes synthetic stereo files once (tests/audio.py: chords that change every second), then, in
one process pinned to one torch thread:

* decode: gpu_worker.decode.audio.decode_audio to mono at 48 kHz (CLAP) and 16 kHz (wav2vec2,
  Whisper): PyAV's decoder and FFmpeg's resampler; then CLAP's log-mel of every 10 s window
  (gpu_worker.export.audiofeatures.LogMel, what the artifact runs first). Printed as seconds of
  audio per CPU second (one core's work).
* end to end, on a small random-weight CLAP exported as a run exports it: ours = decode, window,
  the artifact (features inside) in batches of 8; the library's = the same decoded windows through
  ClapFeatureExtractor one window at a time (numpy, float64: its own code) and
  ClapModel.get_audio_features in batches of 8 (the extractor's features stacked). Both give
  the same vectors (the bench checks cosine >= 0.999); printed: CPU seconds and library / ours.

Times are CPU seconds of the process (user + sys), best of --repeat.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_worker.decode.audio import AudioLimits, decode_audio
from tests.audio import make_audio, tone


def cpu() -> float:
    return time.process_time()


def best(fn, repeat: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    times, out = [], None
    for _ in range(repeat):
        t0 = cpu()
        out = fn()
        times.append(cpu() - t0)
    return min(times), out


def decode_rows(files: dict[str, bytes], seconds: float, repeat: int) -> None:
    from transformers import ClapFeatureExtractor

    from gpu_worker.export.audiofeatures import LogMel

    fe = ClapFeatureExtractor()
    logmel = LogMel(fe.mel_filters, fe.fft_window_size, fe.hop_length)
    print("| file | decode to 48 kHz, s audio / CPU s | decode to 16 kHz | + CLAP log-mel (48 kHz) |")
    print("|---|---:|---:|---:|")
    for name, data in files.items():
        t48, audio = best(lambda d=data: decode_audio(d, AudioLimits(sample_rate=48_000)), repeat)
        t16, _ = best(lambda d=data: decode_audio(d, AudioLimits(sample_rate=16_000)), repeat)
        samples = audio.samples  # type: ignore[attr-defined]
        n = 480_000
        wins = torch.from_numpy(
            np.stack([np.pad(samples[i : i + n], (0, max(0, i + n - len(samples)))) for i in range(0, len(samples), n)])
        )
        with torch.inference_mode():
            tf, _ = best(lambda w=wins: logmel(w), repeat)
        print(f"| {name} | {seconds / t48:,.0f} | {seconds / t16:,.0f} | {seconds / (t48 + tf):,.0f} |")


def end_to_end(files: dict[str, bytes], seconds: float, repeat: int) -> None:
    from gpu_worker.export import export
    from gpu_worker.export.audio import load_clap
    from gpu_worker.kinds.audiomodel import audio_embedder
    from tests.audiomodels import clap_folder

    with tempfile.TemporaryDirectory() as tmp:
        clap_folder(Path(tmp) / "clap")
        export(f"hf:{tmp}/clap", f"{tmp}/clap.pt")
        ours = audio_embedder(f"{tmp}/clap.pt")
        lib = load_clap(f"{tmp}/clap", pretrained=True)
        import transformers

        fe = transformers.ClapFeatureExtractor.from_pretrained(f"{tmp}/clap")
        model = transformers.ClapModel.from_pretrained(f"{tmp}/clap").eval()

        def run_ours(data: bytes) -> np.ndarray:
            parts = ours.split(data)
            return ours.embed([p.payload for p in parts])

        def run_library(data: bytes) -> np.ndarray:
            parts = ours.split(data)  # the same decoded windows
            feats = [fe(p.payload, sampling_rate=48_000, return_tensors="pt") for p in parts]
            out = []
            with torch.inference_mode():
                for i in range(0, len(feats), 8):
                    batch = feats[i : i + 8]
                    x = torch.cat([f["input_features"] for f in batch])
                    longer = torch.ones((len(batch), 1), dtype=torch.bool)  # each window alone: is_longer set
                    out.append(model.get_audio_features(input_features=x, is_longer=longer).pooler_output.numpy())
            return np.concatenate(out)

        print("\n| file | windows | ours CPU s | library CPU s | library / ours | lowest cosine |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, data in files.items():
            to, a = best(lambda d=data: run_ours(d), repeat)
            tl, b = best(lambda d=data: run_library(d), repeat)
            a, b = np.asarray(a), np.asarray(b)
            cos = float(((a * b).sum(1) / np.linalg.norm(b, axis=1)).min())
            assert cos >= 0.999, cos
            print(f"| {name} | {len(a)} | {to:.2f} | {tl:.2f} | **{tl / to:.2f}** | {cos:.6f} |")
        del lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    sig = tone(args.seconds, seed=1)
    files = {f"{args.seconds:g} s {s}": make_audio(sig, s) for s in ("mp3", "flac", "m4a")}
    print(f"torch threads 1; {args.seconds:g} s of 44.1 kHz stereo each\n")
    decode_rows(files, args.seconds, args.repeat)
    end_to_end(files, args.seconds, args.repeat)


if __name__ == "__main__":
    main()
