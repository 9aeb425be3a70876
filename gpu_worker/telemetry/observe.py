"""Observations into a rank's Stats: histogram buckets, S3 retry classes, and the observer that records both.

Histograms are recorded into Stats as bucket counters (`observe`), so loader processes ship
them to their rank with the same deltas as every other counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpu_worker.telemetry.families import FETCH_BUCKETS, INFER_BUCKETS


def retry_class(code: str | int | None) -> str:
    """Map an S3 error code / HTTP status to one of RETRY_CLASSES (bounded label values)."""
    c = str(code or "")
    if c in (
        "SlowDown",
        "429",
        "503",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
    ):
        return "throttle"
    if c in ("500", "502", "504", "InternalError"):
        return "server"
    if c in ("RequestTimeout", "ReadTimeoutError", "ConnectTimeoutError", "timeout", "EndpointConnectionError"):
        return "timeout"
    return "other"


def observe(stats: Any, name: str, seconds: float, buckets: Sequence[float]) -> None:
    """Record one observation of histogram `name` into a Stats (bucket, sum and count counters)."""
    i = next((k for k, b in enumerate(buckets) if seconds <= b), len(buckets))
    stats.incr(f"hist:{name}:{i}")
    stats.incr(f"hist:{name}:sum", seconds)
    stats.incr(f"hist:{name}:count")


def count_retry(stats: Any, code: str | int | None) -> None:
    """Count one S3 retry under its bounded class."""
    stats.incr(f"s3_retry:{retry_class(code)}")


class MetricsObserver:
    """Wraps a Stats: also records the fetch / model-step histograms and botocore retries."""

    def __init__(self, stats: Any) -> None:
        self._stats = stats

    def incr(self, name: str, n: float = 1.0) -> None:
        self._stats.incr(name, n)
        if name == "fetch_seconds":
            observe(self._stats, "fetch", n, FETCH_BUCKETS)
        elif name == "model_seconds":
            observe(self._stats, "infer", n, INFER_BUCKETS)
        elif name == "s3_botocore_retries" and n:
            self._stats.incr("s3_retry:sdk", n)
