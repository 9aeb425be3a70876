"""The approximate-nearest-neighbour index on `embedding`, and how searches use it.

IVF-PQ, cosine: the vectors are clustered into `num_partitions` lists (IVF) and each is
stored as `num_sub_vectors` one-byte codes (PQ); a search scans the `nprobes` nearest lists
by code, then re-ranks the best `k * refine_factor` candidates on the full vectors (exact
scores: Lance's refine step), so the scores returned are exact and recall depends on the
candidates only. Parameters come from the row count and the dimension:

    rows < MIN_ANN_ROWS       no ANN index: a search scans every row (exact); SLUICE_INDEX_MIN_ANN_ROWS
                              sets another threshold (read once, at import: tests lower it)
    num_partitions            ~ sqrt(rows), at least 16 (about sqrt(rows) vectors a list)
    num_sub_vectors           dim / 8 (8 dims per code byte; fewer codes when 8 does not divide dim)
    k-means                   KMEANS_ITERS iterations on SAMPLE_RATE vectors a list
    nprobes                   max(NPROBES_MIN, NPROBES_FRACTION of the lists)
    refine_factor             REFINE_FACTOR

Figures (recall@10 on unseen clustered data, build time, memory): docs/index.md and
bench/index.py. A table that grew past twice the rows its index was trained for is retrained;
smaller growth is added to the existing lists (Lance's optimize_indices).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

KIND = "IVF_PQ"
NONE = "none"
METRIC = "cosine"
COLUMN = "embedding"
# An exact scan of 20,000 x 256-d rows takes ~25 ms on one core. Never below 512: Lance trains the
# 256 PQ codes a sub-vector on at least 2 rows each (its trainers refuse a sample rate of 1).
MIN_ANN_ROWS = max(512, int(os.environ.get("SLUICE_INDEX_MIN_ANN_ROWS") or 20_000))
DEFAULT_NAME = "embedding_idx"  # Lance's name for an index on `embedding` (create_index's default)
MIN_PARTITIONS = 16
NPROBES_MIN = 20
NPROBES_FRACTION = 0.04
# Candidates re-ranked on the full vectors: k * REFINE_FACTOR. Clustered embeddings have many
# near neighbours whose PQ distances tie, more of them the bigger the table: recall@10 on 256-d
# clustered data was 0.87 with 10 and 1.0 with 20 at 200,000 rows, 0.944 with 30 and 0.9945 with
# 100 at 1,000,000 (nprobes 40 or 120 made no difference).
REFINE_FACTOR = 100
RETRAIN_GROWTH = 2.0
# k-means: 10 iterations on 64 sampled vectors a list (Lance's defaults: 50 and 256). Measured at
# 200,000 x 256-d float16 on 2 busy CPUs: 157 s and recall@10 0.995 against 373 s and 0.995 with 20
# iterations on the default sample.
KMEANS_ITERS = 10
SAMPLE_RATE = 64


@dataclass(frozen=True)
class AnnParams:
    """The index's build parameters for a table of `rows` rows of `dim` dimensions."""

    num_partitions: int
    num_sub_vectors: int

    @classmethod
    def derive(cls, rows: int, dim: int) -> AnnParams | None:
        """None below MIN_ANN_ROWS: a small table is searched exactly."""
        if rows < MIN_ANN_ROWS:
            return None
        partitions = max(MIN_PARTITIONS, round(math.sqrt(rows)))
        return cls(partitions, sub_vectors(dim))


def sub_vectors(dim: int) -> int:
    """PQ codes per vector: the most codes of at least 8 dims each that divide dim (dim / 8 mostly)."""
    for width in range(8, dim + 1):
        if dim % width == 0:
            return dim // width
    return 1


@dataclass(frozen=True)
class Probe:
    """How a search uses the index (frozen defaults; `sluice search` takes them as they are)."""

    nprobes: int
    refine_factor: int = REFINE_FACTOR

    @classmethod
    def for_partitions(cls, partitions: int) -> Probe:
        return cls(max(NPROBES_MIN, math.ceil(NPROBES_FRACTION * partitions)))


ANN_KEY = "sluice.ann"  # table config: the parameters the index was trained with


def vector_index(ds: Any) -> dict[str, Any] | None:
    """The ANN index on `embedding` as {"name", "type", "num_partitions"}, or None."""
    for idx in ds.describe_indices():
        if list(idx.field_names) == [COLUMN]:
            trained = json.loads(ds.config().get(ANN_KEY, "{}"))
            return {"name": idx.name, "type": str(idx.index_type), "num_partitions": trained.get("num_partitions")}
    return None


@dataclass(frozen=True)
class AnnPlan:
    """What a build does to the table's ANN index: NONE, "extend" (optimize_indices) or "train" (params)."""

    action: str
    name: str
    rows: int
    params: AnnParams | None = None


def plan_for(ds: Any) -> AnnPlan:
    """The one decision: no index, extend the trained lists (growth up to RETRAIN_GROWTH), or train anew."""
    rows = int(ds.count_rows())
    dim = int(ds.schema.field(COLUMN).type.list_size)
    want = AnnParams.derive(rows, dim)
    have = vector_index(ds)
    if want is None and have is None:
        return AnnPlan(NONE, DEFAULT_NAME, rows)
    if have is not None and (want is None or want.num_partitions <= RETRAIN_GROWTH * (have["num_partitions"] or 0)):
        return AnnPlan("extend", have["name"], rows)
    return AnnPlan(
        "train", have["name"] if have else DEFAULT_NAME, rows, want or AnnParams(MIN_PARTITIONS, sub_vectors(dim))
    )


def record(ds: Any, plan: AnnPlan, **extra: Any) -> None:
    """The parameters the index was trained with, in the table's config (probe_of reads them)."""
    assert plan.params is not None
    ds.update_config({ANN_KEY: json.dumps({**asdict(plan.params), "rows": plan.rows, "kind": KIND, **extra})})


def trained(ds: Any) -> dict[str, Any]:
    """What `record` wrote last ({} when nothing)."""
    return dict(json.loads(ds.config().get(ANN_KEY, "{}")))


def ensure(ds: Any) -> str:
    """Create, extend or retrain the ANN index for the table's current rows; returns the ANN kind."""
    plan = plan_for(ds)
    if plan.action == NONE:
        return NONE
    if plan.action == "extend":
        ds.optimize.optimize_indices(index_names=[plan.name])  # new rows into the trained lists
        return KIND
    assert plan.params is not None
    ds.create_index(
        COLUMN,
        KIND,
        metric=METRIC,
        replace=True,
        num_partitions=plan.params.num_partitions,
        num_sub_vectors=plan.params.num_sub_vectors,
        max_iters=KMEANS_ITERS,
        sample_rate=SAMPLE_RATE,
    )
    record(ds, plan)
    return KIND


def ensure_key_index(ds: Any) -> None:
    """A BTREE on key (`sluice search --key`); new rows are added to it on later builds."""
    names = [i.name for i in ds.describe_indices() if list(i.field_names) == ["key"]]
    if names:
        ds.optimize.optimize_indices(index_names=names)
    else:
        ds.create_scalar_index("key", "BTREE")


def probe_of(ds: Any) -> Probe | None:
    """The search parameters for the table's ANN index; None when it has none (an exact scan)."""
    have = vector_index(ds)
    if have is None:
        return None
    partitions = have["num_partitions"] or round(math.sqrt(max(1, int(ds.count_rows()))))
    return Probe.for_partitions(int(partitions))
