"""Completion at scale: the full Batch event set of a 30,000-shard run through the real handler.

    .venv/bin/python bench/completion_scale.py                    # 3,000 and 30,000 shards
    .venv/bin/python bench/completion_scale.py --shards 3000 --threads 8

For each size: a run submitted through the real manifest handler (keys_per_shard 1, so
30,000 shards are 3 array jobs of 10,000), every shard's result.json written as a worker
would, then every event Batch sends (each child RUNNABLE, STARTING, RUNNING, SUCCEEDED; each
parent PENDING, RUNNING, SUCCEEDED) in a random order from several threads to
sluice.control.completion.state_change.handle_job_event, against in-process moto (each DynamoDB request atomic,
as DynamoDB is). It prints events/s, DynamoDB and S3 calls per event, transactions retried,
and the seconds the concluding invocation took, against two earlier designs' finalize timed on
the same emulator in the same run: the tally from every SHARD item (a paginated Query of all
of them, the design before the counters and marks decided) and, earlier, every result.json
and failures file (2N+1 sequential GETs).

Emulator note: moto deep-copies every table a TransactWriteItems touches (for its rollback),
which makes each transaction O(table size) there and a 30,000-shard run O(N^2) in time and,
as moto keeps every model instance it creates, in memory; DynamoDB has no such cost. The
bench skips that copy (`cheap_transaction_snapshots`), which is right for this bench's
transactions: a cancelled one fails on its first item (the only conditional one whose
condition can fail here), before moto changed anything to roll back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class Counting:
    """A boto3 client whose calls are counted (and, for DynamoDB, one request at a time)."""

    def __init__(self, client: Any, counter: Counter[str], service: str, lock: threading.Lock | None) -> None:
        self._client, self._counter, self._service, self._lock = client, counter, service, lock

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._client, name)
        if not callable(fn) or name.startswith(("get_paginator", "meta")):
            return fn

        def call(*a: Any, **kw: Any) -> Any:
            self._counter[f"{self._service}.{name}"] += 1
            if self._lock is None:
                return fn(*a, **kw)
            with self._lock:
                return fn(*a, **kw)

        return call


def cheap_transaction_snapshots() -> None:
    """Make moto's per-transaction table backup free (see the module docstring)."""
    import copy
    import types

    import moto.dynamodb.models as models

    def snapshot(obj: Any, memo: Any = None) -> Any:
        # The table itself, not a copy: moto tracks every model instance it creates (a copy
        # per transaction would be kept for good, O(N^2) memory at 30,000 shards), and a
        # cancelled Sluice transaction changed nothing, so "restoring" the same object is right.
        return obj if isinstance(obj, models.Table) else copy.deepcopy(obj, memo)

    models.copy = types.SimpleNamespace(deepcopy=snapshot, copy=copy.copy)  # type: ignore[assignment]


def _events(run_id: str, jobs: list[Any], queue: str) -> list[dict[str, Any]]:
    from sluice.contracts.status import JobStatus
    from sluice.local.emulator.events import JobChange, attempt, batch_job_state_change

    out = []
    for n, job in enumerate(jobs):
        name = f"sluice-{run_id}-{n}"
        common = {"job_name": name, "job_queue": queue, "run_id": run_id}
        for st in (JobStatus.PENDING, JobStatus.RUNNING, JobStatus.SUCCEEDED):
            out.append(
                batch_job_state_change(JobChange(job_id=job.id, status=st, array_size=job.shard_count, **common))
            )
        for i in range(job.shard_count):
            cid = f"{job.id}:{i}"
            running = [attempt(1_000, None, None, "Task is running")]
            done = [attempt(1_000, 2_000, 0, "Essential container in task exited")]
            for st, att in (
                (JobStatus.RUNNABLE, []),
                (JobStatus.STARTING, []),
                (JobStatus.RUNNING, running),
                (JobStatus.SUCCEEDED, done),
            ):
                code = 0 if st == JobStatus.SUCCEEDED else None
                out.append(
                    batch_job_state_change(
                        JobChange(job_id=cid, status=st, attempts=att, exit_code=code, array_index=i, **common)
                    )
                )
    return out


