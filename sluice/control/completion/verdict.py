"""What a shard's terminal state means, and what a run's settled shards mean: pure functions, no I/O.

The same inputs give the same verdict whatever order the events came in: a shard's reason is
derived from its own terminal state and result.json only, and a run is concluded only when
every shard is settled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from sluice.contracts.results import ShardResult, over_threshold
from sluice.contracts.status import TRANSIENT_FAILURE_REASONS, FailureReason, JobStatus
from sluice.control.policy import STALLED_EXIT
from sluice.control.table.items import Counts, JobItem, ShardItem, ShardOutcome

NO_RESULT = "no result.json: the worker did not finish"
STALLED_WHY = "stalled: no progress for stall_after_s on every attempt (the worker's watchdog)"
MAX_NAMED = 10  # failed shards named in a run's reason


@dataclass(frozen=True)
class Settlement:
    """A terminal shard's outcome and the worker's counts, as the SHARD item stores them."""

    outcome: ShardOutcome
    why: str | None
    processed: int = 0
    failed_keys: int = 0
    failed_transient: int = 0
    failed_by_reason: Mapping[FailureReason, int] = field(default_factory=dict)
    gpu_seconds: int = 0
    parts_embedded: int = 0  # rows written (result.json parts): status counts a kind's chunks, frames, windows
    media_ms: int = 0  # milliseconds of audio (result.json media_s): DynamoDB items here hold integers
    settled_by: Literal["event", "batch"] = "event"


def settle_shard(
    status: JobStatus,
    exit_code: int | None,
    reason: str | None,
    result: ShardResult | None,
    settled_by: Literal["event", "batch"] = "event",
) -> Settlement:
    """A shard failed if its job failed, it left no result.json, or its result is not ok."""
    counts = (
        {
            "processed": result.processed,
            "failed_keys": result.failed,
            "failed_transient": result.failed_transient,
            "failed_by_reason": dict(result.failed_by_reason),
            "gpu_seconds": round(result.seconds * result.world) if result.device.startswith("cuda") else 0,
            "parts_embedded": result.parts,
            "media_ms": round(result.media_s * 1000),
        }
        if result is not None
        else {}
    )
    why: str | None = None
    if result is not None and not result.ok:
        # The worker's own verdict explains its exit code ("Essential container in task
        # exited" says nothing); a result.json without one is described from its counts.
        why = result.reason or over_threshold(
            result.failed - result.failed_transient,
            result.n_keys,
            result.failed_fraction,
            result.max_failed_fraction,
            {str(r): n for r, n in result.failed_by_reason.items() if r not in TRANSIENT_FAILURE_REASONS},
        )
    elif status == JobStatus.FAILED:
        text = STALLED_WHY if exit_code == STALLED_EXIT else reason or "the job failed"
        why = f"exit code {exit_code}: {text}" if exit_code is not None else text
    elif result is None:
        why = NO_RESULT
    outcome = ShardOutcome.FAILED if why else ShardOutcome.SUCCEEDED
    return Settlement(outcome, why, settled_by=settled_by, **counts)  # type: ignore[arg-type]


@dataclass
class RunFigures:
    """Every settled shard of a run, summed; `unsettled` lists shards with no terminal state yet."""

    n_total: int
    processed: int = 0
    failed: int = 0
    gpu_seconds: int = 0
    by_reason: Counter[FailureReason] = field(default_factory=Counter)
    failed_shards: list[tuple[int, str]] = field(default_factory=list)
    transient_shards: list[int] = field(default_factory=list)
    unsettled: list[int] = field(default_factory=list)
    failed_jobs: list[tuple[str, str]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.unsettled

    def reason(self) -> str | None:
        """Why the run failed (shards first, in index order; then jobs), or None if it did not."""
        if self.failed_shards:
            named = ", ".join(f"shard {i} ({why})" for i, why in self.failed_shards[:MAX_NAMED])
            more = f" and {len(self.failed_shards) - MAX_NAMED} more" if len(self.failed_shards) > MAX_NAMED else ""
            return f"{len(self.failed_shards)} of {self.n_total} shards failed: {named}{more}"
        if self.failed_jobs:
            # Batch failed a job whose every shard succeeded: never call that a success.
            named = ", ".join(f"job {j} ({why})" for j, why in self.failed_jobs[:MAX_NAMED])
            return f"{len(self.failed_jobs)} job(s) FAILED although their shards succeeded: {named}"
        return None


def figures_from_counts(
    n_total: int,
    counts: Counts,
    failed: Iterable[tuple[int, str]],
    transient: Iterable[int],
    jobs: Iterable[JobItem] = (),
) -> RunFigures:
    """The same tally from the run's counters and its FAIL# / RETRY# marks (every shard settled)."""
    t = RunFigures(n_total, processed=counts.keys_processed, failed=counts.keys_failed, gpu_seconds=counts.gpu_seconds)
    t.by_reason.update(counts.failed_by_reason)
    t.failed_shards = sorted(f for f in failed if f[0] < n_total)
    t.transient_shards = sorted(i for i in transient if i < n_total)
    if not t.failed_shards:
        t.failed_jobs = _failed_jobs(jobs)
    return t


def _failed_jobs(jobs: Iterable[JobItem]) -> list[tuple[str, str]]:
    return sorted(
        (j.sk.removeprefix("JOB#"), j.reason or "no reason given") for j in jobs if j.status == JobStatus.FAILED
    )


def figures_from_items(n_total: int, shards: Iterable[ShardItem], jobs: Iterable[JobItem] = ()) -> RunFigures:
    """Sum the settled shards 0..n_total-1; shards without a terminal item are `unsettled`."""
    t = RunFigures(n_total)
    by_index = {s.shard: s for s in shards if s.terminal and s.outcome is not None}
    for i in range(n_total):
        s = by_index.get(i)
        if s is None:
            t.unsettled.append(i)
            continue
        t.processed += s.processed
        t.failed += s.failed_keys
        t.gpu_seconds += s.gpu_seconds
        t.by_reason.update(s.failed_by_reason)
        if s.outcome == ShardOutcome.FAILED:
            t.failed_shards.append((i, s.why or "failed"))
        if s.failed_transient:
            t.transient_shards.append(i)
    t.failed_jobs = [] if t.failed_shards else _failed_jobs(jobs)
    return t
