"""`sluice metrics RUN_ID`: a run's throughput, GPU utilization and data-wait from AMP or a
local Prometheus (PromQL HTTP API, SigV4-signed for AMP), optionally plotted to a PNG."""

from __future__ import annotations

import itertools
import json
import math
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, TextIO

from sluice.sigv4 import region_of, sign_aps

# PromQL over the raw per-rank series, so a run of any length (and a Prometheus without the
# recording rules) answers; the recording rules serve dashboards over long windows. images/s is
# differenced client-side from the cumulative counter, which works even for a 10-second run.
QUERIES = {
    "processed": 'sum(sluice_images_processed_total{{run_id="{run}"}})',
    "gpu_util": 'avg(sluice_gpu_utilization_ratio{{run_id="{run}"}})',
    "gpu_util_p10": 'quantile(0.1, sluice_gpu_utilization_ratio{{run_id="{run}"}})',
    "data_wait": 'avg(sluice_data_wait_ratio{{run_id="{run}"}})',
}
TOTALS = {
    "processed": 'sum(max_over_time(sluice_images_processed_total{{run_id="{run}"}}[{r}]))',
    "failed": 'sum(max_over_time(sluice_images_failed_total{{run_id="{run}"}}[{r}]))',
    "ranks": 'count(max_over_time(sluice_images_processed_total{{run_id="{run}"}}[{r}]))',
    "series": 'count({{__name__=~"sluice_.+",run_id="{run}"}})',
}


class PromClient:
    """Minimal PromQL HTTP API client; signs for AMP workspace URLs."""

    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.base = base_url.rstrip("/") + "/"
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = self.base + path + "?" + urllib.parse.urlencode(params)
        headers: dict[str, str] = {}
        region = region_of(self.base)
        if region:
            headers = sign_aps("GET", url, None, headers, region)
        req = urllib.request.Request(url, headers=headers)  # noqa: S310 - the user's Prometheus / AMP
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise RuntimeError(f"PromQL error: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> float | None:
        """An instant query's single value (None when empty)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        result = self._get("api/v1/query", params)["result"]
        return float(result[0]["value"][1]) if result else None

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[tuple[float, float]]:
        """(t, value) points of a range query's first series."""
        data = self._get(
            "api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        )
        result = data["result"]
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


@dataclass
class RunMetrics:
    run_id: str
    start: float
    end: float
    totals: dict[str, float | None]
    series: dict[str, list[tuple[float, float]]]

    def summary(self) -> dict[str, Any]:
        def stats(points: list[tuple[float, float]]) -> dict[str, float] | None:
            vals = [v for _, v in points if not math.isnan(v)]
            if not vals:
                return None
            return {"mean": round(sum(vals) / len(vals), 4), "min": round(min(vals), 4), "max": round(max(vals), 4)}

        return {
            "run_id": self.run_id,
            **{k: v for k, v in self.totals.items()},
            **{k: stats(v) for k, v in self.series.items()},
        }


def _rate(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t1 > t0:
            out.append((t1, max(0.0, (v1 - v0) / (t1 - t0))))  # a counter reset reads as 0, not negative
    return out


def fetch(client: PromClient, run_id: str, *, since_s: float = 24 * 3600, now: float | None = None) -> RunMetrics:
    """Totals and time series of one run, zoomed to where its samples are (within `since_s`)."""
    end = time.time() if now is None else now
    start = end - since_s
    coarse = client.query_range(QUERIES["processed"].format(run=run_id), start, end, max(5.0, since_s / 300))
    if coarse:  # zoom in: from the first sample's lookback window to the last point
        start = max(start, coarse[0][0] - 300)
        end = min(end, coarse[-1][0])
    step = max(1.0, (end - start) / 300)
    totals = {k: client.query(q.format(run=run_id, r=f"{int(since_s)}s"), at=end) for k, q in TOTALS.items()}
    if totals["processed"] is not None and totals["failed"] is None:
        totals["failed"] = 0.0  # no failure series: nothing failed
    series = {k: client.query_range(q.format(run=run_id), start, end, step) for k, q in QUERIES.items()}
    series["images_per_s"] = _rate(series.pop("processed"))
    return RunMetrics(run_id, start, end, totals, series)


def render(m: RunMetrics, out: TextIO = sys.stdout) -> None:
    s = m.summary()
    w = out.write
    w(f"run            {m.run_id}\n")
    w(
        f"processed      {_num(s['processed'])}   failed {_num(s['failed'])}   ranks {_num(s['ranks'])}"
        f"   series now {_num(s['series'])}\n"
    )
    for key, label, pct in (
        ("images_per_s", "images/s", False),
        ("gpu_util", "GPU util", True),
        ("gpu_util_p10", "GPU util p10", True),
        ("data_wait", "data-wait", True),
    ):
        st = s[key]
        if st is None:
            w(f"{label:<14} n/a" + ("  (no GPU metrics: CPU ranks)\n" if key.startswith("gpu") else "\n"))
        else:
            f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.1f}")
            w(f"{label:<14} mean {f(st['mean'])}  min {f(st['min'])}  max {f(st['max'])}\n")


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


def plot(m: RunMetrics, path: str) -> None:
    """A PNG with images/s, GPU utilization and data-wait over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    firsts = [pts[0][0] for pts in m.series.values() if pts]
    t0 = min(firsts) if firsts else m.start
    span = max((pts[-1][0] for pts in m.series.values() if pts), default=m.end) - t0
    scale, unit = (60.0, "minutes") if span > 600 else (1.0, "seconds")
    for ax, (key, title) in zip(
        axes, (("images_per_s", "images/s"), ("gpu_util", "GPU utilization"), ("data_wait", "data-wait ratio"))
    ):
        pts = m.series[key]
        if pts:
            ax.plot([(t - t0) / scale for t, _ in pts], [v for _, v in pts], "o-", lw=1.5, ms=3)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(f"{unit} since the run's first sample")
    fig.suptitle(f"Sluice run {m.run_id}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
