"""Index tests' data: clustered unit vectors, written as a run's output the way the worker writes it.

The Parquet bytes come from the worker's own writer (gpu_worker.output.parquet) and the
commit markers from gpu_worker.output.commits, so the index reads exactly what runs leave behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_worker.output.commits import Marker, Paths
from gpu_worker.output.parquet import RecordLabel, output_table, table_bytes
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.contracts.sections import ModelSpec
from sluice.paths import join
from tests.plans import run_plan


def parquet_bytes(
    uris: list[str], emb: np.ndarray, dtype: str, metadata: dict[str, str], objs: list[Any], label: RecordLabel
) -> bytes:
    """One output file of one-part keys (images), as a worker writes it: a row per key (sluice.outputs)."""
    return table_bytes(output_table(uris, emb, dtype, objs, label), metadata)


def clustered(n: int, dim: int, seed: int, *, centers: int = 500, noise: float = 0.35, center_seed: int = 7):
    """n unit vectors around `centers` random directions (the same directions for every seed)."""
    c = np.random.default_rng(center_seed).standard_normal((centers, dim)).astype(np.float32)
    rng = np.random.default_rng(seed)
    x = c[rng.integers(0, centers, n)] + noise * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Indexes of the k most similar rows for each query (the ground truth)."""
    scores = queries @ vectors.astype(np.float32).T
    return np.argsort(-scores, axis=1)[:, :k]


def recall_at(found: list[list[str]], truth: np.ndarray, keys: list[str]) -> float:
    hits = sum(len(set(f) & {keys[i] for i in t}) for f, t in zip(found, truth))
    return hits / truth.size


@dataclass(frozen=True)
class Chunk:
    keys: list[str]
    vectors: np.ndarray
    committed: bool = True


def write_run(
    base: str,
    run_id: str,
    keys: list[str],
    vectors: np.ndarray,
    *,
    models: list[ModelSpec] | None = None,
    per_model: dict[str, np.ndarray] | None = None,
    dtype: str = "float16",
    chunk_keys: int = 5_000,
    shards: int = 2,
    created_at: str = "2026-01-01T00:00:00+00:00",
    lineage: list[str] | None = None,
    uncommitted: int = 0,
    model_ids: list[str] | None = None,
) -> RunPlan:
    """A run at `base` (<base>/<run>/: plan.json, output/...): `keys` split over shards and chunks.

    `uncommitted`: that many extra rows (keys "uncommitted-<i>") go into a chunk without a marker
    in shard 0, as a killed attempt leaves them. `per_model`: model name -> vectors, for several models.
    """
    root = join(base, run_id + "/")
    specs = models or [ModelSpec()]
    plan = run_plan(
        run_id,
        root,
        n_shards=shards,
        total_keys=len(keys),
        model=specs if len(specs) > 1 else specs[0],
        model_ids=model_ids,  # the identity a planner resolves (a local file's sha256, an S3 object's ETag)
        created_at=created_at,
        lineage=lineage or [],
        output={"dtype": dtype},
    )
    store = ObjectStore()
    store.put(plan.output_prefix.rsplit("output/", 1)[0] + "plan.json", plan.model_dump_json().encode())
    bounds = np.linspace(0, len(keys), shards + 1).astype(int)
    for m, pm in enumerate(plan.models):
        vecs = per_model[pm.name] if per_model else vectors
        label = RecordLabel(pm.name, "", pm.model_id, run_id)
        for s in range(shards):
            paths = Paths.for_shard(plan.model_output_prefix(m), plan.failures_prefix, plan.shards_prefix, s)
            lo, hi = int(bounds[s]), int(bounds[s + 1])
            for first in range(lo, hi, chunk_keys):
                last = min(hi, first + chunk_keys)
                _chunk(store, paths, first - lo, keys[first:last], vecs[first:last], dtype, label, run_id)
        if uncommitted:
            paths = Paths.for_shard(plan.model_output_prefix(m), plan.failures_prefix, plan.shards_prefix, 0)
            extra = [f"s3://images/uncommitted-{i}.jpg" for i in range(uncommitted)]
            name = paths.chunk_name(1, 999_999_000, 2)
            data = parquet_bytes(extra, vecs[:uncommitted], dtype, {"run": run_id}, _objs(extra), label)
            store.put(paths.parquet(name), data)  # no marker: a killed attempt's leftover
    return plan


def _objs(keys: list[str]) -> list[tuple[str, str | None, int]]:
    return [(f"etag{abs(hash(k)) % 10**8}", None, 1000 + i) for i, k in enumerate(keys)]


def _chunk(store, paths, pos, keys, vecs, dtype, label, run_id) -> None:
    name = paths.chunk_name(0, pos)
    data = parquet_bytes(keys, vecs, dtype, {"run": run_id}, _objs(keys), label)
    store.put(paths.parquet(name), data)
    marker = Marker(name, "range", len(keys), [(pos, pos + len(keys))], [], [], 1, 0, name + ".parquet")
    store.put(paths.marker(name), marker.to_json())


def uris(n: int, prefix: str = "img") -> list[str]:
    return [f"s3://images/{prefix}-{i:07d}.jpg" for i in range(n)]
