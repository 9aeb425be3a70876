"""Two models, two rank processes with loader processes, real S3 GETs on moto: each key fetched once."""

from __future__ import annotations

import io

import pyarrow.parquet as pq

from sluice.contracts.results import ShardResult
from sluice.contracts.sections import ModelSpec
from tests.integration.conftest import CONTROL_BUCKET, finish, make_run, start_worker, worker_env
from tests.plans import run_plan


def test_two_models_two_ranks_loader_processes(moto_server, dataset):
    keys = dataset.keys[:80]
    plan = make_run(moto_server, "models-2", [keys], batch_size=8)
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
