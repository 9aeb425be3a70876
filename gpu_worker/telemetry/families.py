"""The metric families a rank exports, their labels and histogram buckets, and which are pushed to AMP.

Every series carries the rank's identity labels (LABELS; an empty one, such as a CPU rank's gpu,
is left out) plus, for a few families, a label from a small fixed set (failure reason, S3 retry
class, histogram bucket): never a per-object label. The budget is 40 series per rank
(tests/unit/test_worker_metrics.py counts them); docs/metrics.md has the fleet figures.
"""

from __future__ import annotations

from collections.abc import Sequence

LABELS = ("run_id", "shard", "node", "rank", "gpu", "attempt", "instance_type", "kind")
INFER_BUCKETS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)  # seconds per batch (copy + forward + normalize)
FETCH_BUCKETS = (0.01, 0.05, 0.2, 1.0, 5.0)  # seconds per GET
RETRY_CLASSES = ("throttle", "server", "timeout", "other", "sdk")  # sdk: botocore's own retries (code unknown)
DROPPED = "sluice_remote_write_dropped_samples_total"  # the remote writer's own counter
# Every family a rank can export; SLUICE_WORKER_PUSH_METRICS may name only these.
FAMILIES = (
    "sluice_images_processed_total",
    "sluice_images_failed_total",
    "sluice_bytes_read_total",
    "sluice_s3_retries_total",
    "sluice_batch_inference_seconds",
    "sluice_object_fetch_seconds",
    "sluice_data_wait_seconds_total",
    "sluice_prefetch_queue_depth",
    "sluice_keys_left",
    "sluice_gpu_utilization_ratio",
    "sluice_gpu_memory_used_bytes",
    "sluice_gpu_power_watts",
    "sluice_gpu_temperature_celsius",
    DROPPED,
)
# Forwarded to AMP by default: exactly what observability/rules.yml reads (a test keeps the two
# equal); the rest stay on /metrics for a scraper that wants them.
CRITICAL = (
    "sluice_images_processed_total",
    "sluice_images_failed_total",
    "sluice_s3_retries_total",
    "sluice_batch_inference_seconds",
    "sluice_data_wait_seconds_total",
    "sluice_keys_left",
    "sluice_gpu_utilization_ratio",
    DROPPED,
)


def keep_list(setting: str) -> Sequence[str] | None:
    """SLUICE_WORKER_PUSH_METRICS: empty = CRITICAL, "all" = everything, else a comma list of FAMILIES.

    A name may omit a counter's "_total"; an unknown name raises ValueError naming it and the
    valid ones, so a typo cannot silently stop a metric from being pushed.
    """
    s = setting.strip()
    if not s:
        return CRITICAL
    if s == "all":
        return None
    known = {**{f.removesuffix("_total"): f for f in FAMILIES}, **{f: f for f in FAMILIES}}
    names = [x.strip() for x in s.split(",") if x.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise ValueError(
            f"unknown metric {', '.join(map(repr, bad))}; valid: all, or a comma list of {', '.join(FAMILIES)}"
        )
    return tuple(dict.fromkeys(known[n] for n in names))
