"""A reduce worker's parts shared by the plain and the incremental reduce: read a partition, cut it, write it."""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sluice.aws.errors import AwsFatalError, Kind
from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import MapResult, PrepareSpec, ReduceResult
from sluice.errors import SluiceError
from sluice.paths import SCRATCH_TAG, RunPaths
from sluice.prepare import peak_rss_mb
from sluice.shards import ShardReader, encode_shard, rank_slice

IO_THREADS = 8


Groups = list[tuple[str, list[str]]]


class PrepareError(SluiceError):
    """The prepare stage's own files are missing or inconsistent: the job fails (exit 1)."""


def read_result(store: ObjectStore, uri: str, what: str) -> bytes:
    """A result object's bytes; PrepareError when the worker that writes it has not finished."""
    try:
        return store.get(uri)
    except FileNotFoundError:
        pass
    except AwsFatalError as exc:
        if exc.kind is not Kind.NOT_FOUND:
            raise
    raise PrepareError(f"{what} left no result ({uri}): its job did not finish; rerun it")


def load_map_results(spec: PrepareSpec, store: ObjectStore) -> list[MapResult]:
    """Every map worker's result (read in parallel); a missing one means the map job did not finish."""
    paths = RunPaths(spec.root)

    def load(w: int) -> MapResult:
        uri = paths.map_result(w)
        res = MapResult.model_validate_json(read_result(store, uri, f"map worker {w}"))
        if len(res.partition_keys) != spec.partitions:
            raise PrepareError(f"{uri} has {len(res.partition_keys)} partitions, the spec {spec.partitions}")
        return res

    with ThreadPoolExecutor(IO_THREADS) as pool:
        return list(pool.map(load, range(spec.workers)))


def shard_slots(spec: PrepareSpec, results: list[MapResult]) -> list[int]:
    """S_q for every partition q: shards it fills (known before deduplication)."""
    if spec.mode == "multinode":
        return [1] * spec.partitions
    counts = [sum(m.partition_keys[q] for m in results) for q in range(spec.partitions)]
    return [math.ceil(c / spec.keys_per_shard) for c in counts]


def cut(groups: Groups, n_keys: int, n_shards: int) -> list[Groups]:
    """Sorted (bucket, keys) groups -> n_shards contiguous pieces whose sizes differ by at most one."""
    pieces: list[Groups] = []
    gi, off = 0, 0  # position in groups: group index, offset inside it
    for j in range(n_shards):
        lo, hi = rank_slice(n_keys, n_shards, j)
        need, piece = hi - lo, []
        while need:
            bucket, keys = groups[gi]
            take = min(need, len(keys) - off)
            piece.append((bucket, keys[off : off + take]))
            need -= take
            off += take
            if off == len(keys):
                gi, off = gi + 1, 0
        pieces.append(piece)
    return pieces


@dataclass(frozen=True)
class ReduceJob:
    """One reduce worker: the run's prepare spec, its partition, where it reads and writes, when it started."""

    spec: PrepareSpec
    partition: int
    store: ObjectStore
    t0: float  # time.monotonic() at its start: the result's seconds

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.spec.root)


def write_partition(job: ReduceJob, uris: list[str], pieces: list[Groups], counted: ReduceResult) -> ReduceResult:
    """Write the partition's shards, then its ReduceResult (its commit marker), which it returns.

    `counted` holds what the caller counted: keys_in, unique_keys, first_shard (and an incremental
    run's skipped_unchanged, staged); this adds the duplicates, the shards' sizes, time and memory.
    """
    write_pieces(job.store, uris, pieces)
    res = ReduceResult.model_validate(
        counted.model_dump()
        | {
            "partition": job.partition,
            "duplicates": counted.keys_in - counted.unique_keys,
            "shard_keys": [sum(len(k) for _, k in p) for p in pieces],
            "seconds": round(time.monotonic() - job.t0, 3),
            "peak_rss_mb": peak_rss_mb(),
        }
    )
    job.store.put(
        job.paths.reduce_result(job.partition), res.model_dump_json().encode(), content_type="application/json"
    )
    return res


def read_partition(job: ReduceJob, results: list[MapResult]) -> tuple[Groups, int]:
    """The partition's keys from every map worker: sorted unique keys per bucket, and the keys read."""
    spec, partition, store, paths = job.spec, job.partition, job.store, job.paths
    expected = sum(m.partition_keys[partition] for m in results)
    by_bucket: dict[str, list[str]] = {}
    uris = [paths.prepare_part(w, partition) for w in range(spec.workers)]
    with ThreadPoolExecutor(IO_THREADS) as pool:
        for data in pool.map(store.get, uris):
            for bucket, keys in ShardReader(data).groups():
                by_bucket.setdefault(bucket, []).extend(keys)
    keys_in = sum(len(v) for v in by_bucket.values())
    if keys_in != expected:
        raise PrepareError(
            f"partition {partition}'s parts hold {keys_in} keys, the map results say {expected}: "
            "a part was overwritten by another run of the map job; rerun the map job"
        )
    groups: Groups = []
    for bucket in sorted(by_bucket):
        groups.append((bucket, sorted(set(by_bucket.pop(bucket)))))  # exact: equal strings, not digests
    return groups, keys_in


def write_pieces(store: ObjectStore, uris: list[str], pieces: list[Groups]) -> None:
    """Each piece as a sorted shard at its URI (in parallel)."""

    def write(j: int) -> None:
        store.put(uris[j], encode_shard(pieces[j], sort=True), tagging=SCRATCH_TAG)

    with ThreadPoolExecutor(IO_THREADS) as pool:
        list(pool.map(write, range(len(pieces))))
