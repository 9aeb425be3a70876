"""Benchmark the search index (sluice.index) against an exact FAISS index over the same vectors.

    .venv/bin/python bench/index.py                          # 200,000 x 256-d float16, 200 queries
    .venv/bin/python bench/index.py --rows 1000000 --dim 256 # the figure per million, when time allows
    .venv/bin/python bench/index.py --workers 2              # the single build against --workers 2

The vectors are clustered unit vectors (as image embeddings are: many near-duplicates around
topics), written as a run's output the way the GPU worker writes it (Parquet chunks of 5,000
rows and their commit markers, tests/index_support.write_run). The queries are drawn from the
same topics but are not in the data (unseen).

Ours: `sluice index build` of the run (sluice.index.build: the merge into a Lance table, the
IVF-PQ index, the key index), then searches with exact re-ranking (sluice.index.search).
Baseline: FAISS IndexFlatIP (exact inner product, the vectors as float32 in memory), built
from the same Parquet files. Each side runs in a fresh process (its peak RSS is its own), one
after the other. Recall@10 is ours against the baseline's exact top 10. Single-query latency
is one query at a time; batched is --batch queries in one call (ours: sluice.index's thread
pool; FAISS: one search call), reported per query.

--workers N compares, in one run on the same vectors, the single build and the distributed
build's three steps on this machine (sluice.index.fleet.build: train in the parent, N spawned
segment processes, commit in the parent), each side in a fresh process: build time (and each
step's), peak RSS of the single build's process, of the distributed build's parent and of
each segment worker (VmHWM, read by each process itself), recall@10 of both against the
exact top 10 (FAISS flat IP), single-query p50/p99.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.index_support import clustered, uris, write_run  # noqa: E402


def _rss_mb() -> float:
    """This process's peak RSS (VmHWM: ru_maxrss would count the parent's, kept across exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _latencies(fn: Any, queries: np.ndarray, batch: int) -> dict[str, float]:
    single = []
    for q in queries:
        t = time.perf_counter()
        fn(q[None, :])
        single.append((time.perf_counter() - t) * 1000)
    t = time.perf_counter()
    for i in range(0, len(queries), batch):
        fn(queries[i : i + batch])
    total = (time.perf_counter() - t) * 1000
    return {
        "p50_ms": float(np.percentile(single, 50)),
        "p99_ms": float(np.percentile(single, 99)),
        "batched_ms_per_query": total / len(queries),
    }


def ours(run: str, index: str, queries: np.ndarray, k: int, batch: int) -> dict[str, Any]:
    from sluice.index.build import build
    from sluice.index.search import Searcher

    t = time.perf_counter()
    report = build([run], index)
    build_s = time.perf_counter() - t
    searcher = Searcher.open(index)
    found = [[h.key for h in hits] for hits in searcher.search(queries, k)]
    lat = _latencies(lambda q: searcher.search(q, k), queries, batch)
    [table] = report.tables
    return {
        "build_s": build_s,
        "merge_s": table.merge_s,
        "index_s": table.index_s,
        "rss_mb": _rss_mb(),
        "found": found,
        "ann": report.ann,
        "probe": searcher.probe,
        **lat,
    }


def fleet(run: str, index: str, queries: np.ndarray, k: int, batch: int, workers: int) -> dict[str, Any]:
    """The distributed build's steps as `sluice index build --workers N` runs them, each timed."""
    from sluice.index.fleet.build import commit, train
    from sluice.index.fleet.workers import run_children
    from sluice.index.search import Searcher

    t = time.perf_counter()
    plan = train([run], index, "bench", workers)
    trained = time.perf_counter()
    run_children(index + "/", "bench", workers)
    segmented = time.perf_counter()
    report = commit(plan)
    done = time.perf_counter()
    searcher = Searcher.open(index)
    found = [[h.key for h in hits] for hits in searcher.search(queries, k)]
    lat = _latencies(lambda q: searcher.search(q, k), queries, batch)
    steps = {"train_s": trained - t, "segments_s": segmented - trained, "commit_s": done - segmented}
    return {"build_s": done - t, "rss_mb": _rss_mb(), "found": found, "children": report.children, **steps, **lat}


def faiss_exact(run: str, queries: np.ndarray, k: int, batch: int) -> dict[str, Any]:
    import faiss
    import pyarrow.parquet as pq

    t = time.perf_counter()
    files = sorted(str(p) for p in Path(run).rglob("part-*.parquet"))
    keys: list[str] = []
    index = None
    for f in files:
        table = pq.read_table(f, columns=["key", "embedding"])
        emb = table["embedding"].combine_chunks()
        x = np.asarray(emb.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(emb), -1)
        index = index or faiss.IndexFlatIP(x.shape[1])
        index.add(x)
        keys += table["key"].to_pylist()
    build_s = time.perf_counter() - t
    assert index is not None
    _, ids = index.search(queries, k)
    found = [[keys[i] for i in row] for row in ids]
    lat = _latencies(lambda q: index.search(q, k), queries, batch)
    return {"build_s": build_s, "rss_mb": _rss_mb(), "found": found, **lat}


def _child(fn: Any, args: tuple[Any, ...], out: Any) -> None:
    out.put(fn(*args))


