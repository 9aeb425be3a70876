"""Output records as Parquet: a row per part of a key, its embedding, its object's version and the model."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_worker.sources.fetch import ObjMeta
from sluice import outputs


@dataclass(frozen=True)
class RecordLabel:
    """What every row of one model's output says about the model and the run (sluice.outputs)."""

    model: str
    model_version: str
    model_id: str
    run: str


Part = tuple[int, float, float]  # (part, part_start, part_end) of one row (sluice.outputs)
WHOLE: Part = (0, 0.0, 0.0)  # an image: one part


def output_table(
    uris: Sequence[str],
    emb: np.ndarray,
    dtype: str,
    objs: Sequence[ObjMeta],
    label: RecordLabel,
    parts: Sequence[Part] | None = None,
) -> pa.Table:
    """A row per part of a key: its embedding, its object's version and the model (sluice.outputs)."""
    n, dim = emb.shape
    values = pa.array(np.ascontiguousarray(emb, dtype=np.dtype(dtype)).reshape(-1))
    const = {outputs.MODEL: label.model, outputs.MODEL_VERSION: label.model_version}
    const |= {outputs.MODEL_ID: label.model_id, outputs.RUN: label.run}
    schema = outputs.arrow_schema(dim, dtype)
    columns = {
        outputs.KEY: pa.array(list(uris), pa.string()),
        **_part_columns(parts or [WHOLE] * n),
        outputs.EMBEDDING: pa.FixedSizeListArray.from_arrays(values, dim),
        **{
            name: pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int8)), pa.array([value], pa.string()))
            for name, value in const.items()
        },
        outputs.ETAG: pa.array([o[0] or None for o in objs], pa.string()),
        outputs.VERSION_ID: pa.array([o[1] for o in objs], pa.string()),
        outputs.SIZE: pa.array([o[2] for o in objs], pa.int64()),
    }
    return pa.table([columns[f.name] for f in schema], schema=schema)


def table_bytes(table: pa.Table, metadata: dict[str, str]) -> bytes:
    """`table` as a zstd Parquet file, with `metadata` (each key prefixed "sluice.")."""
    table = table.replace_schema_metadata({f"sluice.{k}": str(v) for k, v in metadata.items()})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def _part_columns(parts: Sequence[Part]) -> dict[str, Any]:
    """The part, part_start and part_end columns of `parts`."""
    return {
        outputs.PART: pa.array([p[0] for p in parts], pa.int32()),
        outputs.PART_START: pa.array([p[1] for p in parts], pa.float64()),
        outputs.PART_END: pa.array([p[2] for p in parts], pa.float64()),
    }
