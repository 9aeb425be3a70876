"""The Batch retry rule, defined once: retry a lost host (Spot reclaim) or a stall, exit on anything else.

template.yaml's job definitions, every SubmitJob request (`retry_strategy`), the local
executor and its real-shaped events all follow `EVALUATE_ON_EXIT`; a unit test checks the
template against it. `evaluate_on_exit` applies a retry strategy the way AWS Batch does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

# Batch's statusReason when an instance goes away under a running job (Spot reclaim, host
# failure): "Host EC2 (instance i-0abc...) terminated." The trailing * is Batch's own glob.
HOST_LOST_PATTERN = "Host EC2*"
HOST_LOST_REASON = "Host EC2 (instance {instance}) terminated."

# The worker's exit code when a rank made no progress for stall_after_s (gpu_worker.watchdog):
# the attempt is retried and resumes from its committed chunks.
STALLED_EXIT = 75
# The sweep's TerminateJob reason for a stalled attempt (sluice.control.stall).
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


# The index stage's job timeout, derived from the rows it indexes, so a hung build ends: 4x the
# measured build time (docs/performance.md "Search index": about 0.5 s a 1,000 256-d vectors on
# 2 cores, IVF-PQ and key index) plus 30 minutes to read the output and start, at least an hour.
# AWS Batch ends an attempt past its attemptDurationSeconds (at least 60 s, no maximum) and does
# not retry it; the job ends FAILED with "Job attempt duration exceeded timeout" (AWS Batch User
# Guide, "Job timeouts").
INDEX_S_PER_ROW = 0.002
INDEX_BASE_S = 1800
INDEX_MIN_S = 3600
INDEX_ROWS_PER_KEY = {"image": 1, "text": 8, "video": 60}  # a text's chunks, a video's frames: a planning guess
TIMEOUT_REASON = "Job attempt duration exceeded timeout"  # Batch's statusReason for it


def index_timeout_s(rows: int) -> int:
    """The index job's attemptDurationSeconds for about `rows` rows (every model's)."""
    return max(INDEX_MIN_S, INDEX_BASE_S + round(rows * INDEX_S_PER_ROW))


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