def failing_shards(n: int, k: int) -> set[int]:
    """k shards spread over the run whose result.json is not ok (every key corrupt)."""
    return {i * n // k for i in range(k)} if k else set()


def _results(s3: Any, run_id: str, control: str, n: int, failing: set[int]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from sluice.aws.s3uri import parse_s3_uri
    from sluice.contracts.results import ShardResult
    from sluice.paths import RunPaths

    paths = RunPaths.in_bucket(control, run_id)

    def put(i: int) -> None:
        bad = i in failing
        r = ShardResult(
            run_id=run_id,
            shard=i,
            node=i,
            attempt=1,
            kind="array",
            device="cuda",
            world=8,
            seconds=60.0,
            pipeline_seconds=55.0,
            pipeline_window=[0.0, 55.0],
            resumed_chunks=0,
            stats={},
            n_keys=1,
            processed=int(not bad),
            failed=int(bad),
            failed_fraction=float(bad),
            max_failed_fraction=0.05,
            ok=not bad,
            failed_by_reason={"corrupt": 1} if bad else {},
            chunks=1,
        )
        bucket, key = parse_s3_uri(paths.result(i))
        s3.put_object(Bucket=bucket, Key=key, Body=r.model_dump_json().encode())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, range(n)))


def _baseline_finalize(s3: Any, run_id: str, control: str, n: int) -> float:
    """The previous finalize's S3 reads: every result.json and failures/<i>.jsonl, one after another."""
    from botocore.exceptions import ClientError

    from sluice.aws.s3uri import parse_s3_uri
    from sluice.paths import RunPaths

    paths = RunPaths.in_bucket(control, run_id)
    t = time.perf_counter()
    s3.get_object(Bucket=control, Key=parse_s3_uri(paths.plan)[1])["Body"].read()
    for i in range(n):
        for uri in (paths.result(i), paths.failures(i)):
            with contextlib.suppress(ClientError):  # no failures file: a 404, as on S3
                s3.get_object(Bucket=control, Key=parse_s3_uri(uri)[1])["Body"].read()
    return time.perf_counter() - t


def _items_finalize(dynamodb: Any, table: str, run_id: str, n: int) -> tuple[float, int]:
    """The finalize before the counters decided: every SHARD (and JOB) item read and tallied; (seconds, processed)."""
    from sluice.control.completion.verdict import figures_from_items
    from sluice.control.table.records import ShardRecords

    records = ShardRecords(dynamodb, table)
    t = time.perf_counter()
    figures = figures_from_items(n, records.shard_items(run_id), records.job_items(run_id))
    return time.perf_counter() - t, figures.processed


def _settle_in_bulk(dynamodb: Any, table: str, run_id: str, jobs: list[Any], failing: set[int]) -> None:
    """The runs table as every event but the last parent's SUCCEEDED leaves it, written in bulk.

    Each SHARD item is what its SUCCEEDED event writes (seq 15, settled from its result.json),
    the COUNT items hold their sums, a failing shard has its FAIL# mark, every job but the last
    is counted terminal.
    """
    from sluice.contracts.status import JobStatus
    from sluice.control.table.ddb import item
    from sluice.control.table.items import CounterItem, JobItem, MarkItem, ShardItem
    from sluice.control.table.records import COUNTER_SHARDS, FAIL, counter_sk, job_sk, shard_sk

    now = int(time.time())
    rows: list[dict[str, Any]] = []
    per_counter: dict[int, Counter[str]] = {k: Counter() for k in range(COUNTER_SHARDS)}
    for job in jobs:
        for i in range(job.shard_count):
            shard = job.shard_offset + i
            bad = shard in failing
            c = per_counter[shard % COUNTER_SHARDS]
            c.update(
                {"shards_failed": 1, "keys_failed": 1, "failed_corrupt": 1}
                if bad
                else {"shards_succeeded": 1, "keys_processed": 1}
            )
            s = ShardItem(
                pk=run_id,
                sk=shard_sk(shard),
                shard=shard,
                status=JobStatus.SUCCEEDED,
                seq=15,
                attempt=1,
                job_id=f"{job.id}:{i}",
                updated_at=now,
                exit_code=0,
                reason="Essential container in task exited",
                terminal=True,
                settled_by="event",
                outcome="failed" if bad else "succeeded",
                why="1 of 1 keys failed for their data (100.00% > 5.00%)" if bad else None,
                processed=int(not bad),
                failed_keys=int(bad),
                failed_by_reason={"corrupt": 1} if bad else {},
            )
            rows.append(s.model_dump(mode="json", exclude_none=True))
            if bad:  # the FAIL# mark its transaction writes with it
                mark = MarkItem(pk=run_id, sk=f"{FAIL}{shard:06d}", shard=shard, updated_at=now, why=s.why)
                rows.append(mark.model_dump(mode="json", exclude_none=True))
    for k, sums in per_counter.items():
        if sums:
            rows.append(CounterItem(pk=run_id, sk=counter_sk(k), updated_at=now, **sums).model_dump(mode="json"))
    for job in jobs[:-1]:
        rows.append(
            JobItem(pk=run_id, sk=job_sk(job.id), status=JobStatus.SUCCEEDED, updated_at=now).model_dump(
                mode="json", exclude_none=True
            )
        )
    for i in range(0, len(rows), 25):  # BatchWriteItem takes at most 25 items
        batch = [{"PutRequest": {"Item": item(r)}} for r in rows[i : i + 25]]
        dynamodb.batch_write_item(RequestItems={table: batch})
    dynamodb.update_item(
        TableName=table,
        Key=item({"pk": run_id, "sk": "RUN"}),
        UpdateExpression="SET jobs_done = :n, #s = :r",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues=item({":n": len(jobs) - 1, ":r": "RUNNING"}),
    )


