"""bench/gpu_check.sh's Python part: the models, model-only and naive-loop timings, NVML samples, the table.

    python bench/gpu_check.py model NAME SIZE DIR [--tiny]       URI: builtin:reference-cnn-large or a ViT-B/16 file
    python bench/gpu_check.py model-only URI SIZE DEVICE BATCH SECONDS   one JSON row
    python bench/gpu_check.py naive URI SIZE DEVICE BATCH IMAGES          one JSON row
    python bench/gpu_check.py nvml OUT.csv                        NVML utilization and memory every 100 ms
    python bench/gpu_check.py worker-row NAME DECODE UTIL.csv     one JSON row from the worker's result.json
    python bench/gpu_check.py table ROWS.jsonl                    the table
    python bench/gpu_check.py dry                                 all of the above that runs on a CPU, tiny

Random weights only (no model hub): a ResNet-50 (the worker's builtin) and a ViT-B/16-shaped
transformer (12 layers, 768 wide, 16 px patches) traced to TorchScript here. The naive loop is
what a first script does: one thread, Pillow full decode and resize, fp32, one batch at a time.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_worker.autotune import trial
from gpu_worker.decode.bench import sample_jpegs
from gpu_worker.models.load import load_model
from gpu_worker.models.spec import META_NAME

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class ViT(nn.Module):
    """A ViT-B/16-shaped encoder (random weights): patch embedding, pre-norm transformer, CLS token."""

    def __init__(self, size: int, patch: int = 16, dim: int = 768, depth: int = 12) -> None:
        super().__init__()
        torch.manual_seed(16)
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, dim // 64, 4 * dim, 0.0, "gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.norm(self.encoder(x))[:, 0]


def model_uri(name: str, size: int, folder: str, tiny: bool = False) -> str:
    """The worker's model URI for NAME (resnet50 | vit-b16); tiny: small stand-ins for a dry run on a CPU."""
    if name == "resnet50":
        return "builtin:reference-cnn" if tiny else "builtin:reference-cnn-large"
    if name != "vit-b16":
        raise SystemExit(f"gpu_check: unknown model {name!r}: resnet50 or vit-b16")
    vit = ViT(size, dim=64, depth=2) if tiny else ViT(size)
    spec = {"name": f"{name}-random", "image_size": size, "mean": MEAN, "std": STD}
    path = os.path.join(folder, f"{name}{'-tiny' if tiny else ''}.pt")
    with torch.no_grad():
        traced = torch.jit.trace(vit.eval(), torch.zeros(2, 3, size, size), check_trace=False)
    torch.jit.save(traced, path, _extra_files={META_NAME: json.dumps(spec)})
    return path


def model_only(uri: str, size: int, device: str, batch: int, seconds: float) -> dict[str, Any]:
    """The worker's Engine on random uint8 batches: images/s and peak GPU memory."""
    model, info = load_model(uri, size)
    t = trial(model, info, device, batch, seconds, True)
    return {"model_only": round(t.images_per_s, 1), "peak_gib": round(t.peak_gib, 2), "status": t.status}


def naive(uri: str, size: int, device: str, batch: int, n_images: int) -> dict[str, Any]:
    """One thread: Pillow full decode + resize, fp32 model, one batch after another. Images/s."""
    model, info = load_model(uri, size)
    model = model.to(device).eval()
    jpegs = sample_jpegs(min(n_images, 256), seed=3)
    mean = torch.tensor(info.mean, device=device).view(1, 3, 1, 1)
    std = torch.tensor(info.std, device=device).view(1, 3, 1, 1)
    t0 = time.perf_counter()
    for start in range(0, n_images, batch):
        chunk = [jpegs[i % len(jpegs)] for i in range(start, min(n_images, start + batch))]
        arrs = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB").resize((size, size))) for d in chunk]
        x = torch.from_numpy(np.stack(arrs)).to(device).permute(0, 3, 1, 2).float().div(255)
        with torch.no_grad():
            model((x - mean) / std).cpu()
    return {"naive": round(n_images / (time.perf_counter() - t0), 1)}


