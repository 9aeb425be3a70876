"""The tail: a slow but moving rank's remaining keys split off to a new shard, exactly once.

A rank that keeps beating is never a stall, yet a throttled GPU, a noisy neighbour or a far
prefix can make it the run's last shard by hours while finished GPUs sit idle. From the beats
(each rank's processed keys, its todo, when it started and when its models were ready) the
sweep knows every running rank's rate and expected finish and the run's median shard time.
Once every shard has started, or SLUICE_SPLIT_FROM of them are done, a rank expected to take
more than SLUICE_SPLIT_AFTER x the median is split:

1. **decide** (pure: sluice.control.sweep.stragglers): the split point is where the slow rank
   and a new child, started now at the median rate after the run's start-up, would finish
   together, at or past the rank's reservation (sluice.contracts.tail) and leaving each side
   SLUICE_SPLIT_MIN_KEYS; within the cap of SLUICE_SPLIT_SHARE of the run's expected GPU time,
   and SLUICE_SPLIT_PER_SWEEP a sweep.
2. **commit** (one TransactWriteItems, `commit`): the fence's `split_at`, conditional on the
   rank's `reserved_to` not past it and no split before; the RUN item's passes gain the child's
   shard (conditional on the passes seen: the shard number is allocated once); a SPLIT# item
   (conditional put). A split that loses the race with the rank's reservation, or with another
   sweep, is refused whole: nothing of it is written.
3. **apply** (idempotent, `apply`, redone by the next sweep until the SPLIT# item says
   submitted): the child's shard file (the keys [at, hi) of the slow shard), its plan
   (plan-split-<j>.json), SubmitJob (adopted by name: sluice-<run>-split<j>), the RUN item's jobs
   (once), the SPLIT# item's job id.

The slow rank learns the split with its next reservation and stops before `at`; its shard's
result counts the handed keys as the child's (a handed marker). The child is a shard like any
other: its own beats, retries, stalls and result; it can be split again. The run is done when
every shard, split children included, is settled (sluice.control.completion.conclude).

Array and plain jobs only: an MNP node's job ends with its nodes, so a split child (a job on
the array queue) is not made for one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sluice.aws.ranged import RangedObject
from sluice.aws.store import ObjectStore
from sluice.contracts.events import RunProgress, SlowRank, SplitShard
from sluice.contracts.plan import JobLayout, RunPlan, load_plan
from sluice.contracts.tail import fence_key
from sluice.control.batch import RUN_TAG, job_request
from sluice.control.context import Context, run_paths
from sluice.control.sweep.stall import SWEPT, append_job, beat_items, plan_uri_of
from sluice.control.sweep.stragglers import Split, Tail, decide, slowest, views
from sluice.control.table.ddb import item, prefixed
from sluice.control.table.items import JobLayoutItem, PassItem, RunItem
from sluice.log import logger
from sluice.paths import SCRATCH_TAG
from sluice.plan.layout import write_plan
from sluice.shards import ShardReader, encode_shard

SPLIT_PREFIX = "SPLIT#"
SUBMITTED = "submitted"


def split_sk(shard: int, lo: int) -> str:
    return f"{SPLIT_PREFIX}{shard:06d}#{lo:09d}"


def commit(ctx: Context, run: RunItem, s: Split) -> bool:
    """Record the split once, in one transaction; False when it lost a race (refused whole)."""
    passes = run.passes or []
    entry = PassItem(first_shard=s.to, n_shards=1, split_of=s.shard)
    record = {"pk": run.run_id, "sk": split_sk(s.shard, s.lo), **s.event().model_dump(mode="json", exclude_none=True)}
    record |= {"lo": s.lo, "hi": s.hi, "attempt": s.attempt, "rank": s.rank, "state": "recorded"}
    floats = {k: {"N": str(record.pop(k))} for k in ("expected_s", "median_s", "child_s")}
    try:
        ctx.clients.dynamodb.transact_write_items(
            TransactItems=[
                {
                    "Update": {
                        "TableName": ctx.settings.beats_table,
                        "Key": item({"pk": run.run_id, "sk": fence_key(s.shard, s.lo, s.hi)}),
                        "UpdateExpression": "SET split_at = :at, split_to = :to",
                        "ConditionExpression": "attribute_exists(sk) AND attribute_not_exists(split_at) "
                        "AND reserved_to <= :at AND attempt = :a",
                        "ExpressionAttributeValues": item({":at": s.at, ":to": s.to, ":a": s.attempt}),
                    }
                },
                {
                    "Update": {
                        "TableName": ctx.settings.runs_table,
                        "Key": item({"pk": run.run_id, "sk": "RUN"}),
                        "UpdateExpression": "SET passes = list_append(passes, :p)",
                        "ConditionExpression": "size(passes) = :n AND #st IN (:s0, :s1, :s2)",
                        "ExpressionAttributeNames": {"#st": "status"},
                        "ExpressionAttributeValues": item(
                            {":p": [entry], ":n": len(passes), **{f":s{i}": st for i, st in enumerate(SWEPT)}}
                        ),
                    }
                },
                {
                    "Put": {
                        "TableName": ctx.settings.runs_table,
                        "Item": item(record) | floats,
                        "ConditionExpression": "attribute_not_exists(sk)",
                    }
                },
            ]
        )
    except ctx.clients.dynamodb.exceptions.TransactionCanceledException as exc:
        logger.info("split refused", extra={"run_id": run.run_id, "shard": s.shard, "at": s.at, "why": str(exc)[:300]})
        return False
    logger.info("split recorded", extra={"run_id": run.run_id, **s.event().model_dump()})
    return True


def apply(ctx: Context, run: RunItem, rec: Mapping[str, Any]) -> str:
    """Make a recorded split's child run (each step idempotent); its job id."""
    shard, to, at, hi = int(rec["shard"]), int(rec["to_shard"]), int(rec["at"]), int(rec["hi"])
    store = ObjectStore(ctx.clients.s3)
    plan = load_plan(store.get, plan_uri_of(run, shard))
    reader = ShardReader(RangedObject(store, plan.shard_uri(shard)))
    store.put(plan.shard_uri(to), encode_shard(list(reader.groups(at, hi))), tagging=SCRATCH_TAG)
    layout = JobLayout(kind="single", shard_offset=to, shard_count=1)
    child_plan: RunPlan = plan.model_copy(update={"n_shards": max(plan.n_shards, to + 1), "jobs": [layout]})
    uri = run_paths(run).split_plan(to)
    write_plan(store.put, uri, child_plan)
    req = job_request(child_plan, uri, layout, 0, ctx.settings)
    req["jobName"] = f"sluice-{run.run_id}-split{to}"[:128]
    req["tags"] = {RUN_TAG: run.run_id}
    job_id = ctx.batch.find(req["jobQueue"], req["jobName"]) or str(ctx.clients.batch.submit_job(**req)["jobId"])
    append_job(ctx, run.run_id, JobLayoutItem(id=job_id, **layout.model_dump()))
    ctx.clients.dynamodb.update_item(
        TableName=ctx.settings.runs_table,
        Key=item({"pk": run.run_id, "sk": split_sk(shard, int(rec["lo"]))}),
        UpdateExpression="SET #st = :s, job_id = :j",
        ExpressionAttributeNames={"#st": "state"},
        ExpressionAttributeValues=item({":s": SUBMITTED, ":j": job_id}),
    )
    return job_id


