"""A distributed index build's work files: the plan, the trained models, the children's segments.

The IVF centroids and PQ codebook are Arrow arrays (fixed-size lists), stored as Arrow IPC
streams so the children get them bit for bit; a segment is Lance's `Index` dataclass as JSON.
"""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from sluice.contracts.base import Written
from sluice.index.storage import Files
from sluice.paths import fleet_path

# ---- the files' models --------------------------------------------------------------------

# What the stages do to a table: "segments" (train trained the lists, children build segments,
# commit commits them), "extended" (train added the new rows to the existing lists: small growth),
# "none" (too few rows for an ANN index: exact scans). Children act on "segments" only.
FleetMode = Literal["segments", "extended", "none"]


class FleetTable(Written):
    """One model's table in a FleetPlan: what train merged and decided, and each child's fragments."""

    model: str
    model_id: str
    uri: str
    dim: int
    rows: int  # the table's rows at train's version
    version: int  # the Lance version train planned on: children read it, commit checks its fragments
    mode: FleetMode
    index_name: str = "embedding_idx"
    num_partitions: int | None = None
    num_sub_vectors: int | None = None
    ivf: str | None = None  # the trained IVF centroids (Arrow IPC) under the run's _fleet folder
    pq: str | None = None  # the trained PQ codebook (Arrow IPC)
    shares: list[list[int]] = Field(default_factory=list)  # shares[k]: fragment ids child k indexes
    merged: list[str] = Field(default_factory=list)
    skipped: list[str] = Field(default_factory=list)
    inserted: int = 0
    updated: int = 0
    merge_s: float = 0.0  # train's reading of the sources and merging into this table
    train_s: float = 0.0  # train's ANN decision on it: extending the lists, or training and dealing them


class FleetPlan(Written):
    """<index>/_fleet/<run>/plan.json: train's output, read by every segment child and by commit."""

    run_id: str
    index_uri: str
    children: int = Field(ge=1)
    started_at: float  # epoch s: train's start (RunIndexed's seconds run from it)
    accelerator: str | None = None  # "cuda" when training ran on a GPU
    tables: list[FleetTable]


class FleetSegment(Written):
    """One index segment a child built (lance.dataset.Index as JSON; details base64)."""

    table: str  # the table's URI
    uuid: str
    name: str
    fields: list[int]
    dataset_version: int
    fragment_ids: list[int]
    index_version: int
    created_at: str | None = None
    base_id: int | None = None
    files: list[tuple[str, int]] | None = None  # (path, size in bytes)
    details_type: str | None = None
    details: str | None = None
    covering_fields: list[int] = Field(default_factory=list)


class FleetChild(Written):
    """<index>/_fleet/<run>/segments/<child>.json: a segment child's work (empty when it had none)."""

    run_id: str
    child: int
    children: int
    segments: list[FleetSegment] = Field(default_factory=list)
    rows: int = 0
    seconds: float = 0.0
    peak_rss_mb: float = 0.0


PLAN = "plan.json"


def plan_uri(index: str, run_id: str) -> str:
    return fleet_path(index, run_id, PLAN)


def child_uri(index: str, run_id: str, child: int) -> str:
    return fleet_path(index, run_id, f"segments/{child}.json")


def model_uri(index: str, run_id: str, model: str, kind: str) -> str:
    """models/<model>.<ivf|pq>.arrow: one table's trained model."""
    return fleet_path(index, run_id, f"models/{model}.{kind}.arrow")


def read_plan(files: Files, index: str, run_id: str) -> FleetPlan:
    return FleetPlan.model_validate_json(files.read(plan_uri(index, run_id)))


def write_array(files: Files, uri: str, array: Any) -> None:
    """One Arrow array (the centroids or the codebook) as an IPC stream."""
    import pyarrow as pa

    table = pa.table({"v": array})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    files.write(uri, sink.getvalue().to_pybytes())


def read_array(files: Files, uri: str) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(files.read(uri)).read_all().column("v").combine_chunks()


def segment_uuid(run_id: str, table: FleetTable, child: int) -> str:
    """The same run, table version and child give the same segment: a retried child overwrites its own."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sluice-fleet/{run_id}/{table.uri}/{table.version}/{child}"))


def to_doc(idx: Any, table: str) -> FleetSegment:
    """lance.dataset.Index -> FleetSegment."""
    details = idx.index_details
    return FleetSegment(
        table=table,
        uuid=str(idx.uuid),
        name=idx.name,
        fields=list(idx.fields),
        dataset_version=int(idx.dataset_version),
        fragment_ids=sorted(int(f) for f in idx.fragment_ids),
        index_version=int(idx.index_version),
        created_at=idx.created_at.isoformat() if idx.created_at else None,
        base_id=idx.base_id,
        files=[(f.path, int(f.size_bytes)) for f in idx.files] if idx.files is not None else None,
        details_type=details[0] if details else None,
        details=base64.b64encode(details[1]).decode() if details else None,
        covering_fields=list(idx.covering_fields or []),
    )


def to_index(doc: FleetSegment) -> Any:
    """FleetSegment -> lance.dataset.Index, for commit_existing_index_segments."""
    from lance.dataset import Index, IndexFile

    return Index(
        uuid=doc.uuid,
        name=doc.name,
        fields=doc.fields,
        dataset_version=doc.dataset_version,
        fragment_ids=set(doc.fragment_ids),  # type: ignore[arg-type]  # Lance takes a set too
        index_version=doc.index_version,
        created_at=datetime.fromisoformat(doc.created_at) if doc.created_at else None,
        base_id=doc.base_id,
        files=[IndexFile(path=p, size_bytes=n) for p, n in doc.files] if doc.files is not None else None,
        index_details=(doc.details_type, base64.b64decode(doc.details))
        if doc.details_type and doc.details is not None
        else None,
        covering_fields=doc.covering_fields,
    )


def write_child(files: Files, index: str, result: FleetChild) -> None:
    files.write(child_uri(index, result.run_id, result.child), result.model_dump_json().encode())


def read_child(files: Files, index: str, run_id: str, child: int) -> FleetChild | None:
    uri = child_uri(index, run_id, child)
    if not files.exists(uri):
        return None
    return FleetChild.model_validate_json(files.read(uri))
