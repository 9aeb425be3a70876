"""`sluice metrics RUN_ID`: a run's throughput, GPU utilization and data-wait from AMP or a
local Prometheus (PromQL HTTP API, SigV4-signed for AMP), optionally plotted to a PNG."""

from __future__ import annotations

import json
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from sluice.aws.sigv4 import encode_query, normalize, region_of, sign_aps
from sluice.contracts.sections import KIND_WORDS
from sluice.errors import SluiceError

# PromQL over the raw per-rank series, so a run of any length (and a Prometheus without the
# recording rules) answers; the recording rules serve dashboards over long windows.
#
# At each step the rates are per rank, over the ranks alive at that step, then summed (images/s)
# or averaged (data-wait): `irate(c[w])` is a rank's rate over its last push interval (its two
# newest samples within w: neither diluted by a window longer than the rank's life nor
# extrapolated), and `and c` keeps the ranks whose series is current at the step. A rank that
# finished ended its series with staleness markers, so it drops out at once: it neither stays
# in the denominator nor takes its count out of a summed counter (which read as a drop, then 0).
# A rank that pushed within the last step counts too, once: its final interval (all of it, for a
# rank shorter than one push interval: a 14 s shard under 30 s pushes) shows at the step after
# its end, as every interval shows at the step after it (irate reads the past). w holds at
# least two pushes (window_ms); a rank that vanished without markers counts for w.
# `alive` counts the ranks whose series is current: a step without any is a step where nothing
# ran (images/s 0), not one whose ranks have no rate yet (their first push interval: no point).
ALIVE = '{m}{{run_id="{run}"}}'
QUERIES = {
    "images_per_s": "sum(irate({c}[{w}ms]) and ({c} or last_over_time({c}[{s}ms])))",
    "data_wait": "avg(irate({d}[{w}ms]) and ({d} or last_over_time({d}[{s}ms])))",
    "alive": "count({c})",
    "gpu_util": 'avg(sluice_gpu_utilization_ratio{{run_id="{run}"}})',
    "gpu_util_p10": 'quantile(0.1, sluice_gpu_utilization_ratio{{run_id="{run}"}})',
}
# The run's counters summed as of an instant: each series' last sample since the run began
# ({ms} reaches back to it), so a finished rank's count stays in the sum. The means come from
# two of these: what the run did from its first step with a rank alive to its last sample.
SUMMED = "sum(last_over_time({m}[{ms}ms]))"
# The run's input kind: the `kind` label every rank's series carries (one value a run).
KIND = 'count by (kind) (max_over_time(sluice_images_processed_total{{run_id="{run}"}}[{r}]))'
# Any sample within one step (of {ms} milliseconds), not within the lookback window.
COARSE = 'sum(max_over_time(sluice_images_processed_total{{run_id="{run}"}}[{ms}ms]))'
MIN_STEP_S = 0.1  # a local run of a second or two still gets a rate
LOOKBACK_MS = 300_000  # Prometheus' default lookback: how long an instant vector sees a sample
COUNTS = ("processed", "failed", "ranks", "series")
# A rank is (shard, node, rank): its attempts (a restart, a retried child) are series of one rank.
TOTALS = {
    "processed": 'sum(max_over_time(sluice_images_processed_total{{run_id="{run}"}}[{r}]))',
    "failed": 'sum(max_over_time(sluice_images_failed_total{{run_id="{run}"}}[{r}]))',
    "ranks": "count(count by (shard, node, rank) "
    '(max_over_time(sluice_images_processed_total{{run_id="{run}"}}[{r}])))',
    "series": 'count(last_over_time({{__name__=~"sluice_.+",run_id="{run}"}}[{r}]))',
    "samples": 'max(count_over_time(sluice_images_processed_total{{run_id="{run}"}}[{r}]))',
}


