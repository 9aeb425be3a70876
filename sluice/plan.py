"""Keys -> shards -> job layout, in two streaming passes with bounded memory.

Pass 1 (`scan`): validate every key, record its digest (sluice.dedup) and spill it, in
manifest order, to a local temporary shard file. Nothing is written to S3 until the
whole input has been validated, so a rejected manifest leaves no trace under runs/.
Pass 2 (`write_shards`): re-read the spill, drop later duplicates, cut the unique keys
into contiguous shards of `keys_per_shard` (sorted inside each shard, which makes them
~23% smaller), and hand each finished shard to a `put` callback.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from sluice.dedup import DuplicateFinder
from sluice.errors import ManifestRejected, PlanError, TooBigForLambda
from sluice.models import JobLayout, Manifest, PlannedModel, RunPlan
from sluice.paths import RunPaths
from sluice.preflight.checks import derived_timeout_s
from sluice.preflight.facts import Capacity
from sluice.shards import FileSource, ShardReader, ShardWriter, encode_shard

KeyBatch = tuple[str, list[str]]
SORT_LIMIT = 2_000_000  # shards bigger than this keep manifest order (sorting needs them in memory)
SCRATCH_TAG = "sluice-scratch=true"  # the bucket's lifecycle rule expires tagged shards (template.yaml)


@dataclass
class Scan:
    """Result of pass 1: counts plus the spill file holding the keys in manifest order."""

    total_keys: int
    duplicates: int
    spill_path: str
    bitmap: bytearray = field(repr=False)
    buckets: set[str] = field(default_factory=set)

    @property
    def unique_keys(self) -> int:
        return self.total_keys - self.duplicates

    def close(self) -> None:
        """Delete the spill file."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spill_path)

    def __enter__(self) -> Scan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def scan(
    batches: Iterable[KeyBatch], *, max_keys: int, spill_dir: str | None = None, lambda_cap: int | None = None
) -> Scan:
    """Pass 1: spill and digest every key; reject zero keys or too many (TooBigForLambda past `lambda_cap`)."""
    finder = DuplicateFinder()
    fd, path = tempfile.mkstemp(prefix="sluice-spill-", suffix=".shard", dir=spill_dir)
    buckets: set[str] = set()
    try:
        with os.fdopen(fd, "wb") as fh:
            writer = ShardWriter(fh, sort=False, level=1, block_keys=4096)
            for bucket, keys in batches:
                if lambda_cap is not None and finder.count + len(keys) > lambda_cap:
                    raise TooBigForLambda(finder.count + len(keys))
                if finder.count + len(keys) > max_keys:
                    raise ManifestRejected(
                        f"more than {max_keys} keys (SLUICE_MAX_KEYS): split the input into several manifests"
                    )
                buckets.add(bucket)
                finder.add(bucket, keys)
                writer.add(bucket, keys)
            writer.close()
        if finder.count == 0:
            raise ManifestRejected("the manifest names zero keys: nothing to run")
        bitmap, dups = finder.duplicates()
    except BaseException:
        os.unlink(path)
        raise
    return Scan(finder.count, dups, path, bitmap, buckets)


def iter_unique(sc: Scan) -> Iterator[KeyBatch]:
    """Pass 2 input: the spilled keys in manifest order, later duplicates dropped."""
    reader = ShardReader(FileSource(sc.spill_path))
    bitmap, pos = sc.bitmap, 0
    for bucket, keys in reader.groups():
        n = len(keys)
        lo, hi = pos >> 3, (pos + n + 7) >> 3
        if any(bitmap[lo:hi]):
            keys = [k for i, k in enumerate(keys, pos) if not bitmap[i >> 3] >> (i & 7) & 1]
        pos += n
        if keys:
            yield bucket, keys


@dataclass(frozen=True)
class Layout:
    """How many shards, how big, and which Batch jobs cover them."""

    n_shards: int
    keys_per_shard: int
    jobs: list[JobLayout]


def layout(unique_keys: int, manifest: Manifest, max_array_size: int) -> Layout:
    """Array: one child per shard, several array jobs past max_array_size. MNP: node i = shard i."""
    job = manifest.job
    if job.mode == "multinode":
        kps = max(1, math.ceil(unique_keys / job.nodes))
        return Layout(job.nodes, kps, job_layouts(job.nodes, job.mode, max_array_size))
    n = max(1, math.ceil(unique_keys / job.keys_per_shard))
    return Layout(n, job.keys_per_shard, job_layouts(n, job.mode, max_array_size))


