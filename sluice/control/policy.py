"""The Batch retry rule, defined once: retry a lost host (Spot reclaim) or a stall, exit on anything else.

template.yaml's job definitions, every SubmitJob request (`retry_strategy`), the local
executor and its real-shaped events all follow `EVALUATE_ON_EXIT`; a unit test checks the
template against it. `evaluate_on_exit` applies a retry strategy the way AWS Batch does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

# Batch's statusReason when an instance goes away under a running job (Spot reclaim, host
# failure): "Host EC2 (instance i-0abc...) terminated." The trailing * is Batch's own glob.
HOST_LOST_PATTERN = "Host EC2*"
HOST_LOST_REASON = "Host EC2 (instance {instance}) terminated."

# The worker's exit code when a rank made no progress for stall_after_s (gpu_worker.watchdog):
# the attempt is retried and resumes from its committed chunks.
STALLED_EXIT = 75
# The sweep's TerminateJob reason for a stalled attempt (sluice.control.sweep.stall).
STALLED_REASON = "sluice: stalled"

# First matching rule wins (AWS Batch API reference, EvaluateOnExit); at most 5 rules.
EVALUATE_ON_EXIT: tuple[dict[str, str], ...] = (
    {"onStatusReason": HOST_LOST_PATTERN, "action": "RETRY"},
    {"onExitCode": str(STALLED_EXIT), "action": "RETRY"},
    {"onReason": "*", "action": "EXIT"},
)

Action = Literal["RETRY", "EXIT"]


def retry_strategy(attempts: int) -> dict[str, Any]:
    """The `retryStrategy` of a SubmitJob request (and of the template's job definitions)."""
    return {"attempts": attempts, "evaluateOnExit": [dict(r) for r in EVALUATE_ON_EXIT]}


def index_retry_strategy(attempts: int) -> dict[str, Any]:
    """The index stage's `retryStrategy`: a lost host retried; no stall rule (its timeout ends a hang)."""
    rules = [dict(r) for r in EVALUATE_ON_EXIT if r.get("onExitCode") != str(STALLED_EXIT)]
    return {"attempts": attempts, "evaluateOnExit": rules}


def index_child_retry_strategy() -> dict[str, Any]:
    """A segment child's `retryStrategy`: every failure retried (a child is idempotent: it rewrites its segment)."""
    return {"attempts": INDEX_FLEET_ATTEMPTS, "evaluateOnExit": [{"onReason": "*", "action": "RETRY"}]}


# The index stage's job timeout, derived from the rows it indexes, so a hung build ends: 4x the
# measured build time (docs/performance.md "Search index": about 0.5 s a 1,000 256-d vectors on
# 2 cores, IVF-PQ and key index) plus 30 minutes to read the output and start, at least an hour.
# AWS Batch ends an attempt past its attemptDurationSeconds (at least 60 s, no maximum) and does
# not retry it; the job ends FAILED with "Job attempt duration exceeded timeout" (AWS Batch User
# Guide, "Job timeouts").
INDEX_S_PER_ROW = 0.002
INDEX_BASE_S = 1800
INDEX_MIN_S = 3600
# A text's chunks, a video's frames, an audio file's windows (six minutes in 10 s windows): a planning guess.
INDEX_ROWS_PER_KEY = {"image": 1, "text": 8, "video": 60, "audio": 36}
TIMEOUT_REASON = "Job attempt duration exceeded timeout"  # Batch's statusReason for it


def index_timeout_s(rows: int) -> int:
    """The index job's attemptDurationSeconds for about `rows` rows (every model's)."""
    return max(INDEX_MIN_S, INDEX_BASE_S + round(rows * INDEX_S_PER_ROW))


# The distributed index build (sluice.control.indexing.jobs): at or above Settings.index_fleet_rows
# rows, three stages (train, an array of segment children, commit) run on the fleet instead of
# one job. Per-row rates measured by bench/index.py (docs/performance.md "Search index": 200,000
# x 256-d float16 on 2 shared cores, a 4-vCPU job's share): the merge into Lance 2.5 s, IVF-PQ
# and key index 77.0 s. The stage estimates (`sluice plan`) and the stage timeouts both use them.
# Checked against the distributed build at 1M rows (docs/performance.md, "The distributed build"):
# a segment child took ~0.83 core-ms a row (0.21 ms on 4 vCPUs, under the 0.385 ms used here),
# commit 1.7 s (INDEX_COMMIT_S stays a generous guess: S3 at 300M rows is not measured).
INDEX_MERGE_S_PER_ROW = 2.5 / 200_000
INDEX_BUILD_S_PER_ROW = 77.0 / 200_000
INDEX_TRAIN_SAMPLE_PER_LIST = 64  # k-means trains on this many vectors a list (sluice.index.ann.SAMPLE_RATE)
INDEX_COMMIT_S = 300  # commit: reads N small segment files and writes one manifest (a guess, not measured)
INDEX_TIMEOUT_FACTOR = 4  # a stage's timeout: this many times its estimate, plus INDEX_BASE_S
INDEX_FLEET_ATTEMPTS = 3  # a segment child: a lost host and a failed child are both retried
MAX_ARRAY_CHILDREN = 10_000  # AWS Batch array job size: 2 to 10,000 (AWS Batch User Guide, "Array jobs")
INDEX_STAGES = ("train", "segments", "commit")
# vCPUs and MiB of each index job (template.yaml's job definitions; a unit test compares them), valid
# Fargate sizes (4 vCPUs: 8-30 GiB; 2 vCPUs: 4-16 GiB). The single job and the train stage hold the
# k-means sample (64 x sqrt(rows) vectors: 1.1M x 256 x 4 B = 1.1 GB at 300M rows) and stream the
# merge; a child holds one batch of its <= rows_per_child rows at a time while Lance's IVF shuffle
# spills to its ephemeral disk (10M x 256-d float16 = 5 GB), its PQ codes (10M x 32 B) in memory;
# commit reads the children's segment descriptions only.
INDEX_RESOURCES: dict[str, tuple[int, int]] = {
    "single": (4, 16384),
    "train": (4, 16384),
    "segments": (4, 16384),
    "commit": (2, 4096),
}
# The index jobs run on Fargate (the prepare queue): Linux/x86 On-Demand, us-east-1, 2025-06
# (aws.amazon.com/fargate/pricing; the same rates still quoted in 2026): USD per vCPU-hour and per
# GB-hour. Ephemeral storage above the free 20 GB ($0.000111 a GB-hour) is left out: cents.
FARGATE_VCPU_HOUR = 0.04048
FARGATE_GB_HOUR = 0.004445
FARGATE_PRICE_SOURCE = "aws.amazon.com/fargate/pricing, Linux/x86 us-east-1, 2025-06"


def index_rows(kind: str, frames_per_video: int | None, models: int, keys: int) -> int:
    """Rows the index stage takes: a row a key a model (a text's chunks, a video's frames: INDEX_ROWS_PER_KEY)."""
    per_key = frames_per_video if kind == "video" and frames_per_video else INDEX_ROWS_PER_KEY[kind]
    return keys * models * per_key


def index_mode(rows: int, fleet_rows: int, rows_per_child: int) -> tuple[str, int]:
    """("fleet", children) at or above fleet_rows rows, else ("single", 1); children within Batch's array limit."""
    if rows < fleet_rows:
        return "single", 1
    return "fleet", min(MAX_ARRAY_CHILDREN, max(2, math.ceil(rows / rows_per_child)))


def index_stage_s(stage: str, rows: int, children: int) -> float:
    """A stage's expected seconds (no margin): single = merge + build; train = merge + k-means on a sample;
    a segment child = its share of the rows; commit = INDEX_COMMIT_S."""
    if stage == "single":
        return rows * (INDEX_MERGE_S_PER_ROW + INDEX_BUILD_S_PER_ROW)
    if stage == "train":
        sample = min(rows, INDEX_TRAIN_SAMPLE_PER_LIST * math.sqrt(rows))
        return rows * INDEX_MERGE_S_PER_ROW + sample * INDEX_BUILD_S_PER_ROW
    if stage == "segments":
        return math.ceil(rows / max(1, children)) * INDEX_BUILD_S_PER_ROW
    return float(INDEX_COMMIT_S)


def index_stage_timeout_s(stage: str, rows: int, children: int) -> int:
    """A fleet stage's attemptDurationSeconds: INDEX_TIMEOUT_FACTOR x its estimate plus INDEX_BASE_S, >= INDEX_MIN_S."""
    return max(INDEX_MIN_S, INDEX_BASE_S + round(INDEX_TIMEOUT_FACTOR * index_stage_s(stage, rows, children)))


def fargate_usd(stage: str, seconds: float) -> float:
    """What one job of `stage` (INDEX_RESOURCES) costs for `seconds` on Fargate."""
    vcpus, mib = INDEX_RESOURCES[stage]
    return seconds / 3600 * (vcpus * FARGATE_VCPU_HOUR + mib / 1024 * FARGATE_GB_HOUR)


PREPARE_ATTEMPTS = 3  # prepare workers are idempotent and bad input exits 0: any failure is worth a retry
PREPARE_TIMEOUT_S = 4 * 3600


def prepare_retry_strategy() -> dict[str, Any]:
    """The prepare jobs' `retryStrategy`: every failure retried (no evaluateOnExit rule)."""
    return {"attempts": PREPARE_ATTEMPTS}


def is_host_lost(status_reason: str | None) -> bool:
    """True when a statusReason says the job's instance went away (Spot reclaim or host failure)."""
    return glob_match(HOST_LOST_PATTERN, status_reason or "")


def glob_match(pattern: str, value: str) -> bool:
    """Batch's glob: an exact match, or a prefix match when the pattern ends with '*'."""
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return value == pattern


def evaluate_on_exit(
    rules: Sequence[Mapping[str, str]],
    *,
    status_reason: str | None,
    reason: str | None,
    exit_code: int | None,
) -> Action:
    """What Batch does with a failed attempt: the action of the first rule whose every condition matches.

    A value the attempt lacks (no exit code for a lost host) is the empty string, which only
    "*" matches. When no rule matches, Batch retries (EvaluateOnExit, AWS Batch API reference).
    """
    have = {
        "onStatusReason": status_reason or "",
        "onReason": reason or "",
        "onExitCode": "" if exit_code is None else str(exit_code),
    }
    for rule in rules:
        conditions = {k: v for k, v in rule.items() if k in have}
        if all(glob_match(v, have[k]) for k, v in conditions.items()):
            return "RETRY" if str(rule.get("action", "")).upper() == "RETRY" else "EXIT"
    return "RETRY"
