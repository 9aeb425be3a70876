"""A job's retry strategy in the local executor: its own, else what Batch would apply when moto does not echo it.

The retry strategy is the job's own `retryStrategy` from DescribeJobs. moto (5.2.5) does not
echo the one SubmitJob sent, so then: the rules (`evaluateOnExit`) are the job definition's
(DescribeJobDefinitions; moto lower-cases their actions, which Batch matches without regard
to case), or sluice.control.policy's when the definition has none; and `attempts` is the plan's
for a GPU job, which is what Sluice's SubmitJob sets (sluice.control.policy.retry_strategy(plan.attempts))
and which overrides the definition's, and the definition's for a CPU job (prepare, index), as
Sluice's SubmitJob passes the definition's own there.
"""

from __future__ import annotations

from typing import Any

from sluice.control.policy import EVALUATE_ON_EXIT
from sluice.control.table.items import RunItem

DEFAULT_ATTEMPTS = 3  # the manifest's default (sluice.contracts.manifest), when the plan cannot be read


def strategy_of(
    batch: Any, cache: dict[str, dict[str, Any] | None], j: dict[str, Any], row: RunItem | None
) -> dict[str, Any]:
    """The job's retryStrategy, or what Batch would apply when moto does not echo it (module docstring).

    A CPU job (no SLUICE_PLAN_URI: a prepare or index job) gets its definition's attempts too:
    Sluice's SubmitJob passes the definition's own (a unit test compares them). `cache` holds the
    job definitions' strategies already read, by ARN.
    """
    own = j.get("retryStrategy")
    if own:
        return dict(own)
    env = {e["name"]: e["value"] for e in (j.get("container") or {}).get("environment", [])}
    defined = definition_strategy(batch, cache, j.get("jobDefinition"))
    rules = tuple(defined.get("evaluateOnExit") or ()) if defined is not None else None
    if "SLUICE_PLAN_URI" not in env and defined is not None and defined.get("attempts"):
        attempts = int(defined["attempts"])
    else:
        attempts = plan_attempts(env.get("SLUICE_PLAN_URI") or (row.plan_uri if row else None))
    return {"attempts": attempts, "evaluateOnExit": list(rules if rules is not None else EVALUATE_ON_EXIT)}


def definition_strategy(batch: Any, cache: dict[str, dict[str, Any] | None], arn: str | None) -> dict[str, Any] | None:
    """The job definition's retryStrategy, None when it has none (cached per ARN in `cache`)."""
    if not arn:
        return None
    if arn not in cache:
        defs = batch.describe_job_definitions(jobDefinitions=[arn])["jobDefinitions"]
        strategy = defs[0].get("retryStrategy") if defs else None
        cache[arn] = dict(strategy) if strategy else None
    return cache[arn]


def plan_attempts(plan_uri: str | None) -> int:
    """The plan's attempts (what Sluice's SubmitJob puts in retryStrategy); the default if unreadable."""
    from sluice.aws.clients import client
    from sluice.aws.store import ObjectStore
    from sluice.contracts.plan import load_plan

    if not plan_uri:
        return DEFAULT_ATTEMPTS
    try:
        return load_plan(ObjectStore(client("s3")).get, plan_uri).attempts
    except Exception:
        return DEFAULT_ATTEMPTS
