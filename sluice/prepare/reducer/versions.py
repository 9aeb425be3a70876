"""A reduce worker's part of an incremental run, and the shard numbering the submit step does after it.

Reducer r reads the current versions of its partition from every map worker, then the
earlier records (sluice.prepare.reducer.skip.Skipper keeps only those of keys it has), and
leaves out the keys to skip before cutting its shards. How many shards it fills is known only
then, so an array run's reducers write them under prepare/reduce/<r>/<j>.shard and the submit
step (sluice.control.intake.prepared, after every reducer) numbers them in partition order and copies
them to shards/<i>.shard, server-side (place_shards). A multinode run keeps one shard per
partition (= node): shard r.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import MapResult, PrepareSpec, ReduceResult
from sluice.paths import SCRATCH_TAG, RunPaths
from sluice.prepare import prefetched
from sluice.prepare.reducer.parts import IO_THREADS, Groups, PrepareError, ReduceJob, cut, write_partition
from sluice.prepare.reducer.skip import Skipper, distinct
from sluice.shards import ShardReader

# S3 takes 3,500 PUT/COPY/POST/DELETE requests per second per partitioned prefix (S3 user guide,
# "optimizing Amazon S3 performance"); 32 copies in flight at ~30-60 ms each stay well under it,
# and 10,000 shards take ~10-20 s of the submit step's 600 s (template.yaml's function timeout).
COPY_THREADS = 32


def load_skipper(job: ReduceJob, results: list[MapResult]) -> Skipper:
    """The partition's version records from every map worker: all current ones, then all earlier ones."""
    spec, partition, paths = job.spec, job.partition, job.paths
    skipper = Skipper(len(distinct(spec.model_ids)))
    expected = sum(m.versions.partition_records[partition] for m in results if m.versions is not None)
    seen = 0
    with ThreadPoolExecutor(IO_THREADS) as pool:
        for earlier in (False, True):
            uris = [paths.versions_part(w, partition, earlier) for w in range(spec.workers)]
            for data in prefetched(pool, job.store.get, uris, IO_THREADS):
                for bucket, recs in ShardReader(data).groups():
                    seen += len(recs)
                    for rec in recs:
                        skipper.add(bucket, rec)
    if seen != expected:
        raise PrepareError(
            f"partition {partition}'s version parts hold {seen} records, the map results say {expected}: "
            "a part was overwritten by another run of the map job; rerun the map job"
        )
    return skipper


def reduce_incremental(job: ReduceJob, results: list[MapResult], groups: Groups, keys_in: int) -> ReduceResult:
    """The partition's unique keys less the unchanged ones -> its shards, then its ReduceResult (last)."""
    spec, partition, paths = job.spec, job.partition, job.paths
    skipper = load_skipper(job, results)
    unique = sum(len(k) for _, k in groups)
    kept: Groups = [(b, ks) for b, ks in ((b, skipper.keep(b, keys)) for b, keys in groups) if ks]
    skipped_failed = skipper.known_bad
    del skipper, groups
    n = sum(len(k) for _, k in kept)
    if spec.mode == "multinode":
        uris, first, staged = [paths.shard(partition)], partition, False
    else:
        uris, first, staged = (
            [paths.staged_shard(partition, j) for j in range(math.ceil(n / spec.keys_per_shard))],
            0,
            True,
        )
    pieces = cut(kept, n, len(uris))
    counted = ReduceResult(
        partition=partition,
        keys_in=keys_in,
        unique_keys=unique,
        first_shard=first,
        skipped_unchanged=unique - n - skipped_failed,
        skipped_failed=skipped_failed,
        staged=staged,
    )
    return write_partition(job, uris, pieces, counted)


def place_shards(spec: PrepareSpec, pieces: list[int], store: ObjectStore) -> None:
    """Copy each partition's staged shards to shards/<i>.shard, numbered in partition order (idempotent)."""
    paths = RunPaths(spec.root)
    copies: list[tuple[str, str]] = []
    for r, count in enumerate(pieces):
        copies += [(paths.staged_shard(r, j), paths.shard(len(copies) + j)) for j in range(count)]
    with ThreadPoolExecutor(COPY_THREADS) as pool:
        list(pool.map(lambda c: store.copy(c[0], c[1], tagging=SCRATCH_TAG), copies))
