"""Benchmark an incremental run's prepare stage (input.since_run) against a full prepare of the same input.

    .venv/bin/python bench/incremental.py                         # 200,000 keys, 5% changed, 5% new
    .venv/bin/python bench/incremental.py --keys 50000 --changed 0.1 --new 0 --dim 64

An earlier run ("full-a") embedded all N keys with one model: its output is written as the GPU
worker writes it (sluice.outputs.arrow_schema, 512-d float16 by default, 2,048 rows a Parquet
chunk, a commit marker after each) to a moto S3 server (sluice.local.emulator.server.MotoServer, a
subprocess, as the integration tests use). The current input is an S3 Inventory report (gzip
CSV with Bucket, Key, ETag; one data file per map worker) naming the N keys, a fraction
--changed of them with another ETag, plus a fraction --new of new keys.

Why an inventory and not a prefix: the prepare stage lists a prefix only on S3, and moto's
ListObjectsV2 scans and sorts the whole bucket for every 1,000-key page (minutes at 200,000
objects, all of it moto's own time). An inventory names each key's ETag as a listing does: no
HEAD either way (docs/incremental.md). A key list would cost one HEAD per key.

Ours: the incremental prepare (map: the inventory's versions plus the earlier output's version
columns by ranged GETs; reduce: the anti-join, shards of only the keys to embed; then the
submit step's placement of the staged shards, sluice.prepare.reducer.versions.place_shards).
Baseline: the same input prepared without since_run, which sends every key to the GPUs. Both
run the real run_map / run_reduce, one fresh process per worker (its peak RSS is its own), at
most one per CPU at a time, against the same server. The spec is built here as the manifest
Lambda builds it (sluice.control.intake.route._incremental: workers, partitions, the earlier output
as tasks via sluice.control.intake.lineage.Lineage); the Lambda's checks of the earlier run
(ledger, plan) are not run. The bench checks the result (the skipped count and the exact set
of keys in the shards) and prints FAIL and exits 1 when it is wrong.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
import math
import os
import sys
import time
import zlib
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import InventoryFiles, PrepareSpec
from sluice.contracts.sections import ModelSpec
from sluice.control.intake.lineage import EarlierRun, Lineage
from sluice.local.emulator.server import MotoServer
from sluice.outputs import arrow_schema
from sluice.paths import RunPaths, shard_output_dir
from sluice.plan.dedup import MAX_POSITIONS
from sluice.preflight import Capacity
from sluice.prepare import prepare_store
from sluice.prepare.collect import Collected, collect
from sluice.prepare.reducer.versions import place_shards
from sluice.prepare.split import PARTITION_FACTOR, choose_partitions
from sluice.shards import ShardReader
from tests.integration.incremental_support import earlier_plan, md5

IMAGES, CONTROL = "bench-images", "bench-control"
COLUMNS = ["Bucket", "Key", "ETag"]
MODEL = ModelSpec(uri="builtin:reference-cnn")
MODEL_ID = "builtin:reference-cnn@1"
KEYS_PER_SHARD = 10_000
ROWS_PER_CHUNK = 2_048  # what a GPU worker writes per Parquet chunk (docs/incremental.md)


class Requests:
    """S3 API calls made through a client, by operation (botocore's before-call event: retries not counted)."""

    def __init__(self, client: Any) -> None:
        self.counts: Counter[str] = Counter()
        client.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        self.counts[model.name] += 1


def _counted_store() -> tuple[ObjectStore, Requests]:
    store = prepare_store()  # sluice.aws.clients.client: AWS_ENDPOINT_URL (the moto server) from the environment
    return store, Requests(store.s3)


def _map_child(spec_uri: str, worker: int) -> tuple[float, dict[str, int]]:
    from sluice.prepare.__main__ import load_spec
    from sluice.prepare.mapper.worker import run_map

    cpu, (store, req) = time.process_time(), _counted_store()
    run_map(load_spec(store, spec_uri), worker, store)
    return time.process_time() - cpu, dict(req.counts)


def _reduce_child(spec_uri: str, partition: int) -> tuple[float, dict[str, int]]:
    from sluice.prepare.__main__ import load_spec
    from sluice.prepare.reducer.worker import run_reduce

    cpu, (store, req) = time.process_time(), _counted_store()
    run_reduce(load_spec(store, spec_uri), partition, store)
    return time.process_time() - cpu, dict(req.counts)


def _run_all(fn: Any, spec_uri: str, n: int) -> list[tuple[float, dict[str, int]]]:
    """As sluice.prepare.offline._run_all: a fresh process per worker, at most one per CPU at once."""
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(["sluice.prepare.mapper.worker", "sluice.prepare.reducer.worker"])
    with ProcessPoolExecutor(max(1, min(n, os.cpu_count() or 1)), mp_context=ctx, max_tasks_per_child=1) as pool:
        return list(pool.map(fn, [spec_uri] * n, range(n)))


def _warm(spec_uri: str, i: int) -> tuple[float, dict[str, int]]:
    return 0.0, {}


def key_of(i: int) -> str:
    h = hashlib.blake2b(i.to_bytes(8, "little"), digest_size=10).hexdigest()
    return f"photos/{h[:2]}/{h}.jpg"


def etag_of(key: str, version: str) -> str:
    return md5(f"{key}:{version}".encode())


def chunk_bytes(rows: list[tuple[str, str]], dim: int, rng: np.random.Generator) -> bytes:
    """One committed output chunk of run full-a, as the worker writes it (cf. tests/integration/incremental_support)."""
    n = len(rows)
    emb = rng.standard_normal((n, dim), dtype=np.float32).astype(np.float16)
    table = pa.table(
        {
            "key": pa.array([f"s3://{IMAGES}/{k}" for k, _ in rows], pa.string()),
            "part": pa.array([0] * n, pa.int32()),
            "part_start": pa.array([0.0] * n),
            "part_end": pa.array([0.0] * n),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim),
            "model": pa.array(["reference-cnn"] * n).dictionary_encode(),
            "model_version": pa.array([""] * n).dictionary_encode(),
            "model_id": pa.array([MODEL_ID] * n).dictionary_encode(),
            "etag": pa.array([e for _, e in rows], pa.string()),
            "version_id": pa.array([None] * n, pa.string()),
            "size": pa.array([100_000] * n, pa.int64()),
            "run": pa.array(["full-a"] * n).dictionary_encode(),
        }
    ).cast(arrow_schema(dim, "float16"))
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def write_earlier(s3: Any, keys: list[str], dim: int) -> tuple[EarlierRun, int, int]:
    """Run full-a's plan and committed output (every key, version v1); returns (run, chunks, bytes)."""
    n_shards = math.ceil(len(keys) / KEYS_PER_SHARD)
    plan = earlier_plan(
        "full-a",
        RunPaths.in_bucket(CONTROL, "full-a").root,
        [(MODEL, MODEL_ID)],
        n_shards=n_shards,
        total_keys=len(keys),
    )
    s3.put_object(Bucket=CONTROL, Key="runs/full-a/plan.json", Body=plan.model_dump_json().encode())
    jobs = []
    for shard in range(n_shards):
        mine = keys[shard * KEYS_PER_SHARD : (shard + 1) * KEYS_PER_SHARD]
        d = shard_output_dir(plan.model_output_prefix(0), shard).removeprefix(f"s3://{CONTROL}/")
        for c in range(0, len(mine), ROWS_PER_CHUNK):
            jobs.append((d, f"part-0000-{c:09d}", [(k, etag_of(k, "v1")) for k in mine[c : c + ROWS_PER_CHUNK]]))

    def put(job: tuple[str, str, list[tuple[str, str]]]) -> int:
        d, name, rows = job
        data = chunk_bytes(rows, dim, np.random.default_rng(zlib.crc32(f"{d}{name}".encode())))
        s3.put_object(Bucket=CONTROL, Key=f"{d}{name}.parquet", Body=data)
        marker = {"version": 1, "name": name, "kind": "range", "file": name + ".parquet", "rows": len(rows)}
        s3.put_object(Bucket=CONTROL, Key=f"{d}_commits/{name}.json", Body=json.dumps(marker).encode())
        return len(data)

    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(put, jobs))
    return EarlierRun("full-a", plan, n_shards), len(jobs), sum(sizes)


