"""Output records -> index rows: each Parquet chunk checked against Sluice's output schema and cast.

The index row is the output record (sluice.outputs) with its dictionary columns as plain
strings, plus `run_order`: when the row's run was planned (ISO 8601), which decides which row
of a (key, model_id) a later merge keeps (the newest, as `sluice output sql` reads a lineage).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sluice import outputs
from sluice.index.sources import IndexBuildError
from sluice.index.storage import Files

RUN_ORDER = "run_order"
PRIMARY_KEY = {"lance-schema:unenforced-primary-key": "true"}  # Lance detects concurrent inserts of a key
READ_AHEAD = 8  # chunks read ahead of the merge (about 2 MB each)
_REQUIRED = (outputs.KEY, outputs.EMBEDDING, outputs.MODEL, outputs.MODEL_ID)
_STRINGS = (outputs.MODEL, outputs.MODEL_VERSION, outputs.MODEL_ID, outputs.ETAG, outputs.VERSION_ID, outputs.RUN)


@dataclass(frozen=True)
class Shape:
    """What a table holds, from its first rows: one model_id (artifact and preprocessing), one dimension."""

    model: str
    model_id: str
    dim: int
    dtype: str  # float16 | float32


def index_schema(shape: Shape, metadata: dict[str, str] | None = None) -> Any:
    """The Lance table's Arrow schema: the output columns, keyed by (key, part, model_id), plus run_order."""
    import pyarrow as pa

    value = pa.float16() if shape.dtype == "float16" else pa.float32()
    string = pa.string()
    fields = [
        pa.field(outputs.KEY, string, nullable=False, metadata=PRIMARY_KEY),
        pa.field(outputs.PART, pa.int32(), nullable=False, metadata=PRIMARY_KEY),
        pa.field(outputs.PART_START, pa.float64(), nullable=False),
        pa.field(outputs.PART_END, pa.float64(), nullable=False),
        pa.field(outputs.EMBEDDING, pa.list_(value, shape.dim), nullable=False),
        pa.field(outputs.MODEL, string),
        pa.field(outputs.MODEL_VERSION, string),
        pa.field(outputs.MODEL_ID, string, nullable=False, metadata=PRIMARY_KEY),
        pa.field(outputs.ETAG, string),
        pa.field(outputs.VERSION_ID, string),
        pa.field(outputs.SIZE, pa.int64()),
        pa.field(outputs.RUN, string),
        pa.field(RUN_ORDER, string),
    ]
    return pa.schema(fields, metadata=metadata)


def read_chunk(files: Files, uri: str) -> Any:
    """One Parquet chunk as an Arrow table; a file that is not Sluice output is named."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with files.open(uri) as fh:
            table = pq.read_table(fh)
    except (OSError, pa.ArrowException) as exc:
        raise IndexBuildError(f"{uri} is not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    missing = [c for c in _REQUIRED if c not in table.column_names]
    if missing:
        raise IndexBuildError(f"{uri} is not Sluice output: no column {', '.join(missing)} (sluice.outputs)")
    emb = table.schema.field(outputs.EMBEDDING).type
    if not pa.types.is_fixed_size_list(emb) or emb.value_type not in (pa.float16(), pa.float32()):
        raise IndexBuildError(f"{uri}: embedding is {emb}, not fixed_size_list<float16|float32>[dim]")
    return table


def shape_of(table: Any, uri: str) -> Shape:
    """The model and dimension of one chunk's rows; a chunk mixing models is refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    models = pc.unique(table[outputs.MODEL_ID].cast(pa.string())).to_pylist()
    names = pc.unique(table[outputs.MODEL].cast(pa.string())).to_pylist()
    if len(models) != 1 or len(names) != 1:
        raise IndexBuildError(f"{uri} mixes models {sorted(map(str, models + names))}: one model a chunk")
    emb = table.schema.field(outputs.EMBEDDING).type
    dtype = "float16" if emb.value_type == pa.float16() else "float32"
    return Shape(str(names[0]), str(models[0]), int(emb.list_size), dtype)


def to_index_rows(table: Any, shape: Shape, order: str, run: str | None) -> Any:
    """Chunk rows cast to the index schema of `shape` (dictionary columns decoded, embeddings to its dtype)."""
    import pyarrow as pa

    schema = index_schema(shape)
    n = table.num_rows
    cols: list[Any] = []
    for f in schema:
        if f.name == RUN_ORDER:
            cols.append(pa.array([order] * n, pa.string()))
        elif f.name in table.column_names:
            cols.append(table[f.name].cast(f.type))
        elif f.name == outputs.RUN and run:
            cols.append(pa.array([run] * n, pa.string()))
        elif f.name in (outputs.PART, outputs.PART_START, outputs.PART_END):  # output from before parts: whole
            cols.append(pa.array([0] * n, f.type))
        else:
            cols.append(pa.nulls(n, f.type))
    return pa.table(cols, schema=schema)


def read_ahead(fn: Callable[[str], Any], uris: Iterable[str], window: int = READ_AHEAD) -> Iterator[tuple[str, Any]]:
    """(uri, fn(uri)) in order, up to `window` calls running ahead in threads."""
    todo = list(uris)
    with ThreadPoolExecutor(max(1, window)) as pool:
        pending = deque(pool.submit(fn, u) for u in todo[:window])
        for i, uri in enumerate(todo):
            result = pending.popleft().result()
            if i + window < len(todo):
                pending.append(pool.submit(fn, todo[i + window]))
            yield uri, result


def duplicate_key(files: Files, uris: Iterable[str]) -> str | None:
    """A key that two rows of `uris` hold, or None: what a set of Parquet files without a plan is checked for.

    A run's rows are unique by construction (its plan dedups the keys, commit markers settle
    each position once); files given as they are may overlap, and Lance inserts both rows of a
    key that the table does not hold yet. 64-bit hashes first, the strings only on a hash match.
    """
    import numpy as np
    import pyarrow.parquet as pq

    def keys(uri: str) -> list[str]:
        """The file's keys, one a key: its parts are one key's, written together."""
        try:
            with files.open(uri) as fh:
                return list(
                    dict.fromkeys(str(k) for k in pq.read_table(fh, columns=[outputs.KEY])[outputs.KEY].to_pylist())
                )
        except Exception:  # read_chunk names the file when the merge reads it
            return []

    todo = list(uris)
    hashes = np.concatenate(
        [np.fromiter((hash(k) for k in ks), np.int64, len(ks)) for _, ks in read_ahead(keys, todo)]
        or [np.zeros(0, np.int64)]
    )
    ordered = np.sort(hashes)
    suspects = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not suspects:
        return None
    seen: set[str] = set()
    for _, ks in read_ahead(keys, todo):
        for k in ks:
            if hash(k) in suspects:
                if k in seen:
                    return k
                seen.add(k)
    return None  # 64-bit hash collisions of different keys only
