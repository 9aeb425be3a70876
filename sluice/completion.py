"""Batch job state changes -> run ledger -> "Run Progress" / "Run Succeeded" / "Run Failed".

Every update is idempotent and order-insensitive (sluice.ledger): a shard keeps the state
with the highest (attempt, state rank), a terminal state is final, and counters move in
the same DynamoDB transaction as the state they count. When every submitted job of the
run is terminal, one invocation wins a conditional claim (FINALIZING) and decides the
outcome from what the workers wrote (shards/<i>.result.json and failures/<i>.jsonl):
a final retry pass for transient failures, or exactly one outcome event.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from sluice.aws import Clients
from sluice.batch import BatchAdapter
from sluice.batch_events import TERMINAL, BatchJobStateChangeDetail
from sluice.coordinator import SCRATCH_TAG, load_plan
from sluice.ledger import Ledger
from sluice.log import logger
from sluice.models import TRANSIENT_FAILURE_REASONS, RunPlan, ShardLayout
from sluice.notify import EventPublisher
from sluice.s3uri import parse_s3_uri
from sluice.settings import Settings
from sluice.shards import encode_shard

ACTIVE = ("SUBMITTED", "RUNNING", "RETRYING")


@dataclass
class JobEventOutcome:
    """What handling one Batch event did."""

    status: str  # ignored | recorded | stale | finalized | retrying
    run_id: str | None = None
    reason: str | None = None
    shard: int | None = None
    published: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _queue_name(arn_or_name: str) -> str:
    return arn_or_name.rsplit("/", 1)[-1]


def handle_job_event(
    detail: BatchJobStateChangeDetail, *, settings: Settings | None = None, clients: Clients | None = None
) -> JobEventOutcome:
    """Record one job state change and, when the run's jobs are all terminal, decide the outcome."""
    settings = settings or Settings.from_env()
    clients = clients or Clients()
    run_id = detail.run_id
    ours = {_queue_name(settings.job_queue), _queue_name(settings.mnp_job_queue)}
    if run_id is None or _queue_name(detail.job_queue) not in ours:
        return JobEventOutcome("ignored", reason="not a Sluice job")
    ledger = Ledger(clients.dynamodb, settings.runs_table)
    run = ledger.get(run_id)
    if run is None or "jobs" not in run:
        logger.warning("event for an unknown or unsubmitted run", extra={"run_id": run_id, "job_id": detail.job_id})
        return JobEventOutcome("ignored", run_id, reason="unknown run")
    jobs = {j["id"]: j for j in run["jobs"]}
    job = jobs.get(detail.parent_id)
    if job is None:
        return JobEventOutcome("ignored", run_id, reason=f"job {detail.parent_id} is not one of the run's jobs")

    out = JobEventOutcome("recorded", run_id)
    events = EventPublisher(clients.events, settings.event_bus)
    idx = detail.child_index
    kind = job["kind"]
    is_shard_event = idx is not None or kind == "single"
    is_job_event = idx is None
    if is_shard_event:
        shard = int(job["shard_offset"]) + (idx or 0)
        if not 0 <= shard < int(run.get("shards", 0)) + _retry_shards(run):
            return JobEventOutcome("ignored", run_id, reason=f"shard {shard} outside the run")
        out.shard = shard
        terminal = detail.status in TERMINAL
        res = (
            _read_json(clients.s3, _control_bucket(run), f"runs/{run_id}/shards/{shard}.result.json")
            if terminal
            else None
        )
        applied = ledger.record_shard(
            run_id,
            shard,
            {
                "status": detail.status,
                "attempt": detail.attempt,
                "exit_code": detail.exit_code,
                "reason": detail.reason,
                "job_id": detail.job_id,
                "spot_reclaimed": detail.spot_reclaimed or None,
            },
            seq=detail.seq,
            terminal=terminal,
            failed=detail.status == "FAILED",
            keys_processed=int(res.get("processed", 0)) if res else 0,
            keys_failed=int(res.get("failed", 0)) if res else 0,
        )
        if not applied:
            out.status = "stale"
        elif detail.status == "RUNNING" and run["status"] == "SUBMITTED":
            ledger.mark_running(run_id)
        if applied and terminal and run["status"] in ACTIVE:
            fresh = ledger.get(run_id) or run
            events.publish(
                "Run Progress",
                {
                    "run_id": run_id,
                    "shards_done": int(fresh.get("shards_succeeded", 0)) + int(fresh.get("shards_failed", 0)),
                    "shards_failed": int(fresh.get("shards_failed", 0)),
                    "shards_total": int(fresh.get("shards", 0)) + _retry_shards(fresh),
                },
            )
            out.published.append("Run Progress")
    if is_job_event and detail.status in TERMINAL:
        first_time = ledger.record_job_terminal(run_id, detail.parent_id, detail.status, detail.reason)
        if not first_time and not is_shard_event:
            out.status = "stale"
    fresh = ledger.get(run_id) or run
    if fresh["status"] in ACTIVE and int(fresh.get("jobs_done", 0)) >= len(fresh["jobs"]):
        decided = finalize(run_id, settings=settings, clients=clients)
        if decided:
            out.status = "retrying" if decided == "Retry Pass" else "finalized"
            out.published.append(decided)
    return out