def splits(ctx: Context, run_id: str) -> list[dict[str, Any]]:
    """The run's SPLIT# items, as plain values."""
    return split_items(ctx.clients.dynamodb, ctx.settings.runs_table, run_id)


def split_items(dynamodb: Any, table: str, run_id: str) -> list[dict[str, Any]]:
    """The run's SPLIT# items in the runs table `table`, as plain values."""
    return prefixed(dynamodb, table, run_id, SPLIT_PREFIX)


def resume(ctx: Context, run: RunItem, known: list[dict[str, Any]]) -> list[str]:
    """Apply the recorded splits a sweep died before submitting (their SPLIT# items not yet submitted)."""
    done = []
    for rec in known:
        if rec.get("state") != SUBMITTED:
            done.append(f"split: shard {rec['shard']} -> {rec['to_shard']} resumed, job {apply(ctx, run, rec)}")
    return done


def sweep_tail(ctx: Context, run: RunItem, *, now: float, items: list[dict[str, Any]] | None = None) -> list[str]:
    """Finish recorded splits, then split the run's slow ranks; what it did (the sweep's actions).

    `items`: the run's beats table items when the caller read them (stall.beat_items), else read here.
    """
    if run.status not in SWEPT or not run.jobs or run.mode == "multinode" or ctx.settings.split_after <= 0:
        return []
    known = splits(ctx, run.run_id) if any(p.split_of is not None for p in run.passes or []) else []
    done = resume(ctx, run, known)
    if items is None:
        items = beat_items(ctx.clients.dynamodb, ctx.settings.beats_table, run.run_id)
    ranks = views(items)
    counts = ctx.records.counts(run.run_id)
    tail = Tail(
        now=now,
        shards_total=run.total_shards,
        shards_done=counts.shards_done + counts.shards_failed,
        next_shard=run.total_shards,
        spent_s=sum(float(r.get("child_s", 0)) for r in known),
    )
    made: list[SplitShard] = []
    for s in decide(ranks, tail, ctx.settings):
        fresh = ctx.ledger.get(run.run_id) if made else run
        if fresh is None or fresh.total_shards != s.to:
            break  # the run moved on (a split of another sweep): decide again next time
        if not commit(ctx, fresh, s):
            continue
        rec = {"shard": s.shard, "to_shard": s.to, "at": s.at, "hi": s.hi, "lo": s.lo}
        made.append(s.event(apply(ctx, fresh, rec)))
    if made:
        ctx.events.publish(
            RunProgress(
                run_id=run.run_id,
                shards_done=min(counts.shards_done, tail.shards_total + len(made)),
                shards_failed=min(counts.shards_failed, tail.shards_total + len(made)),
                shards_total=tail.shards_total + len(made),
                split=made,
            )
        )
    return done + [f"split: shard {m.shard} at {m.at}: {m.keys} keys to shard {m.to_shard}" for m in made]


def slow_ranks(ctx: Context, run_id: str) -> list[SlowRank]:
    """The running ranks expected to end last, for Run Progress: informational, so a failed read is none."""
    try:
        ranks = views(beat_items(ctx.clients.dynamodb, ctx.settings.beats_table, run_id))
    except Exception as exc:
        logger.warning("tail not read for progress", extra={"run_id": run_id, "error": f"{type(exc).__name__}: {exc}"})
        return []
    return [SlowRank(**r) for r in slowest(ranks, time.time())]


def split_figures(ctx: Context, run: RunItem) -> dict[str, Any]:
    """The outcome's splits, their keys and estimated GPU-hours (0 when the run made none)."""
    if not any(p.split_of is not None for p in run.passes or []):
        return {}
    known = splits(ctx, run.run_id)
    return {
        "splits": len(known),
        "split_keys": sum(int(r["keys"]) for r in known),
        "split_gpu_hours": round(sum(float(r["child_s"]) for r in known) / 3600, 4),
    }


__all__ = [
    "apply",
    "commit",
    "resume",
    "slow_ranks",
    "split_figures",
    "split_items",
    "split_sk",
    "splits",
    "sweep_tail",
]