def write_inventory(s3: Any, rows: list[tuple[str, str]], files: int) -> list[str]:
    """The current input as an inventory's gzip CSV data files (Bucket, Key, ETag); returns their keys."""
    names = []
    for f in range(files):
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL).writerows((IMAGES, k, e) for k, e in rows[f::files])
        name = f"inventory/{IMAGES}/data/{f:04d}.csv.gz"
        s3.put_object(Bucket=CONTROL, Key=name, Body=gzip.compress(buf.getvalue().encode()))
        names.append(name)
    return names


def run_prepare(spec: PrepareSpec) -> dict[str, Any]:
    """The prepare stage of `spec`, timed: maps, reduces, collect, and (incremental) the shards' placement."""
    store, req = _counted_store()
    paths = RunPaths(spec.root)
    store.put(paths.prepare_spec, spec.model_dump_json().encode())
    t0 = time.monotonic()
    maps = _run_all(_map_child, paths.prepare_spec, spec.workers)
    t1 = time.monotonic()
    reduces = _run_all(_reduce_child, paths.prepare_spec, spec.partitions)
    t2 = time.monotonic()
    got: Collected = collect(spec, store)
    if got.rejected:
        raise SystemExit(f"FAIL: the prepare stage rejected the run: {got.rejected}")
    if got.pieces:  # the submit step numbers the staged shards and copies them to shards/<i>.shard
        place_shards(spec, got.pieces, store)
    seconds = time.monotonic() - t0
    requests: Counter[str] = Counter(req.counts)
    requests["PutObject"] -= 1  # the spec, written before the clock starts
    for _, c in maps + reduces:
        requests.update(c)
    return {
        "got": got,
        "seconds": seconds,
        "map_wall": t1 - t0,
        "reduce_wall": t2 - t1,
        "map_cpu": max(c for c, _ in maps),
        "reduce_cpu": max(c for c, _ in reduces),
        "requests": requests,
    }


