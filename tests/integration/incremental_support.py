"""Helpers for incremental-run tests: finished earlier runs with real-shaped output, the prepare stage run in-process.

Earlier output is written as the worker writes it (sluice.outputs' schema, a commit marker
after each Parquet chunk: gpu_worker/output/commits.py), to S3 (moto) or a local folder.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import PrepareSpec
from sluice.contracts.sections import ModelSpec
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control.table.ddb import item, value
from sluice.control.table.ledger import Ledger
from sluice.outputs import arrow_schema
from sluice.paths import shard_output_dir
from sluice.prepare import prepare_store
from sluice.prepare.mapper.worker import run_map
from sluice.prepare.reducer.worker import run_reduce
from tests.plans import run_plan

DIM = 4
Row = tuple[str, str, str | None]  # (s3://bucket/key, etag, version id)


def md5(data: bytes) -> str:
    """S3's ETag of a single-part upload."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def chunk_bytes(
    rows: Sequence[Row], model: str, model_id: str, run_id: str, dtype: str = "float16", parts: Sequence[int] = ()
) -> bytes:
    """One output chunk, as the worker writes it (sluice.outputs.arrow_schema); `parts`: each row's part (0)."""
    n = len(rows)
    part = list(parts) or [0] * n
    emb = np.random.default_rng(n).standard_normal((n, DIM)).astype(dtype)
    schema = arrow_schema(DIM, dtype)
    table = pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.string()),
            "part": pa.array(part, pa.int32()),
            "part_start": pa.array([float(10 * p) for p in part]),
            "part_end": pa.array([float(10 * p + 12) for p in part]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM),
            "model": pa.array([model] * n).dictionary_encode(),
            "model_version": pa.array([""] * n).dictionary_encode(),
            "model_id": pa.array([model_id] * n).dictionary_encode(),
            "etag": pa.array([r[1] for r in rows], pa.string()),
            "version_id": pa.array([r[2] for r in rows], pa.string()),
            "size": pa.array([100] * n, pa.int64()),
            "run": pa.array([run_id] * n).dictionary_encode(),
        }
    ).cast(schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def write_chunk(
    store: ObjectStore,
    shard_dir: str,
    name: str,
    rows: Sequence[Row],
    model: str,
    model_id: str,
    run_id: str,
    *,
    committed: bool = True,
) -> None:
    """A chunk and (unless `committed` is False: a killed attempt's leftover) its commit marker, after it."""
    store.put(shard_dir + name + ".parquet", chunk_bytes(rows, model, model_id, run_id))
    if committed:
        marker = {"version": 1, "name": name, "kind": "range", "file": name + ".parquet", "rows": len(rows)}
        store.put(shard_dir + "_commits/" + name + ".json", json.dumps(marker).encode())


def earlier_plan(
    run_id: str,
    base: str,
    models: Sequence[tuple[ModelSpec, str]],
    n_shards: int,
    total_keys: int,
    lineage: Sequence[str] = (),
    **sections: Any,
) -> RunPlan:
    """A finished run's plan: its models with their artifact ids (`sections`: its manifest's others, as run_plan's)."""
    return run_plan(
        run_id,
        base,
        n_shards=n_shards,
        total_keys=total_keys,
        model=[spec for spec, _ in models],
        model_ids=[model_id for _, model_id in models],
        lineage=lineage,
        **sections,
    )


def write_output(store: ObjectStore, plan: RunPlan, by_model: Sequence[Sequence[Row]], per_chunk: int = 3) -> None:
    """Each model's rows over the plan's shards, in chunks of `per_chunk` rows."""
    for m, rows in enumerate(by_model):
        for shard in range(plan.n_shards):
            mine = list(rows[shard :: plan.n_shards])
            d = shard_output_dir(plan.model_output_prefix(m), shard)
            for c in range(0, len(mine), per_chunk):
                name = f"part-0000-{c:09d}"
                write_chunk(
                    store, d, name, mine[c : c + per_chunk], plan.models[m].name, plan.models[m].model_id, plan.run_id
                )


def record_run(aws: Any, stack: Any, plan: RunPlan, status: RunStatus = RunStatus.SUCCEEDED) -> None:
    """The plan in the control bucket and the run's RUN item with `status` (as the completion path leaves it)."""
    store = prepare_store(aws.s3)
    store.put(plan.shards_prefix.removesuffix("shards/") + "plan.json", plan.model_dump_json().encode())
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim(plan.run_id, plan.manifest_uri)
    aws.dynamodb.update_item(
        TableName=stack.names["RunsTable"],
        Key=item({"pk": plan.run_id, "sk": "RUN"}),
        UpdateExpression="SET #s = :s, output_prefix = :o",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":s": value(status.value), ":o": value(plan.output_prefix)},
    )


def run_prepare(store: ObjectStore, spec: PrepareSpec) -> None:
    """Every map worker, then every reduce worker, in this process (the code the Batch jobs run)."""
    for w in range(spec.workers):
        run_map(spec, w, store)
    for r in range(spec.partitions):
        run_reduce(spec, r, store)


def prepare_events(stack: Any, run_id: str, job_ids: Sequence[str], spec: PrepareSpec) -> list[dict[str, Any]]:
    """The prepare jobs' terminal events (map, then reduce), as Batch sends them."""
    from sluice.control.batch import prepare_job_name
    from sluice.local.emulator.events import JobChange, attempt, batch_job_state_change

    out = []
    for jid, stage, size in zip(job_ids, ("map", "reduce"), (spec.workers, spec.partitions), strict=True):
        out.append(
            batch_job_state_change(
                JobChange(
                    job_id=jid,
                    job_name=prepare_job_name(run_id, stage),
                    job_queue=stack.names["PrepareJobQueue"],
                    status=JobStatus.SUCCEEDED,
                    run_id=run_id,
                    attempts=[attempt(1_000, 2_000, 0, "Essential container in task exited")],
                    array_size=size if size >= 2 else None,
                )
            )
        )
    return out
