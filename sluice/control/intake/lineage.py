"""The manifest Lambda's part of an incremental run: which earlier runs it completes, checked, as map tasks.

`resolve` finds input.since_run and its lineage: the earlier run must be in the runs table (or
older than its 90-day TTL) and finished (SUCCEEDED, or FAILED: its committed output counts and
its failed keys are embedded again), every plan of the lineage readable, the lineage at most
MAX_LINEAGE runs, and this run's output prefix apart from every earlier one (it reads them). A
problem is a Rejection naming input.since_run (or output.prefix) and what to do;
transient S3 or DynamoDB errors are retried as everywhere (sluice.input.checks).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from pydantic import ValidationError

from sluice.aws.errors import AwsFatalError, Kind
from sluice.aws.store import ObjectStore
from sluice.contracts.manifest import Manifest
from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import EarlierOutput
from sluice.contracts.status import RunStatus
from sluice.control.table.items import RunItem
from sluice.control.table.ledger import TTL_DAYS, Ledger
from sluice.errors import Rejection
from sluice.paths import RunPaths

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED)
MAX_RETRY_PASSES = 3  # Manifest.retry_failed's maximum: plan-retry-1..3.json
TASKS_PER_WORKER = 4  # earlier-output tasks per map worker: chunk counts vary by shard


@dataclass(frozen=True)
class EarlierRun:
    """One run of the lineage: its plan and how many shards its passes wrote (retry passes' too)."""

    run_id: str
    plan: RunPlan
    shards: int


@dataclass(frozen=True)
class Lineage:
    """input.since_run, then the runs it completed, newest first."""

    runs: list[EarlierRun]

    @property
    def ids(self) -> list[str]:
        return [r.run_id for r in self.runs]

    def outputs(self, model_ids: Sequence[str]) -> list[tuple[int, EarlierRun, int]]:
        """(rank, run, model index) of each earlier model whose artifact is one of this run's."""
        wanted = set(model_ids)
        return [
            (rank, run, m)
            for rank, run in enumerate(self.runs)
            for m, pm in enumerate(run.plan.models)
            if pm.model_id in wanted
        ]

    def rows_estimate(self, model_ids: Sequence[str]) -> int:
        """Earlier rows the map workers will read (each run's planned keys, per matching model)."""
        return sum(run.plan.total_keys for _, run, _ in self.outputs(model_ids))

    def tasks(self, model_ids: Sequence[str], workers: int) -> list[EarlierOutput]:
        """The matching outputs as shard ranges, about TASKS_PER_WORKER per worker in all."""
        outs = self.outputs(model_ids)
        total = sum(run.shards for _, run, _ in outs)
        per = max(1, math.ceil(total / max(1, workers * TASKS_PER_WORKER)))
        first: dict[str, int] = {}  # run id -> the model whose tasks read the run's failures files
        for _, run, m in outs:
            first.setdefault(run.run_id, m)
        return [
            EarlierOutput(
                run_id=run.run_id,
                rank=rank,
                model_prefix=run.plan.model_output_prefix(m),
                model_id=run.plan.models[m].model_id,
                start=a,
                stop=min(a + per, run.shards),
                failures=first[run.run_id] == m,
            )
            for rank, run, m in outs
            for a in range(0, run.shards, per)
        ]


def _read_plan(s3: S3Client, uri: str, why: str) -> RunPlan | str:
    """The plan at `uri`, or the reason it cannot be used (`why` says whose plan it is)."""
    try:
        raw = ObjectStore(s3).get_if_exists(uri)
    except AwsFatalError as exc:
        if exc.kind is Kind.DENIED:
            # S3 answers 403 for a missing object too when the reader may not list its prefix.
            return (
                f"input.since_run: {uri} cannot be read (access denied): there is no such run, or the manifest "
                "function may not read runs/*/plan.json; give the id of a finished run (sluice runs lists them)"
            )
        return f"input.since_run: cannot read the plan of {why}: {exc}"
    if raw is None:
        return f"input.since_run: {why} has no plan ({uri} does not exist): give the id of a run that was submitted"
    try:
        return RunPlan.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "plan"
        return f"input.since_run: the plan of {why} ({uri}) is not a plan Sluice reads: {where}: {first.get('msg')}"


def _unfinished(run_id: str, row: RunItem | None, plan: RunPlan, ledger: Ledger | None, now: float) -> str | None:
    """Why the earlier run cannot be built on yet (None: finished, or not checkable here)."""
    if ledger is None:
        return None
    if row is None:
        created = _epoch(plan.created_at)
        if created is not None and now - created > TTL_DAYS * 86400:
            return None  # its RUN item expired with the table's TTL: a run that old has ended
        return (
            f"input.since_run: run {run_id!r} is not in the runs table {ledger.table!r}: give a run of this "
            "deployment (sluice runs lists them)"
        )
    if row.status == RunStatus.REJECTED:
        return f"input.since_run: run {run_id!r} was rejected and wrote no output: name a run that succeeded"
    if row.status not in FINISHED:
        return (
            f"input.since_run: run {run_id!r} is not finished (status {row.status.value}): wait until it succeeds or "
            f"fails (sluice status {run_id} --watch), then upload this manifest again"
        )
    return None


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None  # a created_at written by hand (older offline plans wrote "standalone")


def _shards(s3: S3Client, root: RunPaths, plan: RunPlan, row: RunItem | None) -> int:
    """Shards of every pass: the RUN item's passes, else the newest retry plan's n_shards (first + retried)."""
    if row is not None and row.passes:
        return row.total_shards
    shards = plan.n_shards
    for k in range(1, MAX_RETRY_PASSES + 1):
        raw = ObjectStore(s3).get_if_exists(root.retry_plan(k))
        if raw is None:
            break
        shards = max(shards, RunPlan.model_validate_json(raw).n_shards)
    return shards


@dataclass(frozen=True)
class _Reader:
    """Where the lineage's runs are read: the control bucket, and the runs table when it is checked."""

    control: str
    s3: S3Client
    ledger: Ledger | None
    now: float


def _earlier(reader: _Reader, run_id: str, *, why: str, check: bool) -> EarlierRun:
    """One run of the lineage, read and (for input.since_run itself: `check`) checked to be finished."""
    root = RunPaths.in_bucket(reader.control, run_id)
    ledger = reader.ledger
    row = ledger.get(run_id) if ledger is not None else None
    plan = _read_plan(reader.s3, root.plan, why)
    if isinstance(plan, str):
        if row is None and ledger is not None and check:
            plan = (
                f"input.since_run: no run {run_id!r} (not in the runs table {ledger.table!r}, no {root.plan}): "
                "give the id of a finished run (sluice runs lists them)"
            )
        elif row is not None and row.status == RunStatus.REJECTED:
            plan = f"input.since_run: run {run_id!r} was rejected and wrote no output: name a run that succeeded"
        raise Rejection(plan)
    problem = _unfinished(run_id, row, plan, ledger, reader.now) if check else None
    if problem:
        raise Rejection(problem)
    return EarlierRun(run_id, plan, _shards(reader.s3, root, plan, row))


def resolve(
    manifest: Manifest, run_id: str, control: str, s3: S3Client, ledger: Ledger | None, *, now: float | None = None
) -> Lineage:
    """input.since_run and its lineage, checked (Rejection says which field and what to do).

    `ledger` None (sluice plan without the runs table): the runs' status is not checked.
    """
    since = manifest.input.since_run
    if since is None:
        raise ValueError("not an incremental manifest")
    if since == run_id:
        raise Rejection(f"input.since_run: {since!r} is this run itself: name an earlier, finished run")
    reader = _Reader(control, s3, ledger, time.time() if now is None else now)
    first = _earlier(reader, since, why=f"run {since!r}", check=True)
    ids = [since, *first.plan.lineage]
    if len(ids) > MAX_LINEAGE:
        raise Rejection(
            f"input.since_run: run {since!r} completes {len(ids) - 1} earlier runs, so this run's lineage would be "
            f"{len(ids)} runs, over the {MAX_LINEAGE} an incremental run may build on (each adds its output to "
            "every later run's reads): run this manifest without since_run once, and build later runs on that one"
        )
    if len(set(ids)) != len(ids) or run_id in ids:
        raise Rejection(f"input.since_run: the lineage of {since!r} names a run twice ({', '.join(ids)})")
    runs = [first] + [
        _earlier(reader, rid, why=f"run {rid!r} (in the lineage of {since!r})", check=False) for rid in ids[1:]
    ]
    mine = manifest.output.prefix or RunPaths.in_bucket(control, run_id).output_prefix
    for r in runs:
        theirs = r.plan.output_prefix
        if mine.startswith(theirs) or theirs.startswith(mine):
            raise Rejection(
                f"output.prefix: {mine} overlaps the output of run {r.run_id!r} ({theirs}), which this incremental "
                "run reads and completes: give it its own prefix, or leave output.prefix out (runs/<run>/output/)"
            )
    return Lineage(runs)


# Each run of a lineage adds its whole output to the reads of every later incremental run (map
# tasks) and to the read recipe's file list; past this many, a full run is cheaper to read.
MAX_LINEAGE = 16
