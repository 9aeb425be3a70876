"""A map worker's part of an incremental run: current object versions and the earlier output, as version records.

Records go to 2R spill files (sluice.prepare.mapper.parts.Parts): file r holds partition r's current
versions, file R + r its earlier rows, so a reducer reads every current version before any
earlier row and keeps only the earlier rows of keys it has. Both are routed by partitions_of
of the key, so a key and every record about it meet in one reducer.

Current versions: a listing's ETags (ListObjectsV2 returns them), an inventory's ETag and
VersionId columns, else one HeadObject per key (key lists, inline keys), HEAD_CONCURRENCY at
a time. Earlier output: for each shard folder of a task, one listing finds the committed
chunks (a part-*.parquet with its _commits/ marker; a file without one is a killed attempt's
leftover), and each chunk's VERSION_COLUMNS are read by ranged GETs (Parquet column
projection: the embeddings, ~95% of a file, are never downloaded). The shard's failures/<i>.jsonl
(one small GET) gives the keys whose bytes failed to decode, with the version read: an
unchanged one is skipped too (sluice.prepare.reducer.skip.FAILED), not counted against the new run.

S3 limits designed for: 5,500 GET/HEAD requests per second per partitioned prefix (S3 user
guide, "Best practices design patterns: optimizing Amazon S3 performance"); one worker's
HEAD_CONCURRENCY x ~50 HEAD/s a connection stays below it, and the input keys of many
workers spread over the bucket's prefixes. Beyond it S3 answers 503 SlowDown, which the
prepare store retries with backoff (boto3's standard retries, then RETRIES more), like every read.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, cast

from sluice.aws.errors import AwsFatalError, Kind
from sluice.aws.ranged import RangedObject, RangeFile
from sluice.aws.s3uri import s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import EarlierOutput, PrepareSpec, VersionCounts
from sluice.contracts.results import FailureLine
from sluice.contracts.status import BYTES_FAILURE_REASONS
from sluice.log import logger
from sluice.outputs import ETAG, KEY, MODEL_ID, VERSION_COLUMNS, VERSION_ID
from sluice.paths import COMMITS_DIR, RunPaths, shard_output_dir
from sluice.prepare import prefetched
from sluice.prepare.mapper.parts import Parts, TaskProblems, Version, partitions_of
from sluice.prepare.reducer.skip import CURRENT, FAILED, distinct, record

HEAD_CONCURRENCY = 32  # HEADs in flight per map worker (the prepare store's pool holds 32 connections)
READ_THREADS = 8  # earlier chunks read at once per worker: GET latency, not bandwidth, bounds them


class VersionRouter:
    """What a map worker of an incremental run learns about versions: the records, the HEADs, the counts."""

    def __init__(self, directory: str, spec: PrepareSpec, store: ObjectStore) -> None:
        os.makedirs(directory, exist_ok=True)
        self._r = spec.partitions
        self.parts = Parts(directory, 2 * spec.partitions)
        self.models = {mid: i for i, mid in enumerate(distinct(spec.model_ids))}
        self.counts = VersionCounts(partition_records=[0] * spec.partitions)
        self._store = store
        self._control = spec.root[5:].split("/", 1)[0] if spec.root.startswith("s3://") else None
        self._pool: ThreadPoolExecutor | None = None

    def current(self, pairs: list[tuple[str, str]], versions: list[Version | None] | None) -> None:
        """The current version of each pair: given (a listing, an inventory) or, when None, HEADed."""
        if versions is None:
            versions = self._head(pairs)
        else:
            self.counts.listed += sum(v is not None for v in versions)
        keep = [(p, v) for p, v in zip(pairs, versions, strict=True) if v is not None and v[0]]
        routes = partitions_of([p for p, _ in keep], self._r)
        self.parts.add([(b, record(k, CURRENT, 0, v[0], v[1])) for (b, k), v in keep], routes)

    def earlier(self, rank: int, keys: list[str], etags: list[Any], vids: list[Any], model_ids: list[Any]) -> int:
        """Rows of an earlier output file (key = s3://bucket/key); returns the rows of this run's models."""
        pairs: list[tuple[str, str]] = []
        recs: list[tuple[str, str]] = []
        for uri, etag, vid, mid in zip(keys, etags, vids, model_ids, strict=True):
            model = self.models.get(mid)
            if model is None or not isinstance(uri, str) or not uri.startswith("s3://") or not etag:
                continue  # another model's row, or one that names no object version
            bucket, _, key = uri[5:].partition("/")
            pairs.append((bucket, key))
            recs.append((bucket, record(key, rank, model, str(etag), vid)))
        self.parts.add(recs, [self._r + r for r in partitions_of(pairs, self._r)])
        self.counts.earlier_rows += len(recs)
        return len(recs)

    def failures_uri(self, run_id: str, shard: int) -> str | None:
        """An earlier run's failures/<shard>.jsonl: under its root in the control bucket, as this run's."""
        return RunPaths.in_bucket(self._control, run_id).failures(shard) if self._control else None

    def earlier_failures(self, rank: int, data: bytes) -> int:
        """An earlier failures/<i>.jsonl: a FAILED record for each key whose bytes failed, with the version read."""
        pairs: list[tuple[str, str]] = []
        recs: list[tuple[str, str]] = []
        for line in data.splitlines():
            try:
                f = FailureLine.model_validate_json(line)
            except ValueError:
                continue  # blank, or not a failure line: that key is embedded again
            if f.reason not in BYTES_FAILURE_REASONS or not f.etag or not f.key.startswith("s3://"):
                continue  # a failure of the request, not of the bytes, or one that names no version
            bucket, _, key = f.key[5:].partition("/")
            pairs.append((bucket, key))
            recs.append((bucket, record(key, rank, FAILED, f.etag, f.version_id)))
        self.parts.add(recs, [self._r + r for r in partitions_of(pairs, self._r)])
        self.counts.earlier_failures += len(recs)
        return len(recs)

    def _head(self, pairs: list[tuple[str, str]]) -> list[Version | None]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(HEAD_CONCURRENCY, thread_name_prefix="sluice-head")
        got = list(self._pool.map(self._head_one, pairs))  # in order: the records' bytes are deterministic
        self.counts.heads += len(got)
        for _, outcome in got:
            if outcome == "missing":
                self.counts.head_missing += 1
            elif outcome == "denied":
                self.counts.head_denied += 1
            elif outcome == "error":
                self.counts.head_errors += 1
        return [v for v, _ in got]

    def _head_one(self, pair: tuple[str, str]) -> tuple[Version | None, str]:
        """(version, outcome); a missing or unreadable key is not skipped: the GPU worker records its failure."""
        try:
            head = self._store.head(s3_uri(*pair))
        except AwsFatalError as exc:  # transient errors that outlived the retries raise: Batch retries the worker
            kind = exc.kind
            return None, "missing" if kind is Kind.NOT_FOUND else "denied" if kind is Kind.DENIED else "error"
        etag = str(head.get("ETag", "")).strip('"')
        vid = head.get("VersionId")
        return ((etag, str(vid)) if vid else (etag, None)), "ok"

    def close(self) -> None:
        """Flush the part files and stop the HEAD threads; the counts take the records per partition."""
        if self._pool is not None:
            self._pool.shutdown()
        self.parts.close()
        c = self.parts.counts
        self.counts.partition_records = [c[r] + c[self._r + r] for r in range(self._r)]

    def abort(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        self.parts.abort()


def committed_chunks(store: ObjectStore, shard_dir: str) -> list[tuple[str, int]]:
    """(URI, size) of the shard folder's Parquet chunks that have a commit marker, in name order."""
    objects = store.list(shard_dir).items()
    base = shard_dir if shard_dir.endswith("/") else shard_dir + "/"
    names = {uri[len(base) :]: size for uri, size in objects if uri.startswith(base)}
    marked = {n[len(COMMITS_DIR) : -len(".json")] for n in names if n.startswith(COMMITS_DIR) and n.endswith(".json")}
    return [
        (base + n, size)
        for n, size in sorted(names.items())
        if "/" not in n and n.endswith(".parquet") and n[: -len(".parquet")] in marked
    ]


def read_versions(store: ObjectStore, uri: str, size: int) -> list[list[Any]] | None:
    """The VERSION_COLUMNS of one output chunk as lists, or None for a file written without them.

    A damaged chunk is None too (logged): its keys are embedded again, which is always safe.
    """
    import pyarrow.parquet as pq

    with cast(BinaryIO, RangeFile(RangedObject(store, uri, size=size))) as fh:
        try:
            pf = pq.ParquetFile(fh, pre_buffer=True)  # pre_buffer: adjacent columns in one GET
            if not set(VERSION_COLUMNS) <= set(pf.schema_arrow.names):
                return None
            table = pf.read(columns=list(VERSION_COLUMNS))
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid / ArrowIOError: not readable Parquet
            logger.warning(
                "earlier output chunk not readable: its keys are embedded again",
                extra={"uri": uri, "error": str(exc)[:300]},
            )
            return None
    cols = [table.column(c).to_pylist() for c in (KEY, ETAG, VERSION_ID, MODEL_ID)]
    keys = cols[0]
    # A text's or video's parts are consecutive rows of one key and version: one record each key.
    first = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]]
    return cols if len(first) == len(keys) else [[c[i] for i in first] for c in cols]


