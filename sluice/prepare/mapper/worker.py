"""Map worker w: read tasks[w::workers], validate every entry, route each key to its partition's part file.

Each key goes, by partitions_of (sluice.prepare.mapper.parts), to one of R local spill files (shard
format, unsorted blocks, bounded memory); then all R are uploaded (empty ones too, so a reducer
never guesses) and the MapResult is written last: it is the worker's commit marker. The same
input gives the same bytes, so a retried worker overwrites its parts with identical objects.

Bad input (an input object that does not exist or cannot be read included) is a problem in
the MapResult, which rejects the run; a spill file that cannot be written (SpillError) or a
transient S3 failure that outlived the retries is not the input's fault: the worker exits 1
and Batch retries it.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sluice.aws.errors import AwsFatalError, Kind
from sluice.aws.s3uri import s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import InlineKeys, InventoryFiles, KeyListRange, MapResult, PrefixRange, PrepareSpec
from sluice.errors import Rejection
from sluice.input.inventory_files import csv_keys, csv_versions, parquet_keys, parquet_versions
from sluice.paths import SCRATCH_TAG, RunPaths
from sluice.prepare import peak_rss_mb
from sluice.prepare.mapper.keylist import map_keylist
from sluice.prepare.mapper.parts import Parts, TaskProblems, spill_error
from sluice.prepare.mapper.router import KeyRouter
from sluice.prepare.mapper.versions import VersionRouter, map_earlier

UPLOAD_THREADS = 8


def _input_problem(exc: AwsFatalError, what: str) -> str:
    """The rejection reason for an input object S3 will not give (sluice.input.sources.s3_error's words)."""
    failure = exc.failure
    if failure.kind is Kind.NOT_FOUND:
        return f"{what}: the bucket does not exist" if failure.code == "NoSuchBucket" else f"{what} does not exist"
    if failure.kind is Kind.DENIED:
        return f"{what} cannot be read: access denied (grant the prepare job role read access)"
    raise exc


def map_inventory(
    task: InventoryFiles,
    store: ObjectStore,
    problems: TaskProblems,
    emit_batch: Callable[..., None],
    *,
    versions: bool = False,
) -> int:
    """Read each data file (gzip CSV or Parquet, via sluice.input.inventory_files); returns the keys it held.

    `versions`: batches carry each key's object version too (an incremental run). A file that
    cannot be parsed is a problem (the run is rejected); what `emit_batch` raises (a spill
    file that cannot be written: SpillError) is not the input's fault and fails the task.
    """
    rows = 0
    for key in task.keys:
        uri = s3_uri(task.bucket, key)
        what = f"inventory file {uri}"
        try:
            data = store.get(uri)
        except AwsFatalError as exc:
            problems.add(_input_problem(exc, what))
            continue
        read = functools.partial(_inventory_batches, task, data, uri, problems, versions)
        for batch in _parsed(read, task, key, problems):
            rows += len(batch[1])
            emit_batch(*batch)
    return rows


def _inventory_batches(
    task: InventoryFiles, data: bytes, uri: str, problems: TaskProblems, versions: bool
) -> Iterator[tuple[Any, ...]]:
    """The data file's batches: (bucket, keys), or (bucket, keys, versions) for an incremental run."""
    csv_ = task.format == "CSV"
    if versions:
        return csv_versions(data, task.columns, uri, problems) if csv_ else parquet_versions(data, uri, problems)
    return csv_keys(data, task.columns, uri, problems) if csv_ else parquet_keys(data, uri, problems)


def _parsed(
    read: Callable[[], Iterator[tuple[Any, ...]]], task: InventoryFiles, key: str, problems: TaskProblems
) -> Iterator[tuple[Any, ...]]:
    """What `read` yields until the file turns out unreadable, which becomes a problem.

    Only reading is guarded: each batch is yielded outside the try, so what the consumer raises
    while routing it (SpillError, an S3 failure) passes through untouched.
    """
    batches: Iterator[tuple[Any, ...]] | None = None
    while True:
        try:
            batches = read() if batches is None else batches
            batch = next(batches)
        except StopIteration:
            return
        except Rejection as exc:
            problems.add("; ".join(exc.reasons))
            return
        except Exception as exc:  # pyarrow's errors (a damaged Parquet file), a schema without Bucket/Key
            problems.add(f"inventory file {key}: cannot be read as {task.format}: {type(exc).__name__}: {exc}")
            return
        yield batch


def map_prefix(
    task: PrefixRange,
    store: ObjectStore,
    problems: TaskProblems,
    emit_batch: Callable[..., None],
    *,
    versions: bool = False,
) -> int:
    """List start_after < key < stop_at under the prefix (folder markers skipped); returns the keys listed.

    `versions`: batches carry each key's ETag from the listing too (an incremental run).
    """
    listed, token = 0, None
    what = f"prefix s3://{task.bucket}/{task.prefix}"
    while True:
        try:
            page, _ = store.list_page(task.bucket, task.prefix, start_after=task.start_after, token=token)
        except AwsFatalError as exc:
            problems.add(_input_problem(exc, what))
            return listed
        done = not page.truncated
        stop = task.stop_at
        if stop is not None and page.keys and page.keys[-1] >= stop:
            done = True
        etags = page.etags or [""] * len(page.keys)
        kept = [
            (k, e) for k, e in zip(page.keys, etags, strict=True) if not k.endswith("/") and (stop is None or k < stop)
        ]
        listed += len(kept)
        if kept:
            keys = [k for k, _ in kept]
            if versions:
                emit_batch(task.bucket, keys, [(e, None) if e else None for _, e in kept])
            else:
                emit_batch(task.bucket, keys)
        if done:
            return listed
        token = page.token


def run_map(spec: PrepareSpec, worker: int, store: ObjectStore, *, spill_dir: str | None = None) -> MapResult:
    """Map worker `worker`: its parts, then its MapResult (last)."""
    t0 = time.monotonic()
    if not 0 <= worker < spec.workers:
        raise ValueError(f"map worker {worker} is outside 0..{spec.workers - 1} (AWS_BATCH_JOB_ARRAY_INDEX)")
    paths = RunPaths(spec.root)
    suffixes = tuple(s.lower() for s in spec.suffixes) if spec.suffixes else None
    problems = TaskProblems()
    mine = list(range(worker, len(spec.tasks), spec.workers))
    with _spill_dir(spill_dir) as tmp:
        parts = Parts(tmp, spec.partitions)
        sink = KeyRouter(parts, problems, frozenset(spec.allowed_buckets), suffixes)
        vs = sink.versions = VersionRouter(os.path.join(tmp, "v"), spec, store) if spec.incremental else None
        try:
            task_lines = [_map_task(spec, t, store, sink) for t in mine]
            if vs is not None:  # the earlier output, after the input: its problems follow the input's
                problems.task, problems.line = 0, None
                for t in range(worker, len(spec.earlier), spec.workers):
                    map_earlier(spec.earlier[t], store, vs, problems)
                vs.close()
            parts.close()
        except BaseException:
            parts.abort()
            if vs is not None:
                vs.abort()
            raise
        uploads = [(paths.prepare_part(worker, r), p) for r, p in enumerate(parts.paths)]
        if vs is not None:  # 2R files: partition r's current versions, then its earlier records
            r_ = spec.partitions
            uploads += [(paths.versions_part(worker, r % r_, r >= r_), p) for r, p in enumerate(vs.parts.paths)]
        _upload(store, uploads)
    result = MapResult(
        worker=worker,
        tasks=mine,
        task_lines=task_lines,
        keys_in=sink.keys_in,
        partition_keys=parts.counts,
        problems=problems.kept,
        problem_count=problems.count,
        seconds=round(time.monotonic() - t0, 3),
        peak_rss_mb=peak_rss_mb(),
        versions=None if sink.versions is None else sink.versions.counts,
        buckets=sorted(sink.buckets),
    )
    store.put(paths.map_result(worker), result.model_dump_json().encode(), content_type="application/json")
    return result


def _spill_dir(parent: str | None) -> tempfile.TemporaryDirectory[str]:
    """The worker's own folder for its part files, under `parent` (SLUICE_SPILL_DIR) or the system's temp dir."""
    try:
        return tempfile.TemporaryDirectory(prefix="sluice-map-", dir=parent)
    except OSError as exc:
        raise spill_error(parent or tempfile.gettempdir(), exc) from exc


def _map_task(spec: PrepareSpec, t: int, store: ObjectStore, sink: KeyRouter) -> int:
    """Task `t` of the input: its lines, rows or keys, routed to the sink."""
    task = spec.tasks[t]
    problems = sink.problems
    problems.task, problems.line = t, None
    versions = sink.versions is not None
    if isinstance(task, KeyListRange):
        return map_keylist(task, store, spec.default_bucket, sink)
    if isinstance(task, InventoryFiles):
        return map_inventory(task, store, problems, sink.batch, versions=versions)
    if isinstance(task, InlineKeys):
        sink.pairs(list(task.pairs))  # validated by the manifest Lambda (sluice.control.intake.lineage)
        return len(task.pairs)
    return map_prefix(task, store, problems, sink.batch, versions=versions)


def _upload(store: ObjectStore, items: list[tuple[str, str]]) -> None:
    """PUT each local part file to its URI (threads: S3 PUT latency, not bandwidth, bounds this)."""

    def put(item: tuple[str, str]) -> None:
        uri, path = item
        with open(path, "rb") as fh:
            store.put(uri, fh.read(), tagging=SCRATCH_TAG)

    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        list(pool.map(put, items))