def isolated(fn: Any, *args: Any) -> dict[str, Any]:
    """fn(*args) in a fresh process (spawn): its own imports, its own peak RSS."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, args, q))
    p.start()
    result = q.get()
    p.join()
    return dict(result)


def recall(found: list[list[str]], truth: list[list[str]]) -> float:
    return sum(len(set(f) & set(t)) for f, t in zip(found, truth)) / sum(len(t) for t in truth)


def table(o: dict[str, Any], f: dict[str, Any], rows: int) -> str:
    per_m = 1e6 / rows
    lines = [
        f"{'':34} {'ours (Lance ' + o['ann'] + ')':>24} {'FAISS exact (flat IP)':>22} {'ours/FAISS':>11}",
        *(
            f"{name:34} {o[key] * scale:>24.{dp}f} {f[key] * scale:>22.{dp}f} {o[key] / f[key]:>10.2f}x"
            for name, key, scale, dp in [
                ("build s", "build_s", 1, 1),
                ("build s per 1M vectors", "build_s", per_m, 1),
                ("peak RSS MB", "rss_mb", 1, 0),
                ("query p50 ms (one at a time)", "p50_ms", 1, 2),
                ("query p99 ms (one at a time)", "p99_ms", 1, 2),
                ("batched ms per query", "batched_ms_per_query", 1, 3),
            ]
        ),
        f"{'recall@10 vs exact':34} {o['recall']:>24.4f} {1.0:>22.4f}",
        f"ours: merge {o['merge_s']:.1f} s + ANN/key index {o['index_s']:.1f} s; search {o['probe']}",
    ]
    return "\n".join(lines)


def fleet_table(o: dict[str, Any], w: dict[str, Any], rows: int, workers: int) -> str:
    """The single build against the --workers build: each figure and the ratio."""
    per_m = 1e6 / rows
    child_rss = max(c["peak_rss_mb"] for c in w["children"])
    lines = [
        f"{'':34} {'single build':>14} {f'--workers {workers}':>14} {'workers/single':>15}",
        *(
            f"{name:34} {a * scale:>14.{dp}f} {b * scale:>14.{dp}f} {b / a:>14.2f}x"
            for name, a, b, scale, dp in [
                ("build s", o["build_s"], w["build_s"], 1, 1),
                ("build s per 1M vectors", o["build_s"], w["build_s"], per_m, 1),
                ("peak RSS MB (a worker's, max)", o["rss_mb"], child_rss, 1, 0),
                ("peak RSS MB (the parent's)", o["rss_mb"], w["rss_mb"], 1, 0),
                ("query p50 ms (one at a time)", o["p50_ms"], w["p50_ms"], 1, 2),
                ("query p99 ms (one at a time)", o["p99_ms"], w["p99_ms"], 1, 2),
            ]
        ),
        f"{'recall@10 vs exact':34} {o['recall']:>14.4f} {w['recall']:>14.4f} {w['recall'] - o['recall']:>+14.4f}",
        f"single: merge {o['merge_s']:.1f} s + ANN/key index {o['index_s']:.1f} s",
        f"--workers {workers}: train (merge, split, k-means) {w['train_s']:.1f} s, segments {w['segments_s']:.1f} s, "
        f"commit {w['commit_s']:.1f} s",
        *(
            f"  worker {c['child']}: {c['rows']:,} rows in {c['seconds']:.1f} s, peak RSS {c['peak_rss_mb']:.0f} MB"
            for c in w["children"]
        ),
    ]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--centers", type=int, default=2_000, help="topics the vectors cluster around")
    p.add_argument("--dir", help="work folder (default: a temporary one, removed after)")
    p.add_argument("--workers", type=int, default=1, help="N > 1: compare the single build with --workers N")
    args = p.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="sluice-bench-index-"))
    try:
        t = time.perf_counter()
        x = clustered(args.rows, args.dim, 1, centers=args.centers)
        queries = clustered(args.queries, args.dim, 2, centers=args.centers)  # unseen: another draw
        write_run(str(work / "runs"), "bench", uris(args.rows), x, chunk_keys=5_000, shards=4)
        del x
        print(f"{args.rows:,} x {args.dim}-d float16 written as a run in {time.perf_counter() - t:.1f} s", flush=True)
        run = str(work / "runs" / "bench")
        o = isolated(ours, run, str(work / "index"), queries, args.k, args.batch)
        print(f"single build: {o['build_s']:.1f} s, peak RSS {o['rss_mb']:.0f} MB", flush=True)
        w = None
        if args.workers > 1:
            w = isolated(fleet, run, str(work / "index-workers"), queries, args.k, args.batch, args.workers)
            print(f"--workers {args.workers} build: {w['build_s']:.1f} s", flush=True)
        f = isolated(faiss_exact, run, queries, args.k, args.batch)
        o["recall"] = recall(o["found"], f["found"])
        print(
            f"\n{args.rows:,} vectors, {args.dim}-d, {args.queries} unseen queries, k={args.k}, "
            f"batch {args.batch}, {os.cpu_count()} CPUs\n"
        )
        if w is not None:
            w["recall"] = recall(w["found"], f["found"])
            print(fleet_table(o, w, args.rows, args.workers))
        else:
            print(table(o, f, args.rows))
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
