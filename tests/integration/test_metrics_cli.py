"""`sluice metrics` against a real Prometheus fed by remote write (the PromQL HTTP API path)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpu_worker.remote_write import RemoteWriter
from sluice.cli import main


def test_metrics_summary_and_plot(prometheus, tmp_path, capsys):
    reg = CollectorRegistry()
    done = Counter("sluice_images_processed_total", "x", ["run_id", "rank"], registry=reg)
    wait = Gauge("sluice_data_wait_ratio", "x", ["run_id", "rank"], registry=reg)
    w = RemoteWriter(prometheus.write_url, reg)
    for i in range(4):  # four pushes one second apart: 50 images/s
        done.labels("m-run", "0").inc(50)
        wait.labels("m-run", "0").set(0.1 * i)
        assert w.push_once().status == "sent"
        time.sleep(1.0)
    png = tmp_path / "m.png"
    assert main(["metrics", "m-run", "--url", prometheus.url, "--since-minutes", "5", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "processed      200   failed 0   ranks 1" in out
    assert "GPU util       n/a  (no GPU metrics: CPU ranks)" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert main(["metrics", "m-run", "--url", prometheus.url, "--json"]) == 0
    assert '"processed": 200.0' in capsys.readouterr().out
    assert main(["metrics", "no-such-run", "--url", prometheus.url]) == 1
