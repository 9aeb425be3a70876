"""Multi-node parallel job: 2 nodes x 2 CPU ranks (loader processes), real subprocesses against moto."""

from __future__ import annotations

import pyarrow as pa

from sluice.contracts.results import ShardResult
from tests.integration.conftest import check_complete, finish, make_run, read_run, start_worker, worker_env


def test_two_nodes_two_ranks_each(moto_server, dataset):
    half = len(dataset.keys) // 2
    shards = [dataset.keys[:half], dataset.keys[half:]]
    plan = make_run(moto_server, "mnp-2x2", shards, mode="multinode")
    procs = [
        start_worker(
            worker_env(
                moto_server,
                plan,
                AWS_BATCH_JOB_NODE_INDEX=str(node),
                AWS_BATCH_JOB_NUM_NODES="2",
                SLUICE_WORKER_CPU_RANKS="2",
                SLUICE_WORKER_LOADERS="1",
                SLUICE_WORKER_CHUNK_KEYS="40",
            )
        )
        for node in (0, 1)
    ]
    for node, proc in enumerate(procs):
        rc, err = finish(proc)
        assert rc == 0, f"node {node}: {err[-3000:]}"
    out = read_run(moto_server, plan)
    check_complete(dataset, plan, out, shards)
    # Global rank = node x ranks + local rank: node 1's chunks come from ranks 2 and 3.
    ranks = {(int(k.split("shard=")[1].split("/")[0]), m["rank"]) for k, m in out.markers.items()}
    assert ranks == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert {ShardResult.model_validate(r).world for r in out.results.values()} == {2}
    # Output schema: key string, embedding fixed_size_list<float16>[128].
    schema = next(iter(out.files.values()))["schema"]
    assert schema.field("key").type == pa.string()
    assert schema.field("embedding").type == pa.list_(pa.float16(), 128)
