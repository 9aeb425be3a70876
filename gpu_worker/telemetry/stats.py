"""Counters the pipeline reports, behind a tiny Observer seam (gpu_worker.telemetry.observe adds the histograms).

Names are a fixed set (no per-object labels): see COUNTERS. Loaders send deltas to their rank
with every batch, so a rank's Stats is live; the node sums its ranks into result.json.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

COUNTERS = {
    "s3_gets": "GET requests that returned a body (images)",
    "s3_bytes": "bytes fetched (images)",
    "s3_botocore_retries": "retries botocore made inside those GETs (RetryAttempts)",
    "s3_retries": "our immediate retries after botocore gave up",
    "s3_deferred": "keys sent to the final retry pass",
    "s3_recovered": "deferred keys that the final pass fetched",
    "decoded": "images decoded",
    "decode_seconds": "CPU-thread time in decode+preprocess",
    "fetch_seconds": "wall time inside GETs (summed over concurrent fetches)",
    "images": "images embedded",
    "batches": "batches run through the model",
    "padded_slots": "batch slots run as padding (partial last batches)",
    "model_seconds": "wall time of model steps (copy, forward, normalize)",
    "wait_seconds": "time the model loop waited for a ready batch (starvation, first batch included)",
    "first_batch_seconds": "from the start of the pipeline to the first full batch",
    "failed": "keys failed for good in this attempt, once a key however many models owed it (failures/<shard>.jsonl)",
    "chunks_committed": "Parquet chunks committed in this attempt",
    "loader_cpu_seconds": "CPU time of loader processes (fetch + decode + IPC)",
    "rank_cpu_seconds": "CPU time of rank processes (model + output; includes loader threads when LOADERS=0)",
}


class Observer(Protocol):
    def incr(self, name: str, n: float = 1.0) -> None: ...


class Stats:
    """Thread-safe counters; `snapshot()` for result.json, `take_delta()` for shipping to a parent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, float] = {}
        self._sent: dict[str, float] = {}

    def incr(self, name: str, n: float = 1.0) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0.0) + n

    def add(self, values: Mapping[str, float]) -> None:
        with self._lock:
            for k, v in values.items():
                self._values[k] = self._values.get(k, 0.0) + v

    def get(self, name: str) -> float:
        with self._lock:
            return self._values.get(name, 0.0)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            # to the millisecond; a whole number as an int (a count credited in shares adds up to one)
            return {k: int(r) if float(r := round(v, 3)).is_integer() else r for k, v in sorted(self._values.items())}

    def take_delta(self) -> dict[str, float]:
        """Counts since the previous call."""
        with self._lock:
            delta = {k: v - self._sent.get(k, 0.0) for k, v in self._values.items() if v != self._sent.get(k, 0.0)}
            self._sent = dict(self._values)
            return delta