def _control_bucket(run: dict[str, Any]) -> str:
    return parse_s3_uri(str(run["plan_uri"]))[0]


def _retry_shards(run: dict[str, Any]) -> int:
    return sum(int(p["n_shards"]) for p in run.get("passes", [])[1:])


def _read_json(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())  # type: ignore[no-any-return]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise


def _failure_lines(s3: Any, bucket: str, key: str) -> list[dict[str, Any]]:
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return []
        raise
    out = []
    for line in body.iter_lines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                logger.warning("unreadable failures line", extra={"key": key})
    return out


def finalize(run_id: str, *, settings: Settings, clients: Clients) -> str | None:
    """Decide the run: a retry pass, or exactly one outcome event. None if another invocation has it."""
    ledger = Ledger(clients.dynamodb, settings.runs_table)
    run = ledger.begin_finalize(run_id)
    if run is None:
        return None
    try:
        return _decide(run, ledger, settings, clients)
    except BaseException:
        logger.exception("finalizing failed; releasing for the retried event", extra={"run_id": run_id})
        ledger.release_finalize(run_id, str(run.get("finalize_from", "RUNNING")))
        raise


def _decide(run: dict[str, Any], ledger: Ledger, settings: Settings, clients: Clients) -> str:
    s3 = clients.s3
    run_id = run["run_id"]
    plan = load_plan(s3, run["plan_uri"])
    control = plan.control_bucket
    passes = run.get("passes") or [{"first_shard": 0, "n_shards": plan.n_shards}]
    n_total = sum(int(p["n_shards"]) for p in passes)
    items = {int(i["shard"]): i for i in ledger.shard_items(run_id)}
    processed = failed = 0
    by_reason: Counter[str] = Counter()
    failed_shards: list[tuple[int, str]] = []
    for i in range(n_total):
        res = _read_json(s3, control, f"runs/{run_id}/shards/{i}.result.json")
        item = items.get(i, {})
        if item.get("status") == "FAILED" or res is None:
            why = item.get("reason") or "no result.json: the worker did not finish"
            code = item.get("exit_code")
            failed_shards.append((i, f"exit code {code}: {why}" if code is not None else why))
        if res is not None:
            processed += int(res.get("processed", 0))
            failed += int(res.get("failed", 0))
            by_reason.update({str(k): int(v) for k, v in (res.get("failed_by_reason") or {}).items()})
    retried = int(run.get("retried_keys", 0))
    failed -= retried  # keys re-run by a retry pass are counted by that pass's shards
    duration = round(time.time() - float(run.get("created_at", time.time())), 1)
    events = EventPublisher(clients.events, settings.event_bus)
    failures_uri = plan.failures_prefix

    last = passes[-1]
    if not failed_shards and len(passes) - 1 < plan.retry_failed:
        keys = _transient_keys(
            s3, control, run_id, range(int(last["first_shard"]), int(last["first_shard"]) + int(last["n_shards"]))
        )
        if keys:
            _start_retry_pass(run, plan, keys, n_total, ledger, settings, clients)
            return "Retry Pass"

    if failed_shards:
        names = ", ".join(f"shard {i} ({why})" for i, why in failed_shards[:10])
        more = f" and {len(failed_shards) - 10} more" if len(failed_shards) > 10 else ""
        reason = f"{len(failed_shards)} of {n_total} shards failed: {names}{more}"
        detail = {
            "run_id": run_id,
            "reason": reason,
            "shards_failed": [i for i, _ in failed_shards],
            "failed_keys_uri": failures_uri,
            "processed": processed,
            "failed": failed,
            "duration_s": duration,
        }
        events.publish("Run Failed", detail)
        ledger.finish(
            run_id,
            "FAILED",
            {
                "reason": reason,
                "processed": processed,
                "failed_keys": failed,
                "shards_failed_list": [i for i, _ in failed_shards],
                "finished_at": int(time.time()),
            },
        )
        logger.info("run failed", extra={"run_id": run_id, "reason": reason})
        return "Run Failed"
    detail = {
        "run_id": run_id,
        "processed": processed,
        "failed": failed,
        "output_prefix": plan.output_prefix,
        "duration_s": duration,
        "failed_by_reason": dict(by_reason),
        "failed_keys_uri": failures_uri,
        "retry_passes": len(passes) - 1,
    }
    events.publish("Run Succeeded", detail)
    ledger.finish(run_id, "SUCCEEDED", {"processed": processed, "failed_keys": failed, "finished_at": int(time.time())})
    logger.info("run succeeded", extra={"run_id": run_id, "processed": processed, "failed": failed})
    return "Run Succeeded"


