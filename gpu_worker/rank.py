"""One rank: a contiguous slice of the shard on one device, through the run's pass (images, or text and video parts).

Run in-process by the node when it has one rank, else as `python -m gpu_worker.rank SPEC`,
whose file holds the RankSpec and the plan (parsed once here). Module-level imports stay
torch-free: the image pass spawns loader processes, which must not pay for torch.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from typing import Any

from gpu_worker import watchdog
from gpu_worker.config import WorkerConfig
from gpu_worker.errors import report
from gpu_worker.fence import RankFence, SliceSpec, ahead_keys
from gpu_worker.log import logger, set_labels, setup
from gpu_worker.output import intervals
from gpu_worker.passes.base import RankPass, run_pass
from gpu_worker.passes.images import ImagePass
from gpu_worker.passes.parts import PartsPass
from gpu_worker.passes.work import RankContext, RankSpec, RankWork
from gpu_worker.procs import die_with_parent
from gpu_worker.sources.clients import control_store
from gpu_worker.telemetry.stats import Stats
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan


def run_rank(
    spec: RankSpec,
    plan: RunPlan,
    cfg: WorkerConfig,
    *,
    store: ObjectStore | None = None,
) -> dict[str, Any]:
    """Process this rank's slice; returns its summary. Raises WorkerError/RankFailed on failure."""
    started = time.perf_counter()
    set_labels(
        run=plan.run_id,
        shard=spec.shard,
        node=spec.node,
        attempt=spec.attempt,
        rank=spec.global_rank,
        local_rank=spec.local_rank,
        world=spec.world,
    )
    ctx = RankContext(spec, cfg, plan, store or control_store(), Stats())
    work = RankWork.of(ctx)
    summary: dict[str, Any] = {
        "global_rank": spec.global_rank,
        "local_rank": spec.local_rank,
        "slice": list(work.slice),
        "todo": intervals.count(work.remaining),
        "retry_todo": len(work.retry),
    }
    logger.info("rank starting", extra=dict(summary))
    if work.empty:
        summary.update(seconds=0.0, stats={}, chunks=0)
        return summary
    # Progress beats, and the watchdog that ends this rank when its count stops (gpu_worker.watchdog).
    ids = watchdog.target(plan.run_id, spec.shard, spec.attempt, spec.global_rank)
    todo = intervals.count(work.remaining) + len(work.retry)
    ctx.stats.incr("todo", todo)  # sluice_keys_left: the tail's alert reads it
    dog = watchdog.for_rank(ids, plan.stall_after_s, plan.load_grace_s, ctx.stats, cfg.beat_interval_s, todo)

    def split_off(keys: int) -> None:
        dog.shrink(keys)
        ctx.stats.incr("todo", -keys)

    # The tail's fence (gpu_worker.fence): keys start only below its reservation, and stop at a split.
    lo, hi = work.slice
    fence = RankFence(ids, SliceSpec(lo, hi, work.floor, ahead_keys(ctx.batch, lo, hi)), on_split=split_off)
    work = replace(work, fence=fence)
    try:
        kind: RankPass = ImagePass(ctx, work) if plan.content.kind == "image" else PartsPass(ctx, work)
        return run_pass(ctx, kind, summary, started)
    finally:
        dog.stop()


def spec_json(spec: RankSpec, plan: RunPlan) -> str:
    """A rank process's spec file: its RankSpec and the run's plan."""
    return json.dumps({"spec": asdict(spec), "plan": plan.model_dump(mode="json")})


def main(argv: list[str] | None = None) -> int:
    """`python -m gpu_worker.rank SPEC.json`: one rank process of a multi-rank node."""
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    with open(argv[0]) as fh:
        doc = json.load(fh)
    spec = RankSpec(**doc["spec"])
    try:
        cfg = WorkerConfig.from_env()
        setup(cfg.log_level)
        summary = run_rank(spec, RunPlan.model_validate(doc["plan"]), cfg)
    except Exception as exc:
        return report(exc, f"sluice-worker rank {spec.global_rank}", role="rank")
    with open(spec.summary_path, "w") as fh:
        json.dump(summary, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
