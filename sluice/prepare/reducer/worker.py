"""Reduce worker r: deduplicate partition r across every map worker, sort it, write its shards, then its result.

Shard slots are fixed before deduplication: partition q gets S_q = ceil(c_q / keys_per_shard)
shards, c_q being the keys the map workers routed to it (duplicates included), so reducer r
knows its first shard, sum(S_q for q < r), from the MapResults alone, without waiting for
the other reducers. Its unique keys are cut into S_r contiguous shards whose sizes differ by
at most one (smaller than keys_per_shard by the duplicate fraction). multinode: S_q = 1.
"""

from __future__ import annotations

import time

from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import PrepareSpec, ReduceResult
from sluice.prepare.reducer.parts import ReduceJob, cut, load_map_results, read_partition, shard_slots, write_partition


def run_reduce(spec: PrepareSpec, partition: int, store: ObjectStore) -> ReduceResult:
    """Reduce worker `partition`: its shards, then its ReduceResult (last)."""
    job = ReduceJob(spec, partition, store, time.monotonic())
    if not 0 <= partition < spec.partitions:
        raise ValueError(f"reduce worker {partition} is outside 0..{spec.partitions - 1} (AWS_BATCH_JOB_ARRAY_INDEX)")
    paths = job.paths
    results = load_map_results(spec, store)
    if any(m.problem_count for m in results):  # the run is rejected: write nothing but the verdict
        res = ReduceResult(partition=partition, skipped=True, seconds=round(time.monotonic() - job.t0, 3))
        store.put(paths.reduce_result(partition), res.model_dump_json().encode(), content_type="application/json")
        return res
    groups, keys_in = read_partition(job, results)
    if spec.incremental:
        from sluice.prepare.reducer.versions import reduce_incremental

        return reduce_incremental(job, results, groups, keys_in)
    slots = shard_slots(spec, results)
    first = sum(slots[:partition])
    unique = sum(len(k) for _, k in groups)
    pieces = cut(groups, unique, slots[partition])
    del groups
    uris = [paths.shard(first + j) for j in range(len(pieces))]
    counted = ReduceResult(partition=partition, keys_in=keys_in, unique_keys=unique, first_shard=first)
    return write_partition(job, uris, pieces, counted)