def nvml(out: str, index: int = 0) -> None:
    """Append (epoch s, utilization %, memory used GiB) every 100 ms until killed."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    with open(out, "w", newline="") as fh:
        w = csv.writer(fh)
        while True:
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30
            w.writerow([f"{time.time():.3f}", util, f"{mem:.2f}"])
            fh.flush()
            time.sleep(0.1)


def busy(samples: list[tuple[float, float, float]], window: tuple[float, float]) -> dict[str, Any]:
    """Mean NVML busy fraction and peak memory over the worker's pipeline window."""
    inside = [s for s in samples if window[0] <= s[0] <= window[1]]
    if not inside:
        return {"busy": None, "gpu_mem_gib": None}
    return {
        "busy": round(sum(s[1] for s in inside) / (100 * len(inside)), 3),
        "gpu_mem_gib": round(max(s[2] for s in inside), 2),
    }


def read_samples(path: str) -> list[tuple[float, float, float]]:
    if not os.path.exists(path):
        return []
    with open(path, newline="") as fh:
        return [(float(a), float(b), float(c)) for a, b, c in csv.reader(fh) if a]


def worker_row(name: str, decode: str, util_csv: str) -> dict[str, Any]:
    """End to end from the worker's result.json (on the check's S3), with NVML busy over its window."""
    import boto3

    from sluice.aws.s3uri import parse_s3_uri
    from sluice.paths import RunPaths

    key = parse_s3_uri(RunPaths.in_bucket("check-control", f"gpu-check-{name}-{decode}").result(0))[1]
    res = json.loads(boto3.client("s3").get_object(Bucket="check-control", Key=key)["Body"].read())
    stats = res.get("stats", {})
    row = {"model": name, f"e2e_{decode}": round(res["processed"] / res["pipeline_seconds"], 1)}
    row |= {f"{k}_{decode}": v for k, v in busy(read_samples(util_csv), tuple(res["pipeline_window"])).items()}
    row[f"fallback_{decode}"] = int(stats.get("decode_gpu_fallback", 0))
    return row


COLUMNS = (
    ("model", "model"),
    ("model_only", "model only (images/s)"),
    ("e2e_cpu", "end to end, CPU decode"),
    ("busy_cpu", "busy (NVML), CPU decode"),
    ("e2e_gpu", "end to end, GPU decode"),
    ("busy_gpu", "busy (NVML), GPU decode"),
    ("gpu_mem_gib_gpu", "GPU memory GiB, GPU decode"),
    ("peak_gib", "model-only peak GiB"),
    ("naive", "naive loop (images/s)"),
    ("vs_naive", "GPU decode / naive"),
)


def table(rows: list[dict[str, Any]]) -> str:
    """One row per model (rows of one model merged), one column per figure."""
    merged: dict[str, dict[str, Any]] = {}
    for r in rows:
        merged.setdefault(r["model"], {}).update(r)
    for r in merged.values():
        if r.get("e2e_gpu") and r.get("naive"):
            r["vs_naive"] = round(r["e2e_gpu"] / r["naive"], 1)
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|---" + "|---:" * (len(COLUMNS) - 1) + "|"]
    for r in merged.values():
        lines.append("| " + " | ".join("n/a" if r.get(k) is None else str(r[k]) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def dry() -> str:
    """Every part that runs without a GPU, with tiny models: the table they make."""
    folder = tempfile.mkdtemp(prefix="gpu-check-dry-")
    rows = []
    for name in ("resnet50", "vit-b16"):
        uri = model_uri(name, 32, folder, tiny=True)
        rows.append({"model": name, **model_only(uri, 32, "cpu", 4, 0.05)})
        rows.append({"model": name, **naive(uri, 32, "cpu", 4, 8)})
    return table(rows)


def main(argv: list[str]) -> int:
    cmd, *a = argv
    if cmd == "model":
        print(model_uri(a[0], int(a[1]), a[2], tiny="--tiny" in a))
    elif cmd == "model-only":
        print(json.dumps(model_only(a[0], int(a[1]), a[2], int(a[3]), float(a[4]))))
    elif cmd == "naive":
        print(json.dumps(naive(a[0], int(a[1]), a[2], int(a[3]), int(a[4]))))
    elif cmd == "nvml":
        nvml(a[0])
    elif cmd == "worker-row":
        print(json.dumps(worker_row(a[0], a[1], a[2])))
    elif cmd == "table":
        print(table([json.loads(line) for line in Path(a[0]).read_text().splitlines() if line.strip()]))
    elif cmd == "dry":
        print(dry())
    else:
        raise SystemExit(f"gpu_check: unknown command {cmd!r} (see the module docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