class PromClient:
    """Minimal PromQL HTTP API client; signs for AMP workspace URLs (or any URL given a `region`)."""

    def __init__(self, base_url: str, timeout_s: float = 30.0, *, region: str | None = None) -> None:
        self.base = normalize(base_url.rstrip("/") + "/")
        self.timeout_s = timeout_s
        self.region = region or region_of(self.base)

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = self.base + path + "?" + encode_query(params)  # sent as signed: %20 for a space, never '+'
        headers: dict[str, str] = {"Accept": "application/json"}
        if self.region:
            headers = sign_aps("GET", url, None, headers, self.region)
        req = urllib.request.Request(url, headers=headers)  # noqa: S310 - the user's Prometheus / AMP
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise SluiceError(f"{self.base} answered HTTP {exc.code} {exc.reason}: {self._check()}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            why = getattr(exc, "reason", exc)
            raise SluiceError(f"cannot reach Prometheus at {self.base} ({why}): {self._check()}") from None
        if body.get("status") != "success":
            raise RuntimeError(f"PromQL error: {body.get('error', body)}")
        return body["data"]

    def _check(self) -> str:
        """What to check when the URL does not answer as a Prometheus API does."""
        if self.region:
            return (
                "check the AMP workspace URL (https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/) "
                "and your AWS credentials"
            )
        return (
            "check the URL (a local run's is the one `sluice local run --keep` printed, up only while that "
            "emulator runs) or SLUICE_PROMETHEUS_URL"
        )

    def query(self, expr: str, at: float | None = None) -> float | None:
        """An instant query's single value (None when empty)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        result = self._get("api/v1/query", params)["result"]
        return float(result[0]["value"][1]) if result else None

    def label(self, expr: str, name: str, at: float | None = None) -> str | None:
        """Label `name` of an instant query's first series (None when empty or unlabelled)."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        result = self._get("api/v1/query", params)["result"]
        return str(result[0]["metric"].get(name)) if result and result[0]["metric"].get(name) else None

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
    means: dict[str, float | None] = field(default_factory=dict)  # time means, where not the points' mean
    kind: str = "image"  # the run's input kind (the ranks' `kind` label): its unit, documents/s for text

    @property
    def unit(self) -> str:
        """The rate's unit in the kind's own words: images/s, documents/s, videos/s."""
        return f"{KIND_WORDS.get(self.kind, KIND_WORDS['image'])[0]}/s"

    @property
    def found(self) -> bool:
        """Whether the run pushed any sample within the window."""
        return self.totals.get("processed") is not None

    def summary(self) -> dict[str, Any]:
        def stats(key: str, points: list[tuple[float, float]]) -> dict[str, float] | None:
            vals = [v for _, v in points if not math.isnan(v)]
            if not vals:
                return None
            mean = self.means.get(key)
            mean = sum(vals) / len(vals) if mean is None else mean
            return {"mean": round(mean, 4), "min": round(min(vals), 4), "max": round(max(vals), 4)}

        counts = {k: None if (v := self.totals.get(k)) is None else round(v) for k in COUNTS}
        return {
            "run_id": self.run_id,
            "found": self.found,
            "kind": self.kind,
            "unit": self.unit,  # of images_per_s: the objects of the kind a second
            **counts,
            **{k: stats(k, v) for k, v in self.series.items()},
        }


def window_ms(span_s: float, samples: float | None) -> int:
    """irate's window: 2.5 push intervals, the interval estimated as span / (samples - 1) of the rank
    with the most samples (an overestimate when no rank lived the whole span: the window only gets
    wider, and irate reads the two newest samples in it whatever its width), at most the lookback."""
    interval_s = span_s / max(1.0, (samples or 2) - 1)
    return int(min(LOOKBACK_MS, max(1000.0, 2500 * interval_s)))


def _span(client: PromClient, run_id: str, start: float, end: float) -> tuple[float, float, float]:
    """(start, end, step) around the run's samples within [start, end], zooming in a few passes.

    Each pass asks, per step, for any sample within that step (not the lookback window), so
    the span ends at the run's last sample, whether its series ended with staleness markers
    or its ranks died, and a run of a few seconds is found in a 24-hour window. The first
    pass's steps are multiples of its step in epoch time (not offsets from now): the span,
    and each later pass's steps from its start, depend on the run's samples only, so a
    finished run's figures are the same whenever they are asked.
    """
    step = float(math.ceil(max(5.0, (end - start) / 300)))
    start, end = math.floor(start / step) * step, math.ceil(end / step) * step
    for _ in range(4):
        pts = client.query_range(COARSE.format(run=run_id, ms=math.ceil(step * 1000)), start, end, step)
        if not pts:
            break
        start, end = max(start, pts[0][0] - step), min(end, pts[-1][0])
        finer = max(MIN_STEP_S, (end - start) / 300)
        if finer > step / 2:
            break
        step = finer
    return start, end, max(MIN_STEP_S, (end - start) / 300)


def fetch(client: PromClient, run_id: str, *, since_s: float = 24 * 3600, now: float | None = None) -> RunMetrics:
    """Totals and time series of one run, from its first sample to its last (within `since_s`)."""
    until = time.time() if now is None else now
    start, end, step = _span(client, run_id, until - since_s, until)
    totals = {k: client.query(q.format(run=run_id, r=f"{int(since_s)}s"), at=end) for k, q in TOTALS.items()}
    if totals["processed"] is not None and totals["failed"] is None:
        totals["failed"] = 0.0  # no failure series: nothing failed
    w = window_ms(end - start, totals.pop("samples"))
    names = {
        "c": ALIVE.format(m="sluice_images_processed_total", run=run_id),
        "d": ALIVE.format(m="sluice_data_wait_seconds_total", run=run_id),
    }
    ms = math.ceil(step * 1000)
    series = {
        k: client.query_range(q.format(run=run_id, w=w, s=ms, **names), start, end, step) for k, q in QUERIES.items()
    }
    alive = series.pop("alive")
    series["images_per_s"] = _idle_as_zero(series["images_per_s"], alive, step)
    reach_ms = math.ceil((end - start + step) * 1000)
    means = _means(alive, step, end, lambda m, t: client.query(SUMMED.format(m=names[m], ms=reach_ms), at=t))
    kind = client.label(KIND.format(run=run_id, r=f"{int(since_s)}s"), "kind", at=end) or "image"
    return RunMetrics(run_id, start, end, totals, series, means, kind)


def _idle_as_zero(
    rates: list[tuple[float, float]], alive: list[tuple[float, float]], step: float
) -> list[tuple[float, float]]:
    """images/s with 0 at the steps between the run's first and last alive step where no rank was alive."""
    if not alive:
        return rates
    t0 = alive[0][0]

    def index(t: float) -> int:  # the step of the grid query_range evaluated at
        return round((t - t0) / step)

    live, have = {index(t) for t, _ in alive}, {index(t) for t, _ in rates}
    idle = [(t0 + k * step, 0.0) for k in range(index(alive[-1][0]) + 1) if k not in live and k not in have]
    return sorted(rates + idle)


def _means(
    alive: list[tuple[float, float]], step: float, end: float, summed: Callable[[str, float], float | None]
) -> dict[str, float | None]:
    """Time means from the first step with a rank alive to the run's end (its last sample's step):
    images/s is the images processed in between over its seconds; data-wait the wait seconds over
    the rank-seconds alive (each alive step counts its ranks x step)."""
    if not alive or end <= alive[0][0]:
        return {}
    t0 = alive[0][0]
    c0, c1, d0, d1 = summed("c", t0), summed("c", end), summed("d", t0), summed("d", end)
    rank_s = sum(n for _, n in alive[1:]) * step
    return {
        "images_per_s": (c1 - c0) / (end - t0) if c0 is not None and c1 is not None else None,
        "data_wait": (d1 - d0) / rank_s if d0 is not None and d1 is not None and rank_s > 0 else None,
    }


def render(m: RunMetrics, out: TextIO | None = None) -> None:
    """The summary as text on `out` (the current sys.stdout when None: resolved at call time)."""
    s = m.summary()
    w = (out or sys.stdout).write
    w(f"run            {m.run_id}\n")
    w(
        f"processed      {_num(s['processed'])}   failed {_num(s['failed'])}   ranks {_num(s['ranks'])}"
        f"   series {_num(s['series'])}\n"
    )
    for key, label, pct in (
        ("images_per_s", m.unit, False),
        ("gpu_util", "GPU util", True),
        ("gpu_util_p10", "GPU util p10", True),
        ("data_wait", "data-wait", True),
    ):
        st = s[key]
        if st is None:
            w(f"{label:<14} n/a" + ("  (no GPU metrics: CPU ranks)\n" if key.startswith("gpu") else "\n"))
        else:
            f = (lambda v: f"{100 * v:.1f}%") if pct else (lambda v: f"{v:.1f}")
            why = _why(key, st, m.unit.removesuffix("s/s"))
            w(f"{label:<14} mean {f(st['mean'])}  min {f(st['min'])}  max {f(st['max'])}{why}\n")
    w(
        "               (mean: over the run's span, from the counters; min/max: of the per-step samples, "
        "each an instant rate)\n"
    )


def _why(key: str, st: dict[str, Any], noun: str = "image") -> str:
    """Why a mean lies outside its samples' min..max, when it does: they measure different spans."""
    if key != "images_per_s" or st["min"] <= st["mean"] <= st["max"]:
        return ""
    return (
        f"  (the mean counts every {noun} over the whole span; the samples are instant rates at a few steps, "
        "and a short or bursty run's few steps miss its peaks)"
    )


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
        axes, (("images_per_s", m.unit), ("gpu_util", "GPU utilization"), ("data_wait", "data-wait ratio"))
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
