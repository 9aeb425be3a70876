"""Amazon S3 Vectors, the index stage's second target: the run's rows upserted into vector indexes.

    <vector bucket>/<name>-<model>-<shard>      float32, cosine; one index per model and shard

After the Lance build, the rows the build merged for the run (and its lineage runs the table
already held, so a retried stage puts them again) are read back from each model's table and
put with PutVectors, at most PUT_BATCH a call. A key goes to shard sha256(key) mod shards: one
index takes about 2,500 vectors/s of writes, so a big run spreads over several. The vector's
key is the image's s3:// key (its sha256 when longer than S3 Vectors' 1,024 bytes, the key then
in the metadata); its metadata: model_id, run, etag. PutVectors replaces a key's vector, so a
rerun, an incremental run or a retried stage leaves one vector per key, the newest run's.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.contracts.events import VectorsIndexed
from sluice.contracts.manifest import VectorsTarget
from sluice.errors import SluiceError
from sluice.index.build import BuildReport, TableReport
from sluice.index.storage import storage_options

PUT_BATCH = 500  # PutVectors takes at most 500 vectors a call (Amazon S3 Vectors limits)
MAX_KEY_BYTES = 1024  # a vector key's limit
MAX_DIM = 4096  # an index's dimension limit
SCAN_ROWS = 4096


class VectorsError(SluiceError):
    """The S3 Vectors target cannot take the rows (dimension, a refused call): the stage's reason."""


def index_name(name: str, model: str, shard: int) -> str:
    """A vector index's name: 3-63 of lowercase letters, digits, '-' and '.', from the index, model and shard."""
    tail = f"-{_clean(model)[:20]}-{shard:03d}"
    return (_clean(name)[: 63 - len(tail)] + tail).strip("-.")


def _clean(s: str) -> str:
    return re.sub(r"[^a-z0-9.-]+", "-", s.lower()).strip("-.") or "x"


def shard_of(key: str, shards: int) -> int:
    """The shard a key's vector lives in: stable across runs and processes."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % shards


def vector(key: str, values: list[float], meta: dict[str, str]) -> dict[str, Any]:
    """One PutVectors entry: the key (hashed when too long, then kept in the metadata), float32 data, metadata."""
    if len(key.encode()) > MAX_KEY_BYTES:
        meta = {**meta, "key": key}
        key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    return {"key": key, "data": {"float32": values}, "metadata": meta}


@dataclass
class _Writer:
    """Buffers per index, flushed PUT_BATCH vectors at a time; creates each index on first use."""

    client: Any
    bucket: str
    dim: int
    buffers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    created: set[str] = field(default_factory=set)
    put: int = 0

    def add(self, index: str, entry: dict[str, Any]) -> None:
        buf = self.buffers.setdefault(index, [])
        buf.append(entry)
        if len(buf) >= PUT_BATCH:
            self.flush(index)

    def flush(self, index: str) -> None:
        buf = self.buffers.pop(index, [])
        if not buf:
            return
        self._ensure(index)
        self._call("put_vectors", index, vectorBucketName=self.bucket, indexName=index, vectors=buf)
        self.put += len(buf)

    def _ensure(self, index: str) -> None:
        if index in self.created:
            return
        try:
            self.client.get_index(vectorBucketName=self.bucket, indexName=index)
        except self.client.exceptions.NotFoundException:
            self._call(
                "create_index", index, vectorBucketName=self.bucket, indexName=index, dataType="float32",
                dimension=self.dim, distanceMetric="cosine",
            )  # fmt: skip
        self.created.add(index)

    def _call(self, op: str, index: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self.client, op)(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise VectorsError(
                f"S3 Vectors {op} on {self.bucket}/{index} failed: {exc}. The Lance index is updated; grant the "
                "index role s3vectors:GetIndex, CreateIndex and PutVectors on the bucket (VectorBucketName), then "
                "rerun the stage"
            ) from exc


def _rows(table: TableReport, runs: list[str]) -> Iterator[Any]:
    """The table's rows written by `runs`, as Arrow batches (key, embedding, model_id, run, etag)."""
    import lance

    ds = lance.dataset(table.uri, storage_options=storage_options(table.uri))
    quoted = ", ".join("'" + r.replace("'", "''") + "'" for r in runs)
    columns = ["key", "embedding", "model_id", "run", "etag"]
    yield from ds.scanner(columns=columns, filter=f"run IN ({quoted})", batch_size=SCAN_ROWS).to_batches()


def _put_table(w: _Writer, name: str, table: TableReport, target: VectorsTarget, runs: list[str]) -> list[str]:
    import numpy as np

    used: set[str] = set()
    for batch in _rows(table, runs):
        emb = batch.column("embedding")
        values = np.asarray(emb.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(len(batch), -1)
        cols = {c: batch.column(c).to_pylist() for c in ("key", "model_id", "run", "etag")}
        for i, key in enumerate(cols["key"]):
            index = index_name(name, table.model, shard_of(key, target.shards))
            meta = {c: str(cols[c][i] or "") for c in ("model_id", "run", "etag")}
            w.add(index, vector(key, values[i].tolist(), meta))
            used.add(index)
    for index in sorted(w.buffers):
        w.flush(index)
    return sorted(used)


def upsert(report: BuildReport, name: str, target: VectorsTarget, client: Any = None) -> VectorsIndexed:
    """Put the rows of the runs this build holds for (merged or already held) into S3 Vectors."""
    if client is None:
        from sluice.aws.clients import client as aws_client

        client = aws_client("s3vectors")
    put, indexes = 0, []
    for table in report.tables:
        if not 1 <= table.dim <= MAX_DIM:
            raise VectorsError(f"S3 Vectors takes 1 to {MAX_DIM} dimensions; {table.model} has {table.dim}")
        w = _Writer(client, target.bucket, table.dim)
        indexes += _put_table(w, name, table, target, [*table.merged, *table.skipped])
        put += w.put
    return VectorsIndexed(bucket=target.bucket, indexes=indexes, vectors=put)


__all__ = ["PUT_BATCH", "VectorsError", "index_name", "shard_of", "upsert", "vector"]