def shard_keys(spec: PrepareSpec, n_shards: int) -> list[str]:
    """Every key in the run's shards/ (read after the clock, through an uncounted client)."""
    store, paths, out = prepare_store(), RunPaths(spec.root), []
    for i in range(n_shards):
        for _, keys in ShardReader(store.get(paths.shard(i))).groups():
            out += keys
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=200_000, help="N: keys of the earlier run, all embedded")
    p.add_argument("--changed", type=float, default=0.05, help="fraction of the N keys with another ETag now")
    p.add_argument("--new", type=float, default=0.05, help="new keys, as a fraction of N")
    p.add_argument("--dim", type=int, default=512, help="embedding size of the earlier output (float16)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="map workers (default: CPUs)")
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args(argv)
    n, workers = args.keys, args.workers
    n_changed, n_new = round(n * args.changed), round(n * args.new)
    rnd = np.random.default_rng(args.seed)
    changed = set(rnd.choice(n, n_changed, replace=False).tolist()) if n_changed else set()
    keys = [key_of(i) for i in range(n)]
    new_keys = [key_of(n + i) for i in range(n_new)]
    current = [(k, etag_of(k, "v2" if i in changed else "v1")) for i, k in enumerate(keys)]
    current += [(k, etag_of(k, "v1")) for k in new_keys]
    want_embed = sorted([keys[i] for i in changed] + new_keys)

    server = MotoServer().start()
    os.environ.update(server.env)  # the forkserver and its workers inherit it
    try:
        s3 = prepare_store().s3
        for b in (IMAGES, CONTROL):
            s3.create_bucket(Bucket=b)
        t = time.monotonic()
        earlier, chunks, earlier_bytes = write_earlier(s3, keys, args.dim)
        inv = write_inventory(s3, current, workers)
        print(
            f"wrote run full-a's output ({n:,} rows of {args.dim}-d float16, {chunks} chunks, "
            f"{earlier_bytes / 2**20:.0f} MiB) and the inventory ({len(current):,} rows) in "
            f"{time.monotonic() - t:.0f} s",
            file=sys.stderr,
        )

        def spec(run_id: str, incremental: bool) -> PrepareSpec:
            load = max(len(current), n) if incremental else len(current)
            extra: dict[str, Any] = {}
            if incremental:  # as sluice.control.intake.route._incremental builds it
                extra = {
                    "since_run": "full-a",
                    "lineage": ["full-a"],
                    "model_ids": [MODEL_ID],
                    "earlier": Lineage([earlier]).tasks([MODEL_ID], workers),
                }
            return PrepareSpec(
                run_id=run_id,
                manifest_uri=f"s3://{CONTROL}/manifests/{run_id}.json",
                root=RunPaths.in_bucket(CONTROL, run_id).root,
                workers=workers,
                partitions=choose_partitions(load * PARTITION_FACTOR if incremental else load),
                keys_per_shard=KEYS_PER_SHARD,
                max_keys=MAX_POSITIONS - 1,
                input_keys_estimate=len(current),
                tasks=[InventoryFiles(bucket=CONTROL, keys=[k], format="CSV", columns=COLUMNS) for k in inv],
                **extra,
            )

        base_spec, ours_spec = spec("full-b", False), spec("inc-b", True)
        _run_all(_warm, "", workers)  # start the forkserver before either clock
        base = run_prepare(base_spec)
        print(f"baseline: {base['seconds']:.1f} s", file=sys.stderr)
        ours = run_prepare(ours_spec)
        print(f"incremental: {ours['seconds']:.1f} s", file=sys.stderr)

        bg, og = base["got"], ours["got"]
        skipped = og.skipped.get("unchanged", -1)
        problems = []
        if skipped != n - n_changed:
            problems.append(f"skipped {skipped:,}, expected N x (1 - changed) = {n - n_changed:,}")
        if sorted(shard_keys(ours_spec, og.n_shards)) != want_embed:
            problems.append("the incremental shards do not hold exactly the changed and new keys")
        if bg.unique_keys != len(current) or len(shard_keys(base_spec, bg.n_shards)) != len(current):
            problems.append(f"the baseline's shards hold {bg.unique_keys:,} keys, expected {len(current):,}")
        if og.versions.get("heads", 0) or og.versions.get("listed", 0) != len(current):
            problems.append(f"version counts {og.versions}: expected every current version from the inventory")
        if problems:
            print("FAIL: " + "; ".join(problems))
            return 1
    finally:
        server.stop()

    def row(name: str, a: Any, b: Any, ratio: str = "") -> None:
        print(f"| {name} | {a} | {b} | {ratio} |")

    def r(a: float, b: float) -> str:
        return f"**{a / b:.3f}**" if b else "-"

    oreq, breq = sum(ours["requests"].values()), sum(base["requests"].values())
    print(
        f"\nmachine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; N = {n:,}, changed {args.changed:g}, "
        f"new {args.new:g}, earlier output {args.dim}-d float16 ({chunks} chunks, {earlier_bytes / 2**20:.0f} MiB), "
        f"input: inventory CSV ({workers} data files), S3: moto server on this machine\n"
    )
    print("| | ours (incremental) | baseline (full prepare) | ours / baseline |")
    print("|---|---:|---:|---:|")
    row("keys in input", f"{og.keys_in:,}", f"{bg.keys_in:,}")
    row("earlier rows read", f"{og.versions.get('earlier_rows', 0):,}", "0")
    row("keys skipped (unchanged)", f"{skipped:,}", "0")
    row("keys to embed (sent to GPUs)", f"{og.unique_keys:,}", f"{bg.unique_keys:,}", r(og.unique_keys, bg.unique_keys))
    row("shards", f"{og.n_shards:,}", f"{bg.n_shards:,}", r(og.n_shards, bg.n_shards))
    row(
        "map x reduce workers",
        f"{ours_spec.workers} x {ours_spec.partitions}",
        f"{base_spec.workers} x {base_spec.partitions}",
    )
    row(
        "prepare wall s (map + reduce + collect/place)",
        f"{ours['seconds']:.2f}",
        f"{base['seconds']:.2f}",
        r(ours["seconds"], base["seconds"]),
    )
    row(
        "map wall s / busiest worker CPU s",
        f"{ours['map_wall']:.2f} / {ours['map_cpu']:.2f}",
        f"{base['map_wall']:.2f} / {base['map_cpu']:.2f}",
    )
    row(
        "reduce wall s / busiest worker CPU s",
        f"{ours['reduce_wall']:.2f} / {ours['reduce_cpu']:.2f}",
        f"{base['reduce_wall']:.2f} / {base['reduce_cpu']:.2f}",
    )
    row(
        "peak RSS MiB a worker",
        f"{og.peak_rss_mb_per_worker:.0f}",
        f"{bg.peak_rss_mb_per_worker:.0f}",
        r(og.peak_rss_mb_per_worker, bg.peak_rss_mb_per_worker),
    )
    row("S3 requests", f"{oreq:,}", f"{breq:,}", r(oreq, breq))
    print()
    for name, res in (("ours", ours), ("baseline", base)):
        print(f"S3 requests, {name}: " + ", ".join(f"{k} {v:,}" for k, v in sorted(res["requests"].items()) if v))
    cap = Capacity()
    saved = (bg.unique_keys - og.unique_keys) / cap.rate
    print(
        f"\nGPU time saved at the preflight's estimate ({cap.rate:,.0f} images/s a GPU, {cap.rate_source}): "
        f"{bg.unique_keys - og.unique_keys:,} keys / {cap.rate:,.0f} = {saved:,.0f} GPU-s "
        f"({saved / 3600:.2f} GPU-hours) for this input "
        f"({saved / 3600 * 1e8 / n:,.0f} GPU-hours per 100M keys at the same fractions), for "
        f"{ours['seconds'] - base['seconds']:+.1f} s of prepare here."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
