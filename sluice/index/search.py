"""Searching an index: vectors in, the k nearest keys with their cosine similarity out.

An index is a folder of tables, `<index>/<model name>.lance` (a LanceDB database: lancedb
opens it as is), or one table's own `.lance` path. A search uses the table's ANN index with
exact re-ranking (sluice.index.ann.Probe), or scans every row when the table has none.
Queries of a batch run concurrently: Lance releases the GIL while it searches.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sluice.errors import SluiceError
from sluice.index import ann
from sluice.index.storage import Files
from sluice.index.table import IndexNotFound, IndexTable, TableMeta
from sluice.paths import LANCE_SUFFIX, join

QUERY_THREADS = 8


class QueryError(SluiceError):
    """A query the index cannot answer (wrong dimension, unknown key, another model's artifact)."""


PART_COLUMNS = ("part", "part_start", "part_end")


@dataclass(frozen=True)
class Hit:
    key: str
    score: float  # cosine similarity of the query and the key's embedding (1 = same direction)
    part: int = 0  # which part of the key (a text's chunk, a video's frame: docs/kinds.md); 0 for an image
    part_start: float = 0.0  # where it starts: character offset, seconds
    part_end: float = 0.0


def _table_uris(files: Files, index: str) -> list[str]:
    if index.rstrip("/").endswith(LANCE_SUFFIX):
        return [index.rstrip("/")]
    return [join(index, n) for n in files.children(index) if n.endswith(LANCE_SUFFIX)]


def open_tables(index: str, files: Files | None = None) -> dict[str, IndexTable]:
    """Model name -> table of the index at `index`; IndexNotFound (one line) when there is none."""
    files = files or Files()
    index = index if index.endswith(LANCE_SUFFIX) or index.endswith("/") else index + "/"
    if not files.exists(index.rstrip("/")):
        raise IndexNotFound(f"no index at {index}: build one with `sluice index build SOURCE --out {index}`")
    tables: dict[str, IndexTable] = {}
    for uri in _table_uris(files, index):
        table = IndexTable.open(uri)
        if table is not None:
            tables[table.meta.model] = table
    if not tables:
        raise IndexNotFound(
            f"{index} is not a Sluice index: it holds no <model>.lance table `sluice index build` wrote"
        )
    return tables


class Searcher:
    """One model's table, opened once for many queries."""

    def __init__(self, table: IndexTable) -> None:
        self.table = table
        self.meta: TableMeta = table.meta
        ds = table.current
        self._ds = ds
        self.probe = ann.probe_of(ds)
        self.ann = ann.NONE if self.probe is None else ann.KIND

    @classmethod
    def open(cls, index: str, model: str | None = None) -> Searcher:
        """The table of `model` in the index (the only one when `model` is None)."""
        tables = open_tables(index)
        if model is None:
            if len(tables) > 1:
                raise IndexNotFound(f"{index} holds the models {', '.join(sorted(tables))}: pick one with --model")
            return cls(next(iter(tables.values())))
        if model not in tables:
            raise IndexNotFound(f"{index} has no model {model!r} (its models: {', '.join(sorted(tables))})")
        return cls(tables[model])

    def _one(self, q: Any, k: int) -> list[Hit]:
        nearest: dict[str, Any] = {"column": ann.COLUMN, "q": q, "k": k, "metric": ann.METRIC}
        if self.probe is None:
            nearest["use_index"] = False
        else:
            nearest |= {"nprobes": self.probe.nprobes, "refine_factor": self.probe.refine_factor}
        parts = [c for c in PART_COLUMNS if c in self._ds.schema.names]  # a table from before parts: none
        got = self._ds.to_table(columns=["key", "_distance", *parts], nearest=nearest)
        keys, dist = got["key"].to_pylist(), got["_distance"].to_pylist()
        where = zip(*(got[c].to_pylist() for c in parts)) if parts else ((0, 0.0, 0.0) for _ in keys)
        return [
            Hit(str(key), round(1.0 - float(d), 6), int(p), float(a), float(b))
            for key, d, (p, a, b) in zip(keys, dist, where)
        ]

    def search(self, vectors: Any, k: int = 10) -> list[list[Hit]]:
        """The k nearest keys of each row of `vectors` ((Q, dim) or (dim,)), best first, one list per query."""
        import numpy as np

        qs = np.asarray(vectors, dtype=np.float32)
        if qs.ndim == 1:
            qs = qs[None, :]
        if qs.ndim != 2 or qs.shape[1] != self.meta.dim:
            raise QueryError(
                f"queries of shape {tuple(qs.shape)}: the index holds {self.meta.dim}-d vectors of model "
                f"{self.meta.model!r}: give (Q, {self.meta.dim}) vectors"
            )
        if len(qs) == 1:
            return [self._one(qs[0], k)]
        with ThreadPoolExecutor(min(QUERY_THREADS, len(qs))) as pool:
            return list(pool.map(lambda q: self._one(q, k), qs))

    def vector_of(self, key: str, part: int = 0) -> Any:
        """The embedding the index holds for `key` (its part `part`: a text's chunk, a video's frame), or None."""
        import numpy as np

        literal = "'" + key.replace("'", "''") + "'"
        where = f"key = {literal}" + (f" AND part = {int(part)}" if "part" in self._ds.schema.names else "")
        got = self._ds.to_table(columns=[ann.COLUMN], filter=where, limit=1)
        if got.num_rows == 0:
            return None
        return np.asarray(got[ann.COLUMN][0].values.to_numpy(zero_copy_only=False), dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        """The index metadata: model, model_id, dim, dtype, rows, ANN kind."""
        m = self.meta
        return {
            "table": self.table.uri,
            "model": m.model,
            "model_id": m.model_id,
            "dim": m.dim,
            "dtype": m.dtype,
            "rows": int(self._ds.count_rows()),
            "ann": self.ann,
        }
