"""Metrics cost at fleet scale: series per rank, active series and samples/s for 16,000 GPUs vs
AMP's defaults, and bytes per remote-write push (measured by encoding real registries).

    .venv/bin/python bench/metrics_cost.py [--gpus 16000] [--interval 30]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_worker.telemetry.collector import RankCollector, rank_registry, series_count
from gpu_worker.telemetry.families import CRITICAL, FETCH_BUCKETS, INFER_BUCKETS
from gpu_worker.telemetry.observe import count_retry, observe
from gpu_worker.telemetry.remote_write import RemoteWriter
from gpu_worker.telemetry.stats import Stats
from gpu_worker.telemetry.write_request import encode_write_request, registry_series, snappy_block
from sluice.contracts.status import FailureReason
from sluice.preflight.limits import AMP_ACTIVE_SERIES, AMP_INGEST_SAMPLES_S  # the quotas, cited once

LABELS = {
    "run_id": "stock-embeddings-3f9a1c2b7d4e5f60",
    "shard": "1234",
    "node": "1234",
    "rank": "7",
    "gpu": "7",
    "attempt": "1",
    "instance_type": "g6e.48xlarge",
}


class Gpu:
    def read(self) -> dict[str, float]:
        return {"util": 0.97, "mem": 3.1e10, "power": 305.0, "temp": 64.0}


def registry(worst: bool):
    s = Stats()
    s.incr("images", 123_456)
    s.incr("s3_bytes", 9.8e9)
    s.incr("wait_seconds", 12.5)
    for v in (0.004, 0.02, 0.08, 0.2, 0.9, 2.5, 4.0):
        observe(s, "infer", v, INFER_BUCKETS)
        observe(s, "fetch", v, FETCH_BUCKETS)
    reasons = {}
    if worst:
        for code in ("SlowDown", "500", "RequestTimeout", "AccessDenied"):
            count_retry(s, code)
        s.incr("s3_retry:sdk", 3)
        reasons = {str(r): 2 for r in FailureReason}  # worst case: every failure reason present
    col = RankCollector(s.snapshot, LABELS, reasons=lambda: reasons, queue_depth=lambda: 3, gpu=Gpu())
    reg = rank_registry(col)
    RemoteWriter("http://127.0.0.1:9/api/v1/write", reg, labels=col.labels)  # its drop counter; never started
    return reg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16_000)
    ap.add_argument("--interval", type=float, default=30.0, help="push interval, seconds")
    a = ap.parse_args()
    print(
        f"| case (one rank = one GPU) | series on /metrics | series pushed (keep-list) | bytes/push (snappy) "
        f"| fleet active series ({a.gpus:,} GPUs) | vs AMP {AMP_ACTIVE_SERIES // 1_000_000}M "
        f"| fleet samples/s @ {a.interval:.0f}s | vs AMP {AMP_INGEST_SAMPLES_S // 1000}k/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, worst, keep in (
        ("typical, keep-list (default)", False, CRITICAL),
        ("worst case, keep-list", True, CRITICAL),
        ("worst case, everything pushed", True, None),
    ):
        reg = registry(worst)
        local = series_count(reg)
        series = registry_series(reg, keep=keep, extra={})
        body = snappy_block(encode_write_request(series, 1_764_504_000_000))
        fleet = len(series) * a.gpus
        rate = fleet / a.interval
        print(
            f"| {name} | {local} | {len(series)} | {len(body):,} | {fleet:,} | {fleet / AMP_ACTIVE_SERIES:.2%} "
            f"| {rate:,.0f} | {rate / AMP_INGEST_SAMPLES_S:.1%} |"
        )


if __name__ == "__main__":
    main()
