"""Array job of 3 children (loaders as threads, float32 output), real subprocesses against moto."""

from __future__ import annotations

import pyarrow as pa

from sluice.contracts.results import ShardResult
from tests.integration.conftest import check_complete, finish, make_run, read_run, start_worker, worker_env


def test_array_job_of_three_children(moto_server, dataset):
    n = len(dataset.keys)
    shards = [dataset.keys[: n // 3], dataset.keys[n // 3 : 2 * n // 3], dataset.keys[2 * n // 3 :]]
    plan = make_run(moto_server, "array-3", shards, output_dtype="float32", batch_size=8)
    procs = [
        start_worker(
            worker_env(
                moto_server,
                plan,
                AWS_BATCH_JOB_ARRAY_INDEX=str(i),
                SLUICE_SHARD_OFFSET="0",
                SLUICE_WORKER_LOADERS="0",
                SLUICE_WORKER_CHUNK_KEYS="64",
            )
        )
        for i in range(3)
    ]
    for i, proc in enumerate(procs):
        rc, err = finish(proc)
        assert rc == 0, f"child {i}: {err[-3000:]}"
    out = read_run(moto_server, plan)
    check_complete(dataset, plan, out, shards)
    schema = next(iter(out.files.values()))["schema"]
    assert schema.field("embedding").type == pa.list_(pa.float32(), 128)
    results = [ShardResult.model_validate(r) for r in out.results.values()]
    assert all(r.kind == "array" and r.attempt == 1 for r in results)


def test_output_is_readable_by_pyarrow_dataset_and_duckdb(moto_server, dataset, tmp_path):
    """pyarrow.dataset over the output prefix on S3 (hive partition shard=<i>; _commits/ is ignored),
    and DuckDB over the same files (float16 embeddings read as FLOAT[])."""
    import duckdb
    import pyarrow.dataset as ds
    from pyarrow import fs

    shards = [dataset.keys[:60], dataset.keys[60:120]]
    plan = make_run(moto_server, "dataset-2", shards)
    for i in range(2):
        env = worker_env(
            moto_server,
            plan,
            AWS_BATCH_JOB_ARRAY_INDEX=str(i),
            SLUICE_WORKER_LOADERS="0",
            SLUICE_WORKER_CHUNK_KEYS="25",
        )
        rc, err = finish(start_worker(env))
        assert rc == 0, err[-3000:]
    s3fs = fs.S3FileSystem(
        endpoint_override=moto_server.endpoint.removeprefix("http://"),
        scheme="http",
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
    )
    prefix = f"worker-control/runs/{plan.run_id}/output/"
    table = ds.dataset(prefix, filesystem=s3fs, format="parquet", partitioning="hive").to_table()
    want = sorted(
        f"s3://worker-images/{k}" for k in dataset.keys[:120] if f"s3://worker-images/{k}" in dataset.readable
    )
    assert sorted(table.column("key").to_pylist()) == want
    assert set(table.column("shard").to_pylist()) == {0, 1}
    assert isinstance(table.column("embedding").type, pa.FixedSizeListType)

    for info in s3fs.get_file_info(fs.FileSelector(prefix, recursive=True)):
        if info.path.endswith(".parquet"):
            with s3fs.open_input_file(info.path) as src:
                (tmp_path / info.path.replace("/", "_")).write_bytes(src.read())
    n, distinct, dims = duckdb.sql(
        f"select count(*), count(distinct key), min(len(embedding)) from '{tmp_path}/*.parquet'"
    ).fetchall()[0]
    assert (n, distinct, dims) == (len(want), len(want), 128)
