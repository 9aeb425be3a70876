"""vCPUs and GPUs of the GPU instance types the template offers, and CPU decode capacity per GPU.

The table is a starting point, overridable like the prices: SLUICE_INSTANCES_FILE names a JSON
file ({"g6e.xlarge": {"vcpus": 4, "gpus": 1}, ...}) whose entries replace or add to it. CPU
decode capacity is vCPUs per GPU x images/s one core decodes (Pillow, JPEG draft mode, resize
to 224 px): measure yours with `python -m gpu_worker.autotune` (its "decode" rows) and pass it
as `sluice plan --decode-per-core-s N`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

INSTANCES_DATE = "2025-06"
INSTANCES_SOURCE = "aws.amazon.com/ec2/instance-types (accelerated computing: G4dn, G5, G6, G6e, P4d, P5, P5e)"
# Images/s one CPU core decodes and preprocesses to 224 px: an assumption for web-sized photos
# (300-1,000 px JPEGs) from libjpeg-turbo's ~390/s a thread and Pillow being 1.3-1.55x slower,
# plus the resize. Not measured on the instances; autotune measures the real figure.
DECODE_PER_CORE_S = 200.0
# Seconds of audio one CPU core decodes, mixes to mono and resamples a second (gpu_worker.decode.audio):
# bench/audio.py on 60 s files of 44.1 kHz stereo, to 48 kHz (docs/performance.md "Audio"): MP3 423,
# M4A/AAC 441, FLAC 648; the slowest is used. An audio run always decodes on the CPU (PyAV: no GPU
# decoder); the log-mel is the model's first step, on the GPU.
AUDIO_DECODE_S_PER_CORE = 423.0
# A planning guess of an audio file's length (a song, a voice memo, a podcast's segment): the input's
# durations are not read before a run. Its windows are what the GPU embeds, each costed as an image.
AUDIO_S_PER_FILE = 360.0
AUDIO_WINDOW_S = 10.0  # input.window_s when the manifest sets none: CLAP's and the speech encoders' default


def audio_windows(window_s: float | None, hop_s: float | None) -> int:
    """Windows of a planned audio file (AUDIO_S_PER_FILE) at the manifest's window and hop."""
    window = window_s or AUDIO_WINDOW_S
    hop = hop_s or window
    return 1 + max(0, math.ceil((AUDIO_S_PER_FILE - window) / hop))


@dataclass(frozen=True)
class Instance:
    """An instance size's vCPUs and GPUs."""

    vcpus: int
    gpus: int

    @property
    def vcpus_per_gpu(self) -> float:
        return self.vcpus / max(1, self.gpus)


def _sizes(small: dict[str, tuple[int, int]]) -> dict[str, Instance]:
    return {size: Instance(v, g) for size, (v, g) in small.items()}


# The G families share one layout: 1 GPU up to 16xlarge, 4 GPUs at 12x/24x, 8 at 48x.
_G = {
    "xlarge": (4, 1),
    "2xlarge": (8, 1),
    "4xlarge": (16, 1),
    "8xlarge": (32, 1),
    "16xlarge": (64, 1),
    "12xlarge": (48, 4),
    "24xlarge": (96, 4),
    "48xlarge": (192, 8),
}
_G4DN = {**{k: v for k, v in _G.items() if k not in ("24xlarge", "48xlarge")}, "metal": (96, 8)}
INSTANCES: dict[str, Instance] = {
    **{f"g4dn.{k}": v for k, v in _sizes(_G4DN).items()},
    **{f"{fam}.{k}": v for fam in ("g5", "g6", "g6e") for k, v in _sizes(_G).items()},
    "p4d.24xlarge": Instance(96, 8),
    "p5.4xlarge": Instance(16, 1),
    "p5.48xlarge": Instance(192, 8),
    "p5e.48xlarge": Instance(192, 8),
}


def instances() -> dict[str, Instance]:
    """The table, with SLUICE_INSTANCES_FILE's entries on top."""
    path = os.environ.get("SLUICE_INSTANCES_FILE")
    if not path:
        return dict(INSTANCES)
    raw = json.loads(Path(path).read_text())
    return {**INSTANCES, **{k.lower(): Instance(**v) for k, v in raw.items()}}


def instance(name: str) -> Instance | None:
    """g6e.xlarge -> its vCPUs and GPUs; a family or an unknown size -> None."""
    return instances().get(name.strip().lower())


def more_cpu_per_gpu(family: str, need_per_gpu: float, table: Mapping[str, Instance] | None = None) -> str | None:
    """The smallest size of `family` with at least `need_per_gpu` vCPUs per GPU (None: none has)."""
    table = instances() if table is None else table
    fits = [(i.vcpus, name) for name, i in table.items() if name.startswith(family + ".")]
    fits = [(v, name) for v, name in sorted(fits) if table[name].vcpus_per_gpu >= need_per_gpu]
    return fits[0][1] if fits else None
