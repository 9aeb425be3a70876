"""Benchmark text runs: chunks/s and tokens/s per core, end to end (a rank's parts pass) vs model-only.

    .venv/bin/python bench/text.py                        # 400 texts (every tenth a long report), 1 core
    .venv/bin/python bench/text.py --texts 2000 --threads 2 --chunk-tokens 128

Ours, end to end: gpu_worker.passes.parts.PartsStream as a rank runs it, from object bytes to
committed Parquet chunks: decode, tokenize and chunk in the fetch threads, embed in batches of
--batch chunks, sink a key's rows together, commit chunks with their markers (to a local
folder; the bytes come from memory, so S3 is not measured). Baseline, model-only: the same
chunks, already tokenized, through the same model in the same batches: the ceiling the
pipeline could reach. Torch runs --threads threads (per core = / threads). Best of --repeat.
Printed: chunks, tokens, seconds, chunks/s and tokens/s per core for each, and end to end /
model-only (1.00: the pipeline costs nothing on top of the model).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_worker.config import WorkerConfig
from gpu_worker.kinds.base import Loading
from gpu_worker.kinds.textmodel import load_text
from gpu_worker.output import intervals
from gpu_worker.output.commits import Paths
from gpu_worker.output.parquet import RecordLabel
from gpu_worker.output.sink import ChunkSink, SinkSpec
from gpu_worker.passes.base import KeySinks
from gpu_worker.passes.parts import PartsStream
from gpu_worker.sources.store import RunStore
from gpu_worker.telemetry.stats import Stats
from sluice.local.demo import demo_texts
from sluice.models import ContentSpec, ModelSpec, PlannedModel


class MemoryFetcher:
    """Object bytes from a dict: the pipeline without S3."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def get(self, bucket: str, key: str, *, final: bool = False) -> bytes:
        return self.objects[key]


def _loading(args: argparse.Namespace) -> Loading:
    planned = PlannedModel.of(ModelSpec(uri="builtin:reference-text", name="reference-text"))
    content = ContentSpec(kind="text", chunk_tokens=args.chunk_tokens, overlap_tokens=args.overlap_tokens)
    return Loading("builtin:reference-text", planned, content, "cpu", args.batch, WorkerConfig.model_validate({}))


def _sink(root: str, n: int, dim: int) -> ChunkSink:
    spec = SinkSpec(
        rank=0,
        attempt=1,
        windows=intervals.cut([(0, n)], 256),
        chunk_keys=256,
        dtype="float16",
        metadata={"model": "builtin:reference-text", "dim": str(dim)},
        label=RecordLabel("reference-text", "", "builtin:reference-text@1", "bench"),
    )
    return ChunkSink(RunStore(), Paths.for_shard(root + "/output/", root + "/failures/", root + "/shards/", 0), spec)


def end_to_end(args: argparse.Namespace, objects: dict[str, bytes]) -> tuple[float, int, int]:
    """(seconds, chunks, tokens) of one parts pass over `objects`."""
    embedder = load_text(_loading(args))
    root = tempfile.mkdtemp(prefix="sluice-bench-text-")
    try:
        stats = Stats()
        cfg = WorkerConfig.model_validate({}).replace(fetch_concurrency=args.fetch_threads)
        outputs = KeySinks([_sink(root, len(objects), embedder.output_dim)], stats)
        items = [(i, "bench", key, 0) for i, key in enumerate(objects)]
        t0 = time.perf_counter()
        PartsStream(cfg, [embedder], outputs, args.batch).run(items, MemoryFetcher(objects))
        outputs.finish(ok=True)
        took = time.perf_counter() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    chunks = int(stats.get("parts"))
    tokens = sum(len(p.payload.ids) for data in objects.values() for p in embedder.split(data))
    return took, chunks, tokens


def model_only(args: argparse.Namespace, objects: dict[str, bytes]) -> tuple[float, int, int]:
    """(seconds, chunks, tokens) of the model alone over the same chunks, tokenized beforehand."""
    embedder = load_text(_loading(args))
    chunks = [p.payload for data in objects.values() for p in embedder.split(data)]
    t0 = time.perf_counter()
    for i in range(0, len(chunks), args.batch):
        embedder.embed(chunks[i : i + args.batch])
    return time.perf_counter() - t0, len(chunks), sum(len(c.ids) for c in chunks)


def best(fn: object, args: argparse.Namespace, objects: dict[str, bytes]) -> tuple[float, int, int]:
    runs = [fn(args, objects) for _ in range(args.repeat)]  # type: ignore[operator]
    return min(runs, key=lambda r: r[0])


def table(rows: Sequence[tuple[str, float, int, int]], threads: int) -> list[str]:
    out = [f"{'':<12} {'chunks':>8} {'tokens':>10} {'seconds':>8} {'chunks/s/core':>14} {'tokens/s/core':>14}"]
    for name, s, c, t in rows:
        out.append(f"{name:<12} {c:>8} {t:>10} {s:>8.2f} {c / s / threads:>14.1f} {t / s / threads:>14.0f}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=400)
    p.add_argument("--threads", type=int, default=1, help="torch threads (cores)")
    p.add_argument("--fetch-threads", type=int, default=4, help="split threads of the parts pass")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--chunk-tokens", type=int, default=256)
    p.add_argument("--overlap-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    objects = {key: data for key, data in demo_texts(args.texts)}
    size = sum(len(v) for v in objects.values())
    print(f"{len(objects)} texts, {size / 2**20:.1f} MiB, chunk {args.chunk_tokens} overlap {args.overlap_tokens}")
    ours = best(end_to_end, args, objects)
    base = best(model_only, args, objects)
    for line in table([("end to end", *ours), ("model-only", *base)], args.threads):
        print(line)
    print(f"end to end / model-only: {base[0] / ours[0]:.2f} (chunks/s ratio; 1.00 = no pipeline overhead)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
