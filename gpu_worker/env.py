"""Which shard this container runs, from the AWS Batch environment (and a clear error when unsure).

Array child:   shard = SLUICE_SHARD_OFFSET (default 0) + AWS_BATCH_JOB_ARRAY_INDEX
Single job:    shard = SLUICE_SHARD_INDEX (a run with one shard is submitted as a plain job)
Multi-node:    shard = SLUICE_SHARD_OFFSET + AWS_BATCH_JOB_NODE_INDEX, and
               AWS_BATCH_JOB_NUM_NODES must equal the plan's n_shards
Attempt:       AWS_BATCH_JOB_ATTEMPT (1-based, default 1)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpu_worker.errors import ConfigError
from sluice.models import RunPlan


@dataclass(frozen=True)
class Assignment:
    """This container's share of the run."""

    shard: int
    node: int  # node index of a multi-node job; the shard index for array/single jobs
    num_nodes: int
    attempt: int
    kind: Literal["array", "single", "multinode"]


def plan_uri(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    uri = env.get("SLUICE_PLAN_URI", "").strip()
    if not uri:
        raise ConfigError("SLUICE_PLAN_URI is not set: point it at runs/<run>/plan.json (s3:// URI or a path)")
    return uri


def _int(env: Mapping[str, str], name: str, default: int | None = None, minimum: int = 0) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        if default is None:
            raise ConfigError(f"{name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")
    return value


def select(plan: RunPlan, env: Mapping[str, str] | None = None) -> Assignment:
    """The shard, node and attempt of this container; ConfigError names what is missing or inconsistent."""
    env = os.environ if env is None else env
    run_id = env.get("SLUICE_RUN_ID", "").strip()
    if run_id and run_id != plan.run_id:
        raise ConfigError(f"SLUICE_RUN_ID={run_id!r} but the plan is for run {plan.run_id!r}")
    attempt = _int(env, "AWS_BATCH_JOB_ATTEMPT", 1, minimum=1)
    offset = _int(env, "SLUICE_SHARD_OFFSET", 0)
    has_node = any(env.get(v, "").strip() for v in ("AWS_BATCH_JOB_NODE_INDEX", "AWS_BATCH_JOB_NUM_NODES"))
    if plan.mode == "multinode" or has_node:
        if plan.mode != "multinode":
            raise ConfigError("AWS_BATCH_JOB_NODE_INDEX is set but the plan's mode is 'array'")
        try:
            node = _int(env, "AWS_BATCH_JOB_NODE_INDEX")
            nodes = _int(env, "AWS_BATCH_JOB_NUM_NODES", minimum=1)
        except ConfigError as exc:
            raise ConfigError(f"multi-node plan: {exc} (AWS Batch sets it on every node of an MNP job)") from None
        if nodes != plan.n_shards:
            raise ConfigError(f"AWS_BATCH_JOB_NUM_NODES={nodes} but the plan has {plan.n_shards} shards (one per node)")
        if node >= nodes:
            raise ConfigError(f"AWS_BATCH_JOB_NODE_INDEX={node} is outside 0..{nodes - 1}")
        shard, kind, node_label, n_nodes = offset + node, "multinode", node, nodes
    elif env.get("SLUICE_SHARD_INDEX", "").strip():
        if env.get("AWS_BATCH_JOB_ARRAY_INDEX", "").strip():
            raise ConfigError("both SLUICE_SHARD_INDEX and AWS_BATCH_JOB_ARRAY_INDEX are set: expected one")
        shard = _int(env, "SLUICE_SHARD_INDEX")
        kind, node_label, n_nodes = "single", shard, plan.n_shards
    else:
        if not env.get("AWS_BATCH_JOB_ARRAY_INDEX", "").strip():
            raise ConfigError(
                "no shard to run: set AWS_BATCH_JOB_ARRAY_INDEX (array child), SLUICE_SHARD_INDEX (single job) "
                "or AWS_BATCH_JOB_NODE_INDEX + AWS_BATCH_JOB_NUM_NODES (multi-node plan)"
            )
        shard = offset + _int(env, "AWS_BATCH_JOB_ARRAY_INDEX")
        kind, node_label, n_nodes = "array", shard, plan.n_shards
    if shard >= plan.n_shards:
        raise ConfigError(f"shard {shard} is outside the plan's {plan.n_shards} shards (0..{plan.n_shards - 1})")
    return Assignment(shard=shard, node=node_label, num_nodes=n_nodes, attempt=attempt, kind=kind)  # type: ignore[arg-type]