def _transient_keys(s3: Any, bucket: str, run_id: str, shards: range) -> dict[str, list[str]]:
    """bucket -> keys whose last recorded failure in these shards is transient."""
    last: dict[str, str] = {}
    for i in shards:
        for line in _failure_lines(s3, bucket, f"runs/{run_id}/failures/{i}.jsonl"):
            if isinstance(line.get("key"), str):
                last[line["key"]] = str(line.get("reason"))
    out: dict[str, list[str]] = {}
    for uri, reason in last.items():
        if reason in TRANSIENT_FAILURE_REASONS:
            b, k = parse_s3_uri(uri)
            out.setdefault(b, []).append(k)
    return out


def _start_retry_pass(
    run: dict[str, Any],
    plan: RunPlan,
    keys: dict[str, list[str]],
    first: int,
    ledger: Ledger,
    settings: Settings,
    clients: Clients,
) -> None:
    """Write the transient failures as new shards after the existing ones and submit them."""
    run_id = run["run_id"]
    n_keys = sum(len(v) for v in keys.values())
    n = max(1, min(math.ceil(n_keys / plan.keys_per_shard), settings.max_array_size))
    flat = [(b, k) for b, ks in sorted(keys.items()) for k in ks]
    for j in range(n):
        part = flat[j * len(flat) // n : (j + 1) * len(flat) // n]
        groups: dict[str, list[str]] = {}
        for b, k in part:
            groups.setdefault(b, []).append(k)
        s3_put(
            clients.s3,
            plan.control_bucket,
            f"runs/{run_id}/shards/{first + j}.shard",
            encode_shard(sorted(groups.items())),
            tagging=SCRATCH_TAG,
        )
    pass_no = len(run.get("passes", [])) if run.get("passes") else 1
    layout = ShardLayout(kind="array" if n >= 2 else "single", shard_offset=first, shard_count=n)
    retry_plan = plan.model_copy(
        update={"n_shards": first + n, "jobs": [layout], "mode": "array", "spot_allowed": True}
    )
    plan_key = f"runs/{run_id}/plan-retry-{pass_no}.json"
    s3_put(clients.s3, plan.control_bucket, plan_key, retry_plan.model_dump_json(indent=2).encode())
    plan_uri = f"s3://{plan.control_bucket}/{plan_key}"
    # Job names continue the run's numbering (sluice-<run>-<n>) so events map back to the run.
    ids = BatchAdapter(clients.batch).submit(retry_plan, plan_uri, settings, start_index=len(run["jobs"]))
    ledger.finish(
        run_id,
        "RETRYING",
        {
            "jobs": [*run["jobs"], {"id": ids[0], **layout.model_dump()}],
            "job_ids": [*run.get("job_ids", []), *ids],
            "passes": [
                *run.get("passes", [{"first_shard": 0, "n_shards": plan.n_shards}]),
                {"first_shard": first, "n_shards": n},
            ],
            "retried_keys": int(run.get("retried_keys", 0)) + n_keys,
        },
    )
    EventPublisher(clients.events, settings.event_bus).publish(
        "Run Progress",
        {
            "run_id": run_id,
            "retry_pass": pass_no,
            "retry_keys": n_keys,
            "retry_shards": n,
            "shards_done": first,
            "shards_failed": 0,
            "shards_total": first + n,
        },
    )
    logger.info("retry pass submitted", extra={"run_id": run_id, "keys": n_keys, "shards": n, "jobs": ids})


def s3_put(s3: Any, bucket: str, key: str, data: bytes, tagging: str = "") -> None:
    """put_object; errors propagate (the finalizer releases its claim and the event is retried)."""
    s3.put_object(Bucket=bucket, Key=key, Body=data, **({"Tagging": tagging} if tagging else {}))
