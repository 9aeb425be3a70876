"""The loader's CPU decode step before and after job.decode: decode_image called directly (before)
against the loader_decode callable a CPU rank now gets (after), interleaved in one process.

    .venv/bin/python bench/decode_paths.py                 # 200 JPEGs of 500 x 375, 224 px, 7 rounds
    .venv/bin/python bench/decode_paths.py --rounds 5 --images 100

Each round times both on the same images, one after the other (which goes first alternates),
so a VM whose speed drifts affects both alike; prints images/s per round and the after/before ratio (1.00: no change).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_worker.config import WorkerConfig
from gpu_worker.decode.bench import MAX_PIXELS, sample_jpegs
from gpu_worker.decode.image import decode_image
from gpu_worker.decode.nvjpeg import loader_decode
from gpu_worker.decode.preprocess import legacy


def _rate(fn: Callable[[bytes], object], images: list[bytes]) -> float:
    t0 = time.perf_counter()
    for d in images:
        fn(d)
    return len(images) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--size", type=int, default=224)
    args = ap.parse_args()
    images = sample_jpegs(args.images)
    size = args.size
    before = lambda d: decode_image(d, legacy(size), MAX_PIXELS)  # noqa: E731
    after = loader_decode(WorkerConfig(device="cpu"), legacy(size))
    rows = []
    for i in range(args.rounds):  # ABBA: which runs first alternates, so a drifting VM favours neither
        if i % 2:
            a, b = _rate(after, images), _rate(before, images)
        else:
            b, a = _rate(before, images), _rate(after, images)
        rows.append((b, a, a / b))
    print("| round | before: decode_image (images/s) | after: loader_decode (images/s) | after/before |")
    print("|---:|---:|---:|---:|")
    for i, (b, a, r) in enumerate(rows, 1):
        print(f"| {i} | {b:.1f} | {a:.1f} | {r:.3f} |")
    med = statistics.median(r for _, _, r in rows)
    print(f"| median | | | **{med:.3f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
