"""Shard selection from the AWS Batch environment, and worker settings."""

from __future__ import annotations

import re

import pytest

from gpu_worker.config import WorkerConfig, settings_table
from gpu_worker.env import plan_uri, select
from gpu_worker.errors import ConfigError
from sluice.contracts.plan import RunPlan
from tests.plans import run_plan


def plan(mode: str = "array", n_shards: int = 4, run_id: str = "r1") -> RunPlan:
    job = {"mode": mode, "nodes": n_shards} if mode == "multinode" else {}
    return run_plan(run_id, "s3://c/runs/r1/", n_shards=n_shards, total_keys=10, keys_per_shard=3, job=job)


def test_array_child_uses_offset_plus_index():
    a = select(plan(n_shards=12), {"AWS_BATCH_JOB_ARRAY_INDEX": "3", "SLUICE_SHARD_OFFSET": "8"})
    assert (a.shard, a.node, a.kind, a.attempt) == (11, 11, "array", 1)


def test_single_job_and_attempt():
    a = select(plan(), {"SLUICE_SHARD_INDEX": "2", "AWS_BATCH_JOB_ATTEMPT": "3"})
    assert (a.shard, a.kind, a.attempt) == (2, "single", 3)


def test_multinode():
    a = select(plan("multinode", 3), {"AWS_BATCH_JOB_NODE_INDEX": "2", "AWS_BATCH_JOB_NUM_NODES": "3"})
    assert (a.shard, a.node, a.num_nodes, a.kind) == (2, 2, 3, "multinode")


@pytest.mark.parametrize(
    ("mode", "env", "message"),
    [
        ("array", {}, "no shard to run"),
        ("array", {"AWS_BATCH_JOB_ARRAY_INDEX": "x"}, "AWS_BATCH_JOB_ARRAY_INDEX='x': Input should be a valid integer"),
        ("array", {"AWS_BATCH_JOB_ARRAY_INDEX": "4"}, "shard 4 is outside the plan's 4 shards"),
        ("array", {"AWS_BATCH_JOB_ARRAY_INDEX": "-1"}, "ARRAY_INDEX='-1': Input should be greater than or equal to 0"),
        ("array", {"AWS_BATCH_JOB_ARRAY_INDEX": "1", "SLUICE_SHARD_INDEX": "1"}, "both"),
        ("array", {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "4"}, "mode is 'array'"),
        ("multinode", {"AWS_BATCH_JOB_ARRAY_INDEX": "0"}, "AWS_BATCH_JOB_NODE_INDEX is not set"),
        ("multinode", {"AWS_BATCH_JOB_NODE_INDEX": "0"}, "AWS_BATCH_JOB_NUM_NODES is not set"),
        ("multinode", {"AWS_BATCH_JOB_NODE_INDEX": "0", "AWS_BATCH_JOB_NUM_NODES": "5"}, "plan has 4 shards"),
        ("multinode", {"AWS_BATCH_JOB_NODE_INDEX": "4", "AWS_BATCH_JOB_NUM_NODES": "4"}, "outside 0..3"),
        (
            "array",
            {"AWS_BATCH_JOB_ARRAY_INDEX": "0", "AWS_BATCH_JOB_ATTEMPT": "0"},
            "ATTEMPT='0': Input should be greater",
        ),
        ("array", {"AWS_BATCH_JOB_ARRAY_INDEX": "0", "SLUICE_RUN_ID": "other"}, "plan is for run 'r1'"),
    ],
)
def test_missing_or_inconsistent(mode, env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        select(plan(mode), env)


def test_plan_uri_required():
    with pytest.raises(ConfigError, match="SLUICE_PLAN_URI is not set"):
        plan_uri({})
    assert plan_uri({"SLUICE_PLAN_URI": "s3://b/runs/r/plan.json"}) == "s3://b/runs/r/plan.json"


def test_config_from_env_parses_and_round_trips():
    cfg = WorkerConfig.from_env(
        {
            "SLUICE_WORKER_CPU_RANKS": "3",
            "SLUICE_WORKER_AUTOCAST": "off",
            "SLUICE_WORKER_OUTPUT_DTYPE": "float32",
            "SLUICE_WORKER_BACKOFF_BASE_S": "0.5",
            "SLUICE_WORKER_LOADERS": "",
            "UNRELATED": "x",
        }
    )
    assert (cfg.cpu_ranks, cfg.autocast, cfg.output_dtype, cfg.backoff_base_s, cfg.loaders) == (
        3,
        False,
        "float32",
        0.5,
        -1,
    )
    assert WorkerConfig.from_env(cfg.to_env()) == cfg


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLUICE_WORKER_CPU_RANKS": "0"}, "SLUICE_WORKER_CPU_RANKS='0': Input should be greater than or equal to 1"),
        ({"SLUICE_WORKER_CPU_RANKS": "two"}, "CPU_RANKS='two': Input should be a valid integer"),
        ({"SLUICE_WORKER_DEVICE": "tpu"}, "DEVICE='tpu': Input should be 'auto', 'cpu' or 'cuda'"),
        ({"SLUICE_WORKER_AUTOCAST": "maybe"}, "AUTOCAST='maybe': Input should be a valid boolean"),
        ({"SLUICE_WORKER_LOADERS": "-2"}, "LOADERS='-2': Input should be greater than or equal to -1"),
        ({"SLUICE_WORKER_MAX_FAILED_FRACTION": "1.5"}, "FRACTION='1.5': Input should be less than or equal to 1"),
    ],
)
def test_config_errors_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        WorkerConfig.from_env(env)