def job_layouts(n_shards: int, mode: str, max_array_size: int) -> list[JobLayout]:
    """The Batch jobs that cover shards 0..n_shards-1 (MNP: one job, node i = shard i)."""
    if mode == "multinode":
        return [JobLayout(kind="multinode", shard_offset=0, shard_count=n_shards)]
    jobs = []
    for off in range(0, n_shards, max_array_size):
        count = min(max_array_size, n_shards - off)
        # Batch array jobs need >= 2 children: a lone shard becomes a plain job.
        jobs.append(JobLayout(kind="array" if count >= 2 else "single", shard_offset=off, shard_count=count))
    return jobs


def write_shards(sc: Scan, lay: Layout, put: Callable[[int, bytes], None], *, sort: bool | None = None) -> list[int]:
    """Pass 2: encode each shard and call put(index, data). Returns keys per shard."""
    do_sort = lay.keys_per_shard <= SORT_LIMIT if sort is None else sort
    sizes: list[int] = []
    groups: list[KeyBatch] = []
    filled = 0

    def flush() -> None:
        nonlocal groups, filled
        put(len(sizes), encode_shard(groups, sort=do_sort))
        sizes.append(filled)
        groups, filled = [], 0

    for bucket, keys in iter_unique(sc):
        while keys:
            take = min(len(keys), lay.keys_per_shard - filled)
            groups.append((bucket, keys[:take]))
            filled += take
            keys = keys[take:]
            if filled == lay.keys_per_shard:
                flush()
    if filled or not sizes:
        flush()
    while len(sizes) < lay.n_shards:  # MNP with fewer keys than nodes: empty shards
        flush()
    return sizes


def build_plan(
    *,
    run_id: str,
    manifest: Manifest,
    manifest_uri: str,
    control_bucket: str,
    total_keys: int,
    duplicates: int,
    lay: Layout,
    images_per_gpu_s: float | None = None,
    model_ids: Sequence[str] | None = None,
    lineage: Sequence[str] = (),
    skipped: Mapping[str, int] | None = None,
) -> RunPlan:
    """The plan.json a worker reads; `images_per_gpu_s` (default: the table's) sizes a derived job timeout.

    `model_ids` are the models' artifact identities (sluice.modelid.resolve, one per model; default:
    the static ones); `lineage` and `skipped` describe an incremental run (RunPlan).
    """
    root = RunPaths.in_bucket(control_bucket, run_id)
    gpus = max(1, manifest.job.gpus_per_node)
    rate = (images_per_gpu_s or Capacity().rate) / len(manifest.models)  # each image goes through every model
    timeout_s = manifest.job.timeout_s or derived_timeout_s(lay.keys_per_shard, gpus, rate)
    return RunPlan(
        run_id=run_id,
        manifest_uri=manifest_uri,
        control_bucket=control_bucket,
        shards_prefix=root.shards_prefix,
        output_prefix=manifest.output.prefix or root.output_prefix,
        failures_prefix=root.failures_prefix,
        total_keys=total_keys,
        duplicates=duplicates,
        n_shards=lay.n_shards,
        keys_per_shard=lay.keys_per_shard,
        mode=manifest.job.mode,
        nodes=manifest.job.nodes if manifest.job.mode == "multinode" else 1,
        gpus_per_node=manifest.job.gpus_per_node,
        spot_allowed=manifest.job.mode == "array",
        models=[PlannedModel.of(m, model_ids[i] if model_ids else None) for i, m in enumerate(manifest.models)],
        lineage=list(lineage),
        skipped=dict(skipped or {}),
        output_dtype=manifest.output.dtype,
        attempts=manifest.job.attempts,
        timeout_s=timeout_s,
        max_failed_fraction=manifest.max_failed_fraction,
        retry_failed=manifest.retry_failed,
        jobs=lay.jobs,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def load_plan(read: Callable[[str], bytes], uri: str) -> RunPlan:
    """Read and validate a plan.json; `read` fetches a URI (S3 or a local path). PlanError says what is wrong."""
    try:
        raw = read(uri)
    except Exception as exc:
        raise PlanError(f"cannot read the plan {uri}: {type(exc).__name__}: {exc}") from exc
    try:
        return RunPlan.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "plan"
        raise PlanError(
            f"{uri} is not a valid plan.json: {where}: {first.get('msg')} ({exc.error_count()} problem(s))"
        ) from None
