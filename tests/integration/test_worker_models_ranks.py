"""Two models, two rank processes with loader processes, real S3 GETs on moto: each key fetched once."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import pyarrow.parquet as pq

from gpu_worker.procs import cpu_count
from sluice.contracts.results import ShardResult
from sluice.contracts.sections import ModelSpec
from tests.integration.conftest import CONTROL_BUCKET, FaultServer, finish, make_run, start_worker, worker_env
from tests.plans import run_plan
from tests.properties import examples


def two_models_two_ranks(moto_server: FaultServer, run_id: str, keys: list[str]) -> tuple[Any, dict[str, str]]:
    """A run of models a and b over `keys` and the environment of its node: two CPU ranks, one loader process each."""
    plan = make_run(moto_server, run_id, [keys], batch_size=8)
    models = [
        ModelSpec(uri="builtin:reference-cnn", batch_size=8, image_size=64, name="a"),
        ModelSpec(uri="builtin:reference-cnn", batch_size=8, image_size=32, name="b"),
    ]
    planned = run_plan("x", "s3://x/", total_keys=1, model=models).models
    plan = plan.model_copy(update={"models": planned})
    s3 = moto_server.client()
    s3.put_object(Bucket=CONTROL_BUCKET, Key=f"runs/{plan.run_id}/plan.json", Body=plan.model_dump_json())
    env = worker_env(
        moto_server, plan, SLUICE_SHARD_INDEX="0", SLUICE_WORKER_CPU_RANKS="2", SLUICE_WORKER_LOADERS="1",
        SLUICE_WORKER_CHUNK_KEYS="16",
    )  # fmt: skip
    return plan, env


def test_two_models_two_ranks_loader_processes(moto_server, dataset):
    keys = dataset.keys[:80]
    plan, env = two_models_two_ranks(moto_server, "models-2", keys)
    s3 = moto_server.client()
    rc, err = finish(start_worker(env))
    assert rc == 0, err[-3000:]
    result = ShardResult.model_validate_json(
        s3.get_object(Bucket=CONTROL_BUCKET, Key=f"runs/{plan.run_id}/shards/0.result.json")["Body"].read()
    )
    assert result.world == 2 and set(result.processed_by_model) == {"a", "b"}
    assert result.processed_by_model["a"] == result.processed_by_model["b"] == result.processed
    # One GET per key for both models: every key read is embedded, or failed after its bytes came.
    unread = sum(n for r, n in result.failed_by_reason.items() if r in ("missing", "access_denied", "too_large"))
    assert result.stats["s3_gets"] == len(keys) - unread == result.processed + result.failed - unread
    for name in ("a", "b"):
        prefix = f"runs/{plan.run_id}/output/model_name={name}/shard=0/"
        listed = s3.list_objects_v2(Bucket=CONTROL_BUCKET, Prefix=prefix)["Contents"]
        rows = []
        for o in listed:
            if o["Key"].endswith(".parquet"):
                body = s3.get_object(Bucket=CONTROL_BUCKET, Key=o["Key"])["Body"].read()
                rows += pq.read_table(io.BytesIO(body)).to_pylist()
        assert len(rows) == len({r["key"] for r in rows}) == result.processed, name
        assert {r["model"] for r in rows} == {name} and all(r["etag"] for r in rows)


def test_ranks_exit_cleanly_beside_busy_cpus(moto_server, dataset):
    """The same shape, run after run beside busy CPU loops: every rank exits 0, none aborts on its way out.

    A rank once aborted after committing all its work ("terminate called without an active
    exception", exit -6): its torch models were freed on a metrics thread while the interpreter
    finalized (gpu_worker.telemetry.serve). Contention moved that thread into the window; the
    unit test of the rank's end (tests/unit/test_worker_node.py) checks the cause itself.
    SLUICE_PROPERTY_EXAMPLES sets the number of runs.
    """
    keys = dataset.keys[:16]
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(min(cpu_count(), 8))]
    try:
        for run in range(examples(2)):
            _, env = two_models_two_ranks(moto_server, f"exits-{run}", keys)
            rc, err = finish(start_worker(env))
            assert rc == 0 and "terminate called" not in err, f"run {run}: exit {rc}\n{err[-3000:]}"
    finally:
        for p in busy:
            p.kill()
            p.wait()
