"""A distributed index build's work files: the plan, the trained models, the children's segments.

The IVF centroids and PQ codebook are Arrow arrays (fixed-size lists), stored as Arrow IPC
streams so the children get them bit for bit; a segment is Lance's `Index` dataclass as JSON.
"""

from __future__ import annotations

import base64
import uuid
from datetime import datetime
from typing import Any

from sluice.contracts import FleetChild, FleetPlan, FleetSegment, FleetTable
from sluice.index.storage import Files
from sluice.paths import fleet_path

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
