"""`sluice metrics` against a real Prometheus fed by remote write (the PromQL HTTP API path)."""

from __future__ import annotations

import json
import time

from prometheus_client import CollectorRegistry, Counter

from gpu_worker.telemetry.remote_write import RemoteWriter
from sluice.cli import main


def test_metrics_summary_and_plot(prometheus, tmp_path, capsys):
    reg = CollectorRegistry()
    done = Counter("sluice_images_processed_total", "x", ["run_id", "rank"], registry=reg)
    wait = Counter("sluice_data_wait_seconds_total", "x", ["run_id", "rank"], registry=reg)
    w = RemoteWriter(prometheus.write_url, reg, labels={"run_id": "m-run", "rank": "0"})
    # d-run's rank dies after its pushes: no staleness markers, its series linger for the lookback.
    dreg = CollectorRegistry()
    ddone = Counter("sluice_images_processed_total", "x", ["run_id", "rank"], registry=dreg)
    dw = RemoteWriter(prometheus.write_url, dreg, labels={"run_id": "d-run", "rank": "0"})
    for i in range(5):  # five pushes one second apart: 50 images/s, waiting half the time
        done.labels("m-run", "0").inc(50)
        wait.labels("m-run", "0").inc(0.5)
        ddone.labels("d-run", "0").inc(50)
        assert dw.push_once().status == "sent"
        if i < 4:
            assert w.push_once().status == "sent"
            time.sleep(1.0)
    res = w.stop()  # as a rank ends: the fifth push, then staleness markers end its series
    assert res is not None and res.status == "sent"
    time.sleep(6.0)  # both runs have ended
    png = tmp_path / "m.png"
    assert main(["metrics", "m-run", "--url", prometheus.url, "--since-minutes", "5", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "processed      250   failed 0   ranks 1" in out
    assert "GPU util       n/a  (no GPU metrics: CPU ranks)" in out
    assert "(mean: over the run's span, from the counters; min/max: of the per-step samples" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"

    assert main(["metrics", "m-run", "--url", prometheus.url, "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["found"] is True and (s["processed"], s["failed"], s["ranks"]) == (250, 0, 1)
    assert all(type(s[k]) is int for k in ("processed", "failed", "ranks", "series"))
    # The seconds after the last sample are not zero throughput: the mean stays near 50/s
    # (it read ~20/s when the 6 idle seconds counted).
    assert 40 <= s["images_per_s"]["mean"] <= 60, s["images_per_s"]
    assert 0.4 <= s["data_wait"]["mean"] <= 0.6, s["data_wait"]
    assert main(["metrics", "d-run", "--url", prometheus.url, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["processed"] == 250 and 40 <= d["images_per_s"]["mean"] <= 60, d["images_per_s"]


def test_a_run_without_metrics_says_so(prometheus, capsys):
    assert main(["metrics", "no-such-run", "--url", prometheus.url]) == 1
    cap = capsys.readouterr()
    assert cap.out == "" and "no metrics for run 'no-such-run' in the last 1440 minutes" in cap.err
    assert main(["metrics", "no-such-run", "--url", prometheus.url, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["found"] is False
