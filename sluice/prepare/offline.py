"""`sluice prepare KEYLIST --out DIR`: the prepare stage's map and reduce on this machine, no AWS.

The same run_map / run_reduce as the Batch jobs, over a local directory (one process per
worker, at most one per CPU at a time), then a plan.json a standalone worker can run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from hashlib import blake2b
from multiprocessing import get_context
from typing import Any

from sluice.contracts.manifest import Manifest
from sluice.contracts.prepare import PrepareSpec
from sluice.contracts.sections import MAX_ARRAY_SIZE
from sluice.errors import Rejection
from sluice.paths import RunPaths
from sluice.plan.dedup import MAX_POSITIONS
from sluice.plan.layout import (
    NO_STACK,
    Layout,
    PlanInputs,
    build_plan,
    job_layouts,
    keylist_manifest,
    shard_size,
    write_plan,
)
from sluice.preflight.facts import Capacity
from sluice.prepare import prepare_store
from sluice.prepare.collect import collect
from sluice.prepare.reducer.parts import PrepareError
from sluice.prepare.split import choose_partitions, estimate_keylist, keylist_tasks
from sluice.settings import Settings


def _map_child(spec_uri: str, worker: int) -> float:
    """Map worker `worker`; returns its CPU seconds (its wall seconds are in its MapResult)."""
    from sluice.prepare.__main__ import load_spec
    from sluice.prepare.mapper.worker import run_map

    cpu, store = time.process_time(), prepare_store()
    run_map(load_spec(store, spec_uri), worker, store)
    return time.process_time() - cpu


def _reduce_child(spec_uri: str, partition: int) -> float:
    """Reduce worker `partition`; returns its CPU seconds."""
    from sluice.prepare.__main__ import load_spec
    from sluice.prepare.reducer.worker import run_reduce

    cpu, store = time.process_time(), prepare_store()
    run_reduce(load_spec(store, spec_uri), partition, store)
    return time.process_time() - cpu


def _run_all(fn: Callable[[str, int], float], spec_uri: str, n: int, processes: bool) -> list[float]:
    """fn(spec, i) for i < n: a fresh process each (its peak RSS is its own), at most one per CPU at once."""
    if not processes:
        return [fn(spec_uri, i) for i in range(n)]
    slots = max(1, min(n, os.cpu_count() or 1))
    # forkserver: children fork from a small clean server (not from a caller that may hold a
    # big key list), with sluice already imported there, so each starts fast and measures its own RSS.
    ctx = get_context("forkserver")
    ctx.set_forkserver_preload(
        ["sluice.prepare.offline", "sluice.prepare.mapper.worker", "sluice.prepare.reducer.worker"]
    )
    with ProcessPoolExecutor(slots, mp_context=ctx, max_tasks_per_child=1) as pool:
        return list(pool.map(fn, [spec_uri] * n, range(n)))


@dataclass(frozen=True)
class OfflineJob:
    """What `sluice prepare` shards, where, and with how many workers (its command-line arguments)."""

    keylist_path: str  # a local .txt/.csv/.jsonl key list
    out_dir: str  # gets shards/, prepare/ and plan.json
    workers: int  # map workers
    keys_per_shard: int | None = None  # None: chosen as `sluice plan` chooses it (sluice.plan.layout.shard_size)
    bucket: str | None = None  # the bucket of bare keys
    partitions: int | None = None  # reduce workers; None: one per 4M keys (choose_partitions)
    processes: bool = True  # each worker in its own process (False: in this one, one after the other)
    max_keys: int = MAX_POSITIONS - 1
    keep_parts: bool = False  # keep prepare/map/ (the map workers' part files) afterwards
    settings: Settings | None = None  # the stack's capacity and default model, as `sluice plan` reads them


def offline_layout(job: OfflineJob, keys_estimate: int) -> tuple[Manifest, Capacity, int]:
    """(manifest, capacity, keys_per_shard) as `sluice plan` makes them of this key list: one rule for both.

    No index: the folder is outside any stack, so no index stage follows (`sluice index build DIR --out INDEX`).
    """
    settings = job.settings or Settings.from_env()
    manifest = keylist_manifest(settings, job.keys_per_shard, index=False)
    cap = Capacity.build(settings)
    return manifest, cap, shard_size(keys_estimate, manifest, cap)[0]


def prepare_offline(job: OfflineJob) -> dict[str, Any]:
    """Shard a local key list into out_dir/shards/ and write out_dir/plan.json; Rejection on bad input."""
    t0 = time.monotonic()
    path = os.path.abspath(job.keylist_path)
    root = os.path.abspath(job.out_dir) + "/"
    paths, store = RunPaths(root), prepare_store()
    est = estimate_keylist(store, path)
    run_id = "offline-" + blake2b(path.encode(), digest_size=6).hexdigest()
    manifest, cap, kps = offline_layout(job, est.keys_estimate)
    spec = PrepareSpec(
        run_id=run_id,
        manifest_uri=path,
        root=root,
        workers=job.workers,
        partitions=job.partitions or choose_partitions(est.keys_estimate),
        keys_per_shard=kps,
        default_bucket=job.bucket,
        max_keys=job.max_keys,
        input_keys_estimate=est.keys_estimate,
        tasks=list(keylist_tasks(path, est.size, est.format, est.header, job.workers)),
    )
    store.put(paths.prepare_spec, spec.model_dump_json(indent=2).encode())
    map_cpu = _run_all(_map_child, paths.prepare_spec, spec.workers, job.processes)
    reduce_cpu = _run_all(_reduce_child, paths.prepare_spec, spec.partitions, job.processes)
    got = collect(spec, store)
    if not job.keep_parts:
        shutil.rmtree(root + "prepare/map", ignore_errors=True)
    if got.rejected:
        raise Rejection(got.rejected)
    lay = Layout(got.n_shards, kps, job_layouts(got.n_shards, manifest.job.mode, MAX_ARRAY_SIZE))
    facts = PlanInputs(
        run_id=run_id,
        manifest=manifest,
        manifest_uri=path,
        control_bucket=NO_STACK,
        total_keys=got.unique_keys,
        duplicates=got.duplicates,
        lay=lay,
        capacity=cap,
        root=root,
    )
    write_plan(store.put, paths.plan, build_plan(facts))
    return {
        **got.summary(spec),
        "seconds": round(time.monotonic() - t0, 3),  # wall time here, not the critical path of the workers
        "map_seconds": got.map_seconds,
        "reduce_seconds": got.reduce_seconds,
        "map_cpu_seconds": round(max(map_cpu), 3),  # the busiest worker's CPU time: its rate when alone on a core
        "reduce_cpu_seconds": round(max(reduce_cpu), 3),
        "plan": paths.plan,
    }


def add_offline_arguments(p: argparse.ArgumentParser) -> None:
    """The `sluice prepare` arguments (offline_main reads them)."""
    p.add_argument("keylist", metavar="KEYLIST", help="a local .txt/.csv/.jsonl key list")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for shards/, prepare/ and plan.json")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, metavar="N", help="map workers (default: CPUs)")
    p.add_argument(
        "--partitions", type=int, default=None, metavar="N", help="reduce workers (default: one per 4M keys)"
    )
    p.add_argument(
        "--keys-per-shard",
        type=int,
        default=None,
        metavar="N",
        help="keys a shard holds at most (default: chosen as `sluice plan` chooses it, so start-up stays under "
        "10%% of a child's time; with duplicates a shard holds fewer: docs/manifest.md)",
    )
    p.add_argument("--bucket", metavar="BUCKET", help="bucket for bare keys (the key list's lines without s3://)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def offline_main(args: argparse.Namespace, settings: Settings | None = None) -> int:
    """`sluice prepare`: run prepare_offline and print its summary; Rejection propagates (the CLI prints it)."""
    if args.workers < 1 or (args.partitions is not None and args.partitions < 1) or (args.keys_per_shard or 1) < 1:
        raise PrepareError("--workers, --partitions and --keys-per-shard must be at least 1")
    summary = prepare_offline(
        OfflineJob(
            args.keylist,
            args.out,
            args.workers,
            keys_per_shard=args.keys_per_shard,
            bucket=args.bucket,
            partitions=getattr(args, "partitions", None),
            settings=settings,
        )
    )
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"{summary['unique_keys']:,} unique keys ({summary['keys_in']:,} read, {summary['duplicates']:,} "
            f"duplicates) -> {summary['shards']:,} shards in {summary['seconds']:.1f} s "
            f"({summary['workers']} map x {summary['partitions']} reduce workers, "
            f"peak {summary['peak_rss_mb_per_worker']:.0f} MiB a worker)"
        )
        print(f"plan {summary['plan']}")
    return 0