def test_config_error_is_a_settings_error_and_replace_revalidates():
    from sluice.errors import SettingsError

    with pytest.raises(SettingsError, match="SLUICE_WORKER_CHUNK_KEYS=0"):
        WorkerConfig().replace(chunk_keys=0)
    assert WorkerConfig().replace(decode_threads=3).decode_threads == 3


def test_container_variables_are_typed():
    from gpu_worker.env import ContainerEnv

    env = ContainerEnv.from_env({"SLUICE_REMOTE_WRITE_URL": " https://aps/x ", "SLUICE_INSTANCE_TYPE": "g6.xlarge"})
    assert (env.remote_write_url, env.instance_type, env.shard_offset, env.shard_index) == (
        "https://aps/x",
        "g6.xlarge",
        0,
        None,
    )
    with pytest.raises(ConfigError, match="SLUICE_SHARD_OFFSET='x'"):
        ContainerEnv.from_env({"SLUICE_SHARD_OFFSET": "x"})


def test_settings_table_lists_every_setting():
    table = settings_table()
    assert "`SLUICE_WORKER_CPU_RANKS` | `1`" in table
    assert table.count("\n") == len(WorkerConfig.model_fields) + 1


def test_docs_list_the_current_settings():
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "worker.md"
    assert settings_table() in doc.read_text(), "docs/worker.md: paste gpu_worker.config.settings_table()"


@pytest.mark.parametrize(
    "device, cpus, world, cfg, expected",
    [
        # CPU: loader threads in the rank (no process), decode and torch share the rank's CPUs
        ("cpu", 2, 1, WorkerConfig(), (0, 2, 2)),
        ("cpu", 8, 2, WorkerConfig(), (0, 4, 4)),
        # GPU: loader processes, CPUs per rank - 1 (at most 8); torch threads capped at 4
        ("cuda", 16, 1, WorkerConfig(), (8, 2, 4)),
        ("cuda", 96, 8, WorkerConfig(), (8, 1, 4)),
        ("cuda", 4, 4, WorkerConfig(), (1, 1, 1)),
        # explicit settings win
        ("cpu", 2, 1, WorkerConfig(loaders=1, decode_threads=3, torch_threads=1), (1, 3, 1)),
        ("cuda", 16, 1, WorkerConfig(loaders=0), (0, 16, 4)),
    ],
)
def test_loader_plan_per_device(monkeypatch, device, cpus, world, cfg, expected):
    import gpu_worker.passes.loader_pool as rank

    monkeypatch.setattr(rank, "cpu_count", lambda: cpus)  # the machine's size, not our logic
    assert rank.plan_loaders(cfg, device, world) == expected
