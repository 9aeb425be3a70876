"""`sluice metrics` on a run whose ranks end at different times, against a real Prometheus.

Synthetic series, remote-written with their own timestamps as the workers push them (every
30 s, a staleness marker when a rank ends): two ranks at 100 images/s, each waiting for data
10% of the time. Rank 0 ends at 300 s; rank 1 runs on to 900 s and restarts once at 600 s
(a new `attempt`, its counters from 0). The true figures: 200 images/s, then 100; data-wait
0.1 throughout; two ranks.
"""

from __future__ import annotations

import time
import urllib.request

import pytest

from gpu_worker.write_request import encode_write_request, snappy_block
from sluice.ops.metrics import PromClient, fetch

RUN = "uneven-run"
PUSH_S = 30
RATE, WAIT = 100.0, 0.1
HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def _labels(name: str, rank: int, attempt: int) -> tuple[tuple[str, str], ...]:
    labels = {"__name__": name, "run_id": RUN, "shard": str(rank), "node": "0", "rank": "0", "attempt": str(attempt)}
    return tuple(sorted(labels.items()))


def _write(url: str, series: list, at_ms: int, stale: bool = False) -> None:
    body = snappy_block(encode_write_request(series, at_ms, stale=stale))
    req = urllib.request.Request(url, data=body, headers=HEADERS, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 204)


def _push_run(url: str, t0: float) -> None:
    """Both ranks' pushes in time order: (rank, attempt, first s, last s) lives, counters from 0 each."""
    lives = [(0, 1, 0, 300), (1, 1, 0, 600), (1, 2, 600, 900)]
    for t in range(0, 900 + PUSH_S, PUSH_S):
        for rank, attempt, first, last in lives:
            if not first <= t <= last:
                continue
            age = t - first
            series = [
                (_labels("sluice_images_processed_total", rank, attempt), RATE * age),
                (_labels("sluice_data_wait_seconds_total", rank, attempt), WAIT * age),
            ]
            at_ms = int((t0 + t) * 1000) + (1 if attempt == 2 and t == first else 0)
            _write(url, series, at_ms)
            if t == last:  # the rank ends: its series end at once
                _write(url, series, at_ms + 1, stale=True)


@pytest.fixture
def uneven(prometheus):
    t0 = time.time() - 960  # the run's last push was a minute ago
    _push_run(prometheus.write_url, t0)
    return fetch(PromClient(prometheus.url), RUN, since_s=3600), t0


def near(x: float) -> object:
    return pytest.approx(x, rel=1e-3)  # the restart's first push is 1 ms after the 600 s mark


def _at(points: list[tuple[float, float]], t: float) -> float:
    """The value at the step nearest to t."""
    return min(points, key=lambda p: abs(p[0] - t))[1]


def test_rates_follow_the_ranks_alive_at_each_step(uneven):
    m, t0 = uneven
    images, wait = m.series["images_per_s"], m.series["data_wait"]
    assert _at(images, t0 + 200) == near(2 * RATE)
    for t in (330, 450, 590, 607, 640, 800):  # after rank 0 ended; 607: its counter has left any window
        assert _at(images, t0 + t) == near(RATE), t
        assert _at(wait, t0 + t) == near(WAIT), t
    assert min(v for _, v in images) == near(RATE)
    assert min(v for _, v in wait) == near(WAIT) and max(v for _, v in wait) == near(WAIT)


def test_summary_reads_the_true_figures_and_counts_distinct_ranks(uneven):
    m, _ = uneven
    s = m.summary()
    assert s["data_wait"]["mean"] == pytest.approx(WAIT, abs=0.001)
    assert s["images_per_s"]["min"] == pytest.approx(RATE)
    # a third at 200/s, two thirds at 100/s
    assert s["images_per_s"]["mean"] == pytest.approx(RATE * 4 / 3, rel=0.03)
    assert s["ranks"] == 2 and s["series"] == 6  # 3 lives x 2 metrics
    assert s["processed"] == RATE * 900 + RATE * 300