def map_earlier(task: EarlierOutput, store: ObjectStore, sink: VersionRouter, problems: TaskProblems) -> int:
    """Every committed row of the task's shards; returns the rows of this run's models."""
    rows = 0
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="sluice-earlier") as pool:
        for shard in range(task.start, task.stop):
            shard_dir = shard_output_dir(task.model_prefix, shard)
            try:
                files = committed_chunks(store, shard_dir)
                for cols in prefetched(pool, lambda f: read_versions(store, *f), files, READ_THREADS):
                    sink.counts.earlier_files += 1
                    if cols is None:
                        sink.counts.earlier_unversioned += 1
                    else:
                        rows += sink.earlier(task.rank, *cols)
                if task.failures:
                    _map_failures(task, shard, store, sink)
            except AwsFatalError as exc:
                problems.add(_earlier_problem(task, shard_dir, exc))
                return rows
    return rows


def _map_failures(task: EarlierOutput, shard: int, store: ObjectStore, sink: VersionRouter) -> None:
    """The shard's failures/<i>.jsonl of that run (absent: none recorded, or the shard never ended)."""
    uri = sink.failures_uri(task.run_id, shard)
    if uri is None:
        return
    try:
        data = store.get(uri)
    except AwsFatalError as exc:
        if exc.kind is Kind.NOT_FOUND:
            return
        raise
    sink.earlier_failures(task.rank, data)


def _earlier_problem(task: EarlierOutput, where: str, exc: AwsFatalError) -> str:
    failure = exc.failure
    if failure.kind is Kind.DENIED:
        why = "access denied (grant the prepare job role s3:GetObject and s3:ListBucket there)"
    else:
        why = str(exc)
    return f"input.since_run: cannot read the output of run {task.run_id!r} at {where}: {why}"