def run_size(n_shards: int, threads: int, seed: int, bulk: bool = False, fail: int = 0) -> dict[str, Any]:
    import os

    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.aws.clients import Clients
    from sluice.control.completion.batch_events import BatchJobStateChangeEvent
    from sluice.control.completion.state_change import handle_job_event
    from sluice.control.table import ddb
    from sluice.control.table.ledger import Ledger
    from sluice.local.emulator.infra import create_local
    from sluice.local.emulator.lambda_context import LocalContext
    from sluice.local.emulator.server import FAKE_CREDENTIALS
    from sluice.settings import Settings

    os.environ.update({k: v for k, v in FAKE_CREDENTIALS.items() if k not in os.environ})
    os.environ["POWERTOOLS_LOG_LEVEL"] = os.environ.get("SLUICE_BENCH_LOG_LEVEL", "WARNING")
    cheap_transaction_snapshots()
    with mock_aws(config={"batch": {"use_docker": False}}):
        sluice_aws.reset_clients()
        import boto3

        session = boto3.session.Session(region_name="us-east-1")
        base = Clients(**{s: session.client(s) for s in ("s3", "dynamodb", "events", "sqs", "batch", "iam")})
        stack = create_local(base)
        os.environ.update(stack.env_for("HandleManifestUploadFunction"))
        control = stack.names["ControlBucket"]
        base.s3.create_bucket(Bucket="bench-images")
        keys = [f"img/{i:06d}.jpg" for i in range(n_shards)]
        body = json.dumps(
            {
                "version": 1,
                "input": {"keys": keys, "bucket": "bench-images"},
                "job": {"keys_per_shard": 1},
                "retry_failed": 0,
            }
        )
        put = base.s3.put_object(Bucket=control, Key="manifests/scale.json", Body=body)
        from functions.handle_manifest_upload import handler as manifest_handler
        from sluice.local.emulator.events import s3_object_created

        t0 = time.perf_counter()
        out = manifest_handler(
            s3_object_created(
                control,
                "manifests/scale.json",
                size=len(body),
                etag=put["ETag"],
                version_id=put.get("VersionId"),
                sequencer="1",
            ),
            LocalContext(function_name="HandleManifestUploadFunction"),
        )
        plan_s = time.perf_counter() - t0
        assert out["status"] == "submitted", out
        run_id = out["run_id"]
        failing = failing_shards(n_shards, fail)
        _results(base.s3, run_id, control, n_shards, failing)
        os.environ.update(stack.env_for("HandleJobStateChangeFunction"))
        settings = Settings.from_env()
        row = Ledger(base.dynamodb, settings.runs_table).get(run_id)
        assert row is not None and row.jobs is not None
        evs = _events(run_id, row.jobs, stack.names["GpuJobQueue"])
        random.Random(seed).shuffle(evs)
        if bulk:
            _settle_in_bulk(base.dynamodb, settings.runs_table, run_id, row.jobs, failing)
            last = row.jobs[-1].id
            evs = [e for e in evs if e["detail"]["jobId"] == last and e["detail"]["status"] == "SUCCEEDED"]
        parsed = [BatchJobStateChangeEvent.model_validate(e).detail for e in evs]

        calls: Counter[str] = Counter()
        lock = threading.Lock()
        clients = Clients(
            dynamodb=Counting(base.dynamodb, calls, "dynamodb", lock),
            s3=Counting(base.s3, calls, "s3", None),
            events=Counting(base.events, calls, "events", None),
            batch=Counting(base.batch, calls, "batch", None),
        )
        ddb.STATS.clear()
        finalize: list[float] = []
        errors: list[BaseException] = []

        def work(part: list[Any]) -> None:
            for d in part:
                t = time.perf_counter()
                try:
                    res = handle_job_event(d, settings=settings, clients=clients)
                except BaseException as exc:  # reported below
                    errors.append(exc)
                    continue
                if res.status == "finalized":
                    finalize.append(time.perf_counter() - t)

        t1 = time.perf_counter()
        pool = [threading.Thread(target=work, args=(parsed[i::threads],)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        wall = time.perf_counter() - t1
        final = Ledger(base.dynamodb, settings.runs_table).get(run_id)
        items_s, items_processed = _items_finalize(base.dynamodb, settings.runs_table, run_id, n_shards)
        baseline = _baseline_finalize(base.s3, run_id, control, n_shards)
    n_ev = len(parsed)
    ddb_calls = sum(v for k, v in calls.items() if k.startswith("dynamodb."))
    s3_calls = sum(v for k, v in calls.items() if k.startswith("s3."))
    return {
        "shards": n_shards,
        "mode": ("bulk state + last event" if bulk else "every event") + (f", {fail} shards fail" if fail else ""),
        "jobs": len(row.jobs),
        "events": n_ev,
        "threads": threads,
        "errors": len(errors),
        "first_error": repr(errors[0]) if errors else None,
        "status": final.status.value if final else None,
        "processed": final.processed if final else None,
        "plan_s": round(plan_s, 1),
        "events_per_s": round(n_ev / wall, 1),
        "dynamodb_per_event": round(ddb_calls / n_ev, 2),
        "s3_per_event": round(s3_calls / n_ev, 3),
        "transactions_retried": ddb.STATS["transactions_retried"],
        "finalize_s": round(finalize[0], 2) if finalize else None,
        "finalizers": len(finalize),
        "baseline_finalize_s": round(baseline, 2),
        "items_finalize_s": round(items_s, 2),
        "items_agree": final is not None and items_processed == final.processed,
        "calls": dict(sorted(calls.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, action="append", help="run sizes (default: 3000 and 30000)")
    ap.add_argument("--threads", type=int, default=8, help="concurrent deliveries (Lambda concurrency)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--bulk",
        action="store_true",
        help="write the state every event but the last leaves in bulk, then deliver the last (times finalize only)",
    )
    ap.add_argument(
        "--fail-shards",
        type=int,
        default=0,
        help="this many shards' result.json is not ok, so the run fails (decided from the SHARD items)",
    )
    args = ap.parse_args()
    sizes = args.shards or [3000, 30000]
    rows = [run_size(n, args.threads, args.seed, args.bulk, args.fail_shards) for n in sizes]
    print(f"command: python bench/completion_scale.py {' '.join(sys.argv[1:])}".rstrip())
    if args.json:
        print(json.dumps(rows, indent=2))
    print(
        "| shards | events | outcome | events/s | DynamoDB calls/event | S3 calls/event | transactions retried "
        "| finalize s (ours) | finalize s (2N+1 GETs) | ours / baseline |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = (r["finalize_s"] / r["baseline_finalize_s"]) if r["finalize_s"] and r["baseline_finalize_s"] else None
        ratio_text = f"{ratio:.3f}" if ratio is not None else "n/a"
        print(
            f"| {r['shards']:,} | {r['events']:,} ({r['mode']}) | {r['status']} ({r['processed']:,} keys, "
            f"{r['finalizers']} finalizer, {r['errors']} errors) | {r['events_per_s']:,} | {r['dynamodb_per_event']} | "
            f"{r['s3_per_event']} | {r['transactions_retried']} | {r['finalize_s']} | {r['baseline_finalize_s']} | "
            f"{ratio_text} |"
        )
    print()
    print("| shards | outcome | finalize s (ours: counters) | finalize s (before: every SHARD item) | ours / before |")
    print("|---:|---|---:|---:|---:|")
    for r in rows:
        ratio = (r["finalize_s"] / r["items_finalize_s"]) if r["finalize_s"] and r["items_finalize_s"] else None
        agree = "same processed" if r["items_agree"] else "PROCESSED DIFFERS"
        print(
            f"| {r['shards']:,} | {r['status']} ({agree}) | {r['finalize_s']} | {r['items_finalize_s']} | "
            f"{f'{ratio:.3f}' if ratio is not None else 'n/a'} |"
        )
    for r in rows:
        print(f"calls at {r['shards']:,} shards: {r['calls']}")
        if r["first_error"]:
            print(f"first error: {r['first_error']}")


if __name__ == "__main__":
    main()
