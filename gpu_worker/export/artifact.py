"""A Source -> a Sluice model artifact: the TorchScript or torch.export file plus its spec.

The artifact's forward takes the normalized (B, 3, S, S) float batch the worker builds and
returns (B, D) embeddings; its batch dimension is free (TorchScript traces it symbolically,
torch.export marks it dynamic), so the plan's batch size can change without a new export.
The spec (docs/models.md) is written twice: as the sidecar `<file>.json` the worker reads
first, and embedded in the archive as `sluice.json`, so a file copied without its sidecar
still carries it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch
from torch import nn

from gpu_worker.errors import ExportError
from gpu_worker.export.sources import Source
from gpu_worker.models.spec import META_NAME

FORMATS = ("torchscript", "pt2")
EXAMPLE_BATCH = 2
MAX_BATCH = 4096
TOLERANCE = 1e-3  # max |difference| of the L2-normalized embeddings (what the worker writes)


class Embedder(nn.Module):
    """The encoder's output as one (B, D) tensor: the first element of a tuple, flattened."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.encoder(x)
        if isinstance(y, tuple | list):
            y = y[0]
        return y.flatten(1)


def weights_sha256(module: nn.Module) -> str:
    """sha256 over the state dict (names, dtypes, shapes, bytes, in name order): the weights' identity,
    whatever the file format or the pickling."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def example_batch(size: int, n: int = EXAMPLE_BATCH, seed: int = 0) -> torch.Tensor:
    """A normalized-looking batch (standard normal), the same for every call with the same arguments."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=gen)


def build_spec(src: Source, fmt: str, output_dim: int, digest: str) -> dict[str, Any]:
    """The artifact's spec: what the worker needs (input size, mean/std, output dim) and what it is."""
    versions: dict[str, str] = {"torch": str(torch.__version__)}
    with contextlib.suppress(metadata.PackageNotFoundError):  # the library was just imported: found
        versions[src.library] = metadata.version(src.library)
    spec: dict[str, Any] = {
        "name": src.name,
        "version": src.version,
        "source": src.name,
        "format": fmt,
        "image_size": src.image_size,
        "mean": list(src.mean),
        "std": list(src.std),
        "output_dim": output_dim,
        "weights_sha256": digest,
        "exported_with": versions,
    }
    if src.preprocess is not None:  # the library's pipeline, applied exactly by the worker
        spec["preprocess"] = src.preprocess.to_spec()
    return spec


BF16_MIN_COSINE = 0.999  # bf16 autocast is kept only when every sample embedding stays this close to fp32


def precision(embedder: nn.Module, image_size: int, n: int = 4) -> tuple[str, float]:
    """("bf16" or "fp32", the lowest cosine of bf16-autocast embeddings against fp32 ones on `n` samples).

    Checked on the CPU's bf16 autocast (the export machine has no GPU to assume); the worker
    runs bf16 autocast on GPU only for a model whose spec says bf16.
    """
    x = example_batch(image_size, n=n, seed=2)
    norm = torch.nn.functional.normalize
    with torch.no_grad():
        full = norm(embedder(x).float().flatten(1), dim=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = embedder(x)
        half = norm(half.float().flatten(1), dim=1)
    cos = float((full * half).sum(dim=1).min())
    return ("bf16" if cos >= BF16_MIN_COSINE else "fp32"), cos


def save(embedder: Embedder, fmt: str, path: str, spec: dict[str, Any]) -> None:
    """Trace (TorchScript) or export (torch.export) the embedder to `path`, the spec embedded."""
    example = example_batch(spec["image_size"])
    extra = {META_NAME: json.dumps(spec)}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about Python control flow on shapes
        if fmt == "torchscript":
            traced = torch.jit.trace(embedder, example, check_trace=False)
            torch.jit.save(traced, path, _extra_files=extra)
            return
        batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
        try:
            program = torch.export.export(embedder, (example,), dynamic_shapes=({0: batch},), strict=False)
        except Exception as exc:
            raise ExportError(
                f"{spec['name']}: torch.export failed ({type(exc).__name__}: {str(exc)[:300]}); "
                "try --format torchscript"
            ) from None
        torch.export.save(program, path, extra_files=extra)


@dataclass(frozen=True)
class Check:
    """The exported file against the eager model on one batch (loaded the way the worker loads it)."""

    batch: int
    max_abs_diff: float  # raw outputs
    max_abs_diff_normalized: float  # L2-normalized, as the worker writes them


def check(embedder: Embedder, path: str, image_size: int, n: int = 3) -> Check:
    """Run the file through gpu_worker.models.load.load_model and the eager model on the same batch.

    The batch size differs from the one used to trace / export, so a batch size baked into
    the file shows up here and not in the worker.
    """
    from gpu_worker.models.load import load_model

    x = example_batch(image_size, n=n, seed=1)
    loaded, _ = load_model(path, image_size)
    with torch.no_grad():
        want = embedder(x).float()
        got = loaded(x)
    if isinstance(got, tuple | list):
        got = got[0]
    got = got.float().flatten(1)
    if got.shape != want.shape:
        raise ExportError(f"exported model returns {tuple(got.shape)} for a batch of {n}; eager: {tuple(want.shape)}")
    norm = torch.nn.functional.normalize
    return Check(
        batch=n,
        max_abs_diff=float((got - want).abs().max()),
        max_abs_diff_normalized=float((norm(got, dim=1) - norm(want, dim=1)).abs().max()),
    )


def write_local(src: Source, fmt: str, path: str) -> tuple[dict[str, Any], Check]:
    """Export `src` to the local file `path` (+ `path`.json) and check it; returns (spec, check)."""
    embedder = Embedder(src.module).eval()
    with torch.no_grad():
        output_dim = int(embedder(example_batch(src.image_size)).shape[1])
    spec = build_spec(src, fmt, output_dim, weights_sha256(src.module))
    spec["precision"], spec["bf16_min_cosine"] = precision(embedder, src.image_size)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".export-", suffix=".pt2" if fmt == "pt2" else ".pt")
    os.close(fd)
    try:
        save(embedder, fmt, tmp, spec)
        result = check(embedder, tmp, src.image_size)
        if result.max_abs_diff_normalized > TOLERANCE:
            raise ExportError(
                f"{src.name}: the exported file differs from the eager model by {result.max_abs_diff_normalized:.2e} "
                f"(normalized embeddings; tolerance {TOLERANCE:g})"
            )
        umask = os.umask(0o022)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as its .json and any file written with open(): mkstemp made it 0600
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    with open(path + ".json", "w") as fh:
        json.dump(spec, fh, indent=2)
    return spec, result
