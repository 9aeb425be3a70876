"""What this container runs, from its environment (and a clear error when unsure).

Array child:   shard = SLUICE_SHARD_OFFSET (default 0) + AWS_BATCH_JOB_ARRAY_INDEX
Single job:    shard = SLUICE_SHARD_INDEX (a run with one shard is submitted as a plain job)
Multi-node:    shard = SLUICE_SHARD_OFFSET + AWS_BATCH_JOB_NODE_INDEX, and
               AWS_BATCH_JOB_NUM_NODES must equal the plan's n_shards
Attempt:       SLUICE_ATTEMPT_BASE (0 unless Sluice re-submitted a stalled shard) + AWS_BATCH_JOB_ATTEMPT
               (1-based, default 1)

Every variable the worker reads besides its SLUICE_WORKER_* settings (gpu_worker.config) is
a field of ContainerEnv (set by the job definition or the local executor) or BatchEnv (set
by AWS Batch); both read and validate like the settings do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from gpu_worker.config import WorkerSettings
from gpu_worker.errors import ConfigError

if TYPE_CHECKING:
    from sluice.contracts.plan import RunPlan


class ContainerEnv(WorkerSettings):
    """SLUICE_* variables of the job definition (template.yaml) or the local executor."""

    env_prefix: ClassVar[str] = "SLUICE_"

    plan_uri: str = Field("", description="runs/<run>/plan.json (s3:// URI or a path)")
    run_id: str = Field("", description="when set, must be the plan's run id")
    shard_offset: int = Field(0, ge=0, description="first shard of this array or MNP job")
    shard_index: int | None = Field(None, ge=0, description="the shard of a single (non-array) job")
    remote_write_url: str = Field("", description="AMP remote-write URL; wins over the plan's")
    instance_type: str = Field("", description="the instance type label when DMI does not say")
    beats_table: str = Field("", description="DynamoDB table of progress beats (gpu_worker.watchdog); empty: none")
    stall_after_s: float | None = Field(
        None, gt=0, description="no progress this long ends the attempt; wins over the plan's"
    )
    attempt_base: int = Field(0, ge=0, description="attempts before this job (a stalled shard re-submitted by Sluice)")


class BatchEnv(WorkerSettings):
    """AWS_BATCH_JOB_* variables AWS Batch sets in every container."""

    env_prefix: ClassVar[str] = "AWS_BATCH_JOB_"

    attempt: int = Field(1, ge=1, description="1-based attempt of the job")
    array_index: int | None = Field(None, ge=0, description="index of an array child")
    node_index: int | None = Field(None, ge=0, description="node of a multi-node parallel job")
    num_nodes: int | None = Field(None, ge=1, description="nodes of a multi-node parallel job")


@dataclass(frozen=True)
class Assignment:
    """This container's share of the run."""

    shard: int
    node: int  # node index of a multi-node job; the shard index for array/single jobs
    num_nodes: int
    attempt: int
    kind: Literal["array", "single", "multinode"]


def plan_uri(env: Mapping[str, str] | None = None) -> str:
    uri = ContainerEnv.from_env(env).plan_uri
    if not uri:
        raise ConfigError("SLUICE_PLAN_URI is not set: point it at runs/<run>/plan.json (s3:// URI or a path)")
    return uri


def select(plan: RunPlan, env: Mapping[str, str] | None = None) -> Assignment:
    """The shard, node and attempt of this container; ConfigError names what is missing or inconsistent."""
    box, batch = ContainerEnv.from_env(env), BatchEnv.from_env(env)
    if box.run_id and box.run_id != plan.run_id:
        raise ConfigError(f"SLUICE_RUN_ID={box.run_id!r} but the plan is for run {plan.run_id!r}")
    kind: Literal["array", "single", "multinode"]
    if plan.mode == "multinode" or batch.node_index is not None or batch.num_nodes is not None:
        if plan.mode != "multinode":
            raise ConfigError("AWS_BATCH_JOB_NODE_INDEX is set but the plan's mode is 'array'")
        node, nodes = _mnp_node(plan, batch)
        shard, kind, node_label, n_nodes = box.shard_offset + node, "multinode", node, nodes
    elif box.shard_index is not None:
        if batch.array_index is not None:
            raise ConfigError("both SLUICE_SHARD_INDEX and AWS_BATCH_JOB_ARRAY_INDEX are set: expected one")
        shard = box.shard_index
        kind, node_label, n_nodes = "single", shard, plan.n_shards
    else:
        if batch.array_index is None:
            raise ConfigError(
                "no shard to run: set AWS_BATCH_JOB_ARRAY_INDEX (array child), SLUICE_SHARD_INDEX (single job) "
                "or AWS_BATCH_JOB_NODE_INDEX + AWS_BATCH_JOB_NUM_NODES (multi-node plan)"
            )
        shard = box.shard_offset + batch.array_index
        kind, node_label, n_nodes = "array", shard, plan.n_shards
    if shard >= plan.n_shards:
        raise ConfigError(f"shard {shard} is outside the plan's {plan.n_shards} shards (0..{plan.n_shards - 1})")
    attempt = box.attempt_base + batch.attempt
    return Assignment(shard=shard, node=node_label, num_nodes=n_nodes, attempt=attempt, kind=kind)


def _mnp_node(plan: RunPlan, batch: BatchEnv) -> tuple[int, int]:
    """(node index, node count) of a multi-node job, checked against the plan."""
    node, nodes = batch.node_index, batch.num_nodes
    if node is None or nodes is None:
        missing = BatchEnv.variable("node_index" if node is None else "num_nodes")
        raise ConfigError(f"multi-node plan: {missing} is not set (AWS Batch sets it on every node of an MNP job)")
    if nodes != plan.n_shards:
        raise ConfigError(f"AWS_BATCH_JOB_NUM_NODES={nodes} but the plan has {plan.n_shards} shards (one per node)")
    if node >= nodes:
        raise ConfigError(f"AWS_BATCH_JOB_NODE_INDEX={node} is outside 0..{nodes - 1}")
    return node, nodes


def instance_type(configured: str = "") -> str:
    """`configured` (SLUICE_INSTANCE_TYPE, ContainerEnv) when set, else the EC2 instance type (Nitro
    exposes it via DMI), else "local"."""
    if configured:
        return configured
    try:
        with open("/sys/devices/virtual/dmi/id/product_name", encoding="ascii") as fh:
            name = fh.read().strip()
        if "." in name and name.replace(".", "").replace("-", "").isalnum():
            return name
    except OSError:
        pass
    return "local"
