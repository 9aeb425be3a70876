"""Exit codes and one-line reasons of `python -m gpu_worker` (no tracebacks for configuration errors)."""

from __future__ import annotations

import json

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.results import ShardResult
from sluice.paths import RunPaths
from tests.integration.conftest import CONTROL_BUCKET, make_run, run_worker, worker_env


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if not line.startswith("{")]  # drop JSON log lines
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_missing_plan_uri(moto_server):
    env = worker_env(moto_server, type("P", (), {"run_id": "x"})())
    del env["SLUICE_PLAN_URI"]
    rc, err = run_worker(env)
    assert rc == 2
    assert "SLUICE_PLAN_URI is not set" in _one_line(err)


def test_missing_shard_variables(moto_server, dataset):
    plan = make_run(moto_server, "cli-noshard", [dataset.keys[:5]])
    rc, err = run_worker(worker_env(moto_server, plan))
    assert rc == 2
    assert "AWS_BATCH_JOB_ARRAY_INDEX" in _one_line(err)


def test_multinode_node_count_mismatch(moto_server, dataset):
    plan = make_run(moto_server, "cli-mnp", [dataset.keys[:5], dataset.keys[5:10]], mode="multinode")
    rc, err = run_worker(worker_env(moto_server, plan, AWS_BATCH_JOB_NODE_INDEX="0", AWS_BATCH_JOB_NUM_NODES="3"))
    assert rc == 2
    assert "AWS_BATCH_JOB_NUM_NODES=3 but the plan has 2 shards" in _one_line(err)


def test_missing_plan_object(moto_server):
    env = worker_env(moto_server, type("P", (), {"run_id": "nope"})(), SLUICE_SHARD_INDEX="0")
    rc, err = run_worker(env)
    assert rc == 2
    assert "cannot read the plan" in _one_line(err)


def test_bad_setting(moto_server, dataset):
    plan = make_run(moto_server, "cli-setting", [dataset.keys[:5]])
    rc, err = run_worker(worker_env(moto_server, plan, SLUICE_SHARD_INDEX="0", SLUICE_WORKER_CHUNK_KEYS="lots"))
    assert rc == 2
    assert "SLUICE_WORKER_CHUNK_KEYS='lots': Input should be a valid integer" in _one_line(err)


def test_too_many_failures_exits_1_with_a_reason(moto_server, dataset):
    keys = dataset.keys[:40]  # includes corrupt/missing objects (the fixture interleaves them early)
    plan = make_run(moto_server, "cli-threshold", [keys], max_failed_fraction=0.0)
    bad = [k for k in keys if f"s3://worker-images/{k}" in dataset.expected_failures]
    assert bad
    rc, err = run_worker(worker_env(moto_server, plan, SLUICE_SHARD_INDEX="0", SLUICE_WORKER_LOADERS="0"))
    assert rc == 1
    line = _one_line(err)
    assert f"{len(bad)} of {len(keys)} keys failed" in line
    bucket, key = parse_s3_uri(RunPaths.in_bucket(CONTROL_BUCKET, plan.run_id).result(0))
    result = ShardResult.model_validate_json(moto_server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    assert result.ok is False and result.failed == len(bad)
    # The one-line verdict in result.json is what the log line (and "Run Failed") says.
    assert result.reason and result.reason in line and result.reason.startswith(f"{len(bad)} of {len(keys)} keys")
    assert all(f"{r} {n}" in result.reason for r, n in result.failed_by_reason.items())
    # The same shard passes with a looser threshold from the setting (no recomputation: all committed).
    rc, err = run_worker(
        worker_env(
            moto_server,
            plan,
            SLUICE_SHARD_INDEX="0",
            SLUICE_WORKER_LOADERS="0",
            SLUICE_WORKER_MAX_FAILED_FRACTION="0.5",
            AWS_BATCH_JOB_ATTEMPT="2",
        )
    )
    assert rc == 0, err
    # Log lines use the Lambdas' Powertools schema, with the worker's labels on each one.
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    done = next(x for x in lines if x["message"] == "shard done")
    assert {"timestamp", "level", "location", "service"} <= set(done)
    assert (done["service"], done["level"], done["run"], done["shard"], done["attempt"]) == (
        "sluice-worker",
        "INFO",
        plan.run_id,
        0,
        2,
    )
    assert all(x["service"] == "sluice-worker" and x["run"] == plan.run_id for x in lines)
