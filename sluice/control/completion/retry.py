"""The retry pass: a concluded run's transient failures become new shards, submitted as a small job.

When every shard succeeded but the last pass left transient failures (s3_error_transient:
sluice.contracts.status.TRANSIENT_FAILURE_REASONS) and the manifest allows another pass
(`retry_failed`), the keys whose last failure in that pass is transient (read from the
failures files of the shards marked RETRY# only) are cut into shards numbered after the
existing ones, with their own plan (plan-retry-<k>.json), and submitted under the run's job
numbering (sluice-<run>-<n>: events map back to the run, a resubmission adopts the job):
FINALIZING -> RETRYING with a "Run Progress" naming the pass. The outcome waits for it
(sluice.control.completion.conclude).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pydantic import ValidationError

from sluice.aws.s3uri import parse_s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.events import RunProgress
from sluice.contracts.plan import JobLayout, RunPlan
from sluice.contracts.results import FailureLine
from sluice.contracts.status import TRANSIENT_FAILURE_REASONS, FailureReason, RunStatus
from sluice.control.completion.verdict import RunFigures
from sluice.control.context import Context, run_paths
from sluice.control.table.items import JobLayoutItem, PassItem, RunItem, main_passes
from sluice.log import logger
from sluice.paths import SCRATCH_TAG, RunPaths
from sluice.plan.layout import write_plan
from sluice.shards import encode_shard

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

RETRY_PASS = "Retry Pass"  # noqa: S105 - a detail-type-like label, not a secret


def start_pass(ctx: Context, run: RunItem, plan: RunPlan, t: RunFigures, passes: list[PassItem]) -> bool:
    """Submit a retry pass for the last pass's transient failures, if the manifest allows another: True when it did.

    `passes`: the run's passes so far (sluice.control.completion.conclude reads them from the RUN item).
    """
    mains = main_passes(passes)
    if len(mains) - 1 >= plan.retry_failed:
        return False
    # The last pass's shards, and the split children made from them (numbered after them).
    in_last = [i for i in t.transient_shards if i >= mains[-1].first_shard]
    keys = transient_keys(ctx.clients.s3, run_paths(run), in_last)
    if not keys:
        return False
    _submit_pass(ctx, run, plan, keys, passes)
    return True


def read_failures(s3: S3Client, paths: RunPaths, shard: int) -> list[FailureLine]:
    """The lines of failures/<i>.jsonl (empty when the file is missing); unreadable lines are logged and skipped."""
    raw = ObjectStore(s3).get_if_exists(paths.failures(shard))
    out = []
    for line in (raw or b"").splitlines():
        if line.strip():
            try:
                out.append(FailureLine.model_validate_json(line))
            except ValidationError:
                logger.warning("unreadable failures line", extra={"uri": paths.failures(shard)})
    return out


def transient_keys(s3: S3Client, paths: RunPaths, shards: list[int]) -> dict[str, list[str]]:
    """bucket -> keys whose last recorded failure in these shards is transient."""
    last: dict[str, FailureReason] = {}
    for i in shards:
        for line in read_failures(s3, paths, i):
            last[line.key] = line.reason
    out: dict[str, list[str]] = {}
    for uri, reason in last.items():
        if reason in TRANSIENT_FAILURE_REASONS:
            b, k = parse_s3_uri(uri)
            out.setdefault(b, []).append(k)
    return out


def _write_shards(s3: S3Client, plan: RunPlan, keys: dict[str, list[str]], first: int, n: int) -> None:
    """The transient failures, cut into n shards numbered from `first`."""
    flat = [(b, k) for b, ks in sorted(keys.items()) for k in ks]
    store = ObjectStore(s3)
    for j in range(n):
        groups: dict[str, list[str]] = {}
        for b, k in flat[j * len(flat) // n : (j + 1) * len(flat) // n]:
            groups.setdefault(b, []).append(k)
        store.put(plan.shard_uri(first + j), encode_shard(sorted(groups.items())), tagging=SCRATCH_TAG)


def _submit_pass(ctx: Context, run: RunItem, plan: RunPlan, keys: dict[str, list[str]], passes: list[PassItem]) -> None:
    """Write the transient failures as new shards after the existing ones and submit them (idempotent)."""
    first = sum(p.n_shards for p in passes)
    n_keys = sum(len(v) for v in keys.values())
    n = max(1, min(math.ceil(n_keys / plan.keys_per_shard), ctx.settings.max_array_size))
    _write_shards(ctx.clients.s3, plan, keys, first, n)
    pass_no = len(main_passes(passes))
    layout = JobLayout(kind="array" if n >= 2 else "single", shard_offset=first, shard_count=n)
    retry_plan = plan.model_copy(
        update={"n_shards": first + n, "jobs": [layout], "mode": "array", "spot_allowed": True}
    )
    plan_uri = run_paths(run).retry_plan(pass_no)
    write_plan(ObjectStore(ctx.clients.s3).put, plan_uri, retry_plan)
    # Job names continue the run's numbering (sluice-<run>-<n>) so events map back to the run,
    # and a resubmission after a crash finds the job it already submitted.
    jobs = run.jobs or []
    ids = ctx.batch.submit(retry_plan, plan_uri, ctx.settings, start_index=len(jobs))
    progress = RunProgress(
        run_id=run.run_id,
        retry_pass=pass_no,
        retry_keys=n_keys,
        retry_shards=n,
        shards_done=first,
        shards_failed=0,
        shards_total=first + n,
    )
    ctx.ledger.leave_finalizing(
        run.run_id,
        RunStatus.RETRYING,
        {
            "jobs": [*jobs, JobLayoutItem(id=ids[0], **layout.model_dump())],
            "job_ids": [*run.job_ids, *ids],
            "passes": [*passes, PassItem(first_shard=first, n_shards=n)],
            "retried_keys": run.retried_keys + n_keys,
        },
        outbox=progress,
    )
    logger.info("retry pass submitted", extra={"run_id": run.run_id, "keys": n_keys, "shards": n, "jobs": ids})


__all__ = ["RETRY_PASS", "read_failures", "start_pass", "transient_keys"]
