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

from gpu_worker.telemetry.write_request import encode_write_request, snappy_block
from sluice.ops.metrics import PromClient, fetch

RUN = "uneven-run"
PUSH_S = 30
RATE, WAIT = 100.0, 0.1
HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def _labels(name: str, rank: int, attempt: int, run: str = RUN) -> tuple[tuple[str, str], ...]:
    labels = {"__name__": name, "run_id": run, "shard": str(rank), "node": "0", "rank": "0", "attempt": str(attempt)}
    return tuple(sorted(labels.items()))


def _write(url: str, series: list, at_ms: int, stale: bool = False) -> None:
    body = snappy_block(encode_write_request(series, at_ms, stale=stale))
    req = urllib.request.Request(url, data=body, headers=HEADERS, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status in (200, 204)


LIVES = [(0, 1, 0, 300), (1, 1, 0, 600), (1, 2, 600, 900)]  # (rank, attempt, first s, last s)


def _push_run(url: str, t0: float, lives: list[tuple[int, int, int, int]] = LIVES, run: str = RUN) -> None:
    """The ranks' pushes in time order, every PUSH_S from each life's start and at its end, counters from 0."""
    pushes = sorted(
        {(t, life) for life in lives for t in (*range(life[2], life[3], PUSH_S), life[3])}, key=lambda p: p[0]
    )
    for t, (rank, attempt, first, last) in pushes:
        age = t - first
        series = [
            (_labels("sluice_images_processed_total", rank, attempt, run), RATE * age),
            (_labels("sluice_data_wait_seconds_total", rank, attempt, run), WAIT * age),
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
    assert s["data_wait"]["mean"] == pytest.approx(WAIT, rel=0.02)  # wait seconds over rank-seconds alive
    assert s["images_per_s"]["min"] == pytest.approx(RATE)
    # a third at 200/s, two thirds at 100/s: images over the run's time
    assert s["images_per_s"]["mean"] == pytest.approx(RATE * 4 / 3, rel=0.01)
    assert s["ranks"] == 2 and s["series"] == 6  # 3 lives x 2 metrics
    assert s["processed"] == RATE * 900 + RATE * 300


def test_ranks_shorter_than_a_push_interval_and_idle_gaps(prometheus):
    """Four 14 s shards under 30 s pushes (start and end samples only), two at a time with a 20 s
    gap between waves (containers starting): nothing ran in the gaps (0), each rank's rate shows
    once it ends, and the means are the run's images over its time and its wait over rank-time."""
    lives = [(0, 1, 0, 14), (1, 1, 2, 16), (2, 1, 36, 50), (3, 1, 38, 52)]
    t0 = time.time() - 120
    _push_run(prometheus.write_url, t0, lives, run="short-run")
    m = fetch(PromClient(prometheus.url), "short-run", since_s=3600)
    images = m.series["images_per_s"]
    assert max(v for _, v in images) == near(RATE) and _at(images, t0 + 26) == 0.0  # a rank at its end; the gap
    s = m.summary()
    assert s["images_per_s"]["mean"] == pytest.approx(4 * 14 * RATE / 52, rel=0.03)
    assert s["data_wait"]["mean"] == pytest.approx(WAIT, rel=0.05) and s["ranks"] == 4


def test_a_finished_runs_summary_is_the_same_whenever_it_is_asked(prometheus):
    run = "finished-run"
    t0 = time.time() - 1200
    _push_run(prometheus.write_url, t0, run=run)
    client = PromClient(prometheus.url)
    now = time.time()
    # asked now, a few seconds on, and minutes on: the same span, the same steps, the same figures
    asked = [fetch(client, run, since_s=3600, now=now + dt) for dt in (0.0, 7.3, 131.0, 290.0)]
    first = asked[0]
    assert first.found and first.summary()["images_per_s"]["max"] == near(200.0)
    for m in asked[1:]:
        assert (m.start, m.end) == (first.start, first.end)
        assert m.summary() == first.summary()


def test_a_prometheus_that_does_not_answer_is_named_with_what_to_check(prometheus, capsys):
    from sluice.cli import main

    assert main(["metrics", RUN, "--url", "http://127.0.0.1:1/"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: cannot reach Prometheus at http://127.0.0.1:1/ (")
    assert "Connection refused" in err and "check the URL" in err and "<urlopen error" not in err
    assert main(["metrics", RUN, "--url", prometheus.url.rstrip("/") + "/not-prometheus/"]) == 1
    err = capsys.readouterr().err
    assert "answered HTTP 404" in err and "check the URL" in err


def test_a_text_runs_rate_is_in_documents(prometheus, tmp_path):
    import io

    from sluice.ops.metrics import plot, render

    run, t0 = "text-run", time.time() - 400
    for t in range(0, 301, PUSH_S):
        series = [
            (tuple(sorted((*_labels(name, 0, 1, run), ("kind", "text")))), rate * t)
            for name, rate in (("sluice_images_processed_total", 2.0), ("sluice_data_wait_seconds_total", WAIT))
        ]
        _write(prometheus.write_url, series, int((t0 + t) * 1000))
    m = fetch(PromClient(prometheus.url), run, since_s=3600)
    assert (m.kind, m.unit) == ("text", "documents/s")
    s = m.summary()
    assert (s["kind"], s["unit"]) == ("text", "documents/s") and s["images_per_s"]["max"] == near(2.0)
    out = io.StringIO()
    render(m, out)
    assert "documents/s    mean" in out.getvalue() and "images/s" not in out.getvalue()
    plot(m, str(tmp_path / "m.png"))  # its axis is labelled documents/s too (the same m.unit)
    assert fetch(PromClient(prometheus.url), RUN + "-none", since_s=60).kind == "image"  # no series: the default
