"""Per-rank Prometheus metrics: a registry whose collector reads the rank's live Stats.

One registry per rank process. Every series carries the rank's identity labels (run_id,
shard, node, rank, gpu, attempt, instance_type; an empty one, such as a CPU rank's gpu, is
left out) plus, for a few families, a label from a small fixed set (failure reason, S3 retry
class, histogram bucket): never a per-object label. The budget is 40 series per rank
(tests/unit/test_worker_metrics.py counts them); docs/metrics.md has the fleet figures.

Histograms are recorded into Stats as bucket counters (`observe`), so loader processes ship
them to their rank with the same deltas as every other counter.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_worker.log import child

if TYPE_CHECKING:
    from gpu_worker.remote_write import PushPolicy

log = child("metrics")

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
    "sluice_gpu_utilization_ratio",
    DROPPED,
)


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


class GpuProbe:
    """NVML readings of one device; `read()` returns {} when there is no GPU or no driver."""

    def __init__(self, index: int | None) -> None:
        self._handle: Any = None
        if index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            log.info("GPU metrics unavailable: %s", exc)
            self._handle = None

    def read(self) -> dict[str, float]:
        if self._handle is None:
            return {}
        n, h, out = self._nvml, self._handle, {}
        for key, fn in (
            ("util", lambda: n.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            ("mem", lambda: float(n.nvmlDeviceGetMemoryInfo(h).used)),
            ("power", lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("temp", lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
        ):
            try:
                out[key] = fn()
            except Exception:  # noqa: S112 - a reading the device does not support
                continue
        return out


class RankCollector(Collector):
    """Yields the rank's metric families from its Stats at every scrape or push.

    `snapshot` reads the rank's counters, `labels` its identity (LABELS), `reasons` its keys
    failed for good by reason, `queue_depth` the batches waiting for the model, `gpu` its device.
    """

    def __init__(
        self,
        snapshot: Callable[[], Mapping[str, float]],
        labels: Mapping[str, str],
        *,
        reasons: Callable[[], Mapping[str, int]] = dict,
        queue_depth: Callable[[], float] = lambda: 0.0,
        gpu: GpuProbe | None = None,
    ) -> None:
        self._snapshot = snapshot
        # An empty value means "absent" to Prometheus (a CPU rank has no gpu): leave the label out.
        self.labels = {k: str(labels[k]) for k in LABELS if str(labels.get(k, ""))}
        self._names, self._values = list(self.labels), list(self.labels.values())
        self._reasons = reasons
        self._queue_depth = queue_depth
        self._gpu = gpu

    def _counter(self, name: str, doc: str, value: float) -> Metric:
        m = CounterMetricFamily(name, doc, labels=self._names)
        m.add_metric(self._values, value)
        return m

    def _by(self, name: str, doc: str, label: str, values: Mapping[str, float]) -> Metric:
        """A counter family with one extra label from a fixed set."""
        m = CounterMetricFamily(name, doc, labels=[*self._names, label])
        for v, n in sorted(values.items()):
            m.add_metric([*self._values, str(v)], float(n))
        return m

    def _gauge(self, name: str, doc: str, value: float) -> Metric:
        m = GaugeMetricFamily(name, doc, labels=self._names)
        m.add_metric(self._values, value)
        return m

    def _hist(self, name: str, doc: str, s: Mapping[str, float], key: str, buckets: Sequence[float]) -> Metric:
        m = HistogramMetricFamily(name, doc, labels=self._names)
        cum, out = 0.0, []
        for i, b in enumerate(buckets):
            cum += s.get(f"hist:{key}:{i}", 0.0)
            out.append((repr(float(b)), cum))
        cum += s.get(f"hist:{key}:{len(buckets)}", 0.0)
        out.append(("+Inf", cum))
        m.add_metric(self._values, out, s.get(f"hist:{key}:sum", 0.0))
        return m

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        yield self._counter("sluice_images_processed", "Images embedded and committed.", s.get("images", 0.0))
        reasons = self._reasons()
        if reasons:
            yield self._by("sluice_images_failed", "Images that failed, by reason.", "reason", reasons)
        yield self._counter("sluice_bytes_read", "Bytes read from S3 (image objects).", s.get("s3_bytes", 0.0))
        classes = {c: s.get(f"s3_retry:{c}", 0.0) for c in RETRY_CLASSES}
        if any(classes.values()):
            retried = {c: v for c, v in classes.items() if v}
            yield self._by("sluice_s3_retries", "S3 GET retries, by error class.", "code", retried)
        yield self._hist(
            "sluice_batch_inference_seconds", "Seconds per batch: copy, forward, normalize.", s, "infer", INFER_BUCKETS
        )
        yield self._hist("sluice_object_fetch_seconds", "Seconds per S3 GET of an image.", s, "fetch", FETCH_BUCKETS)
        yield self._counter(
            "sluice_data_wait_seconds",
            "Seconds the model waited for input; rate() of it is the share of time the GPU starved.",
            s.get("wait_seconds", 0.0),
        )
        yield self._gauge(
            "sluice_prefetch_queue_depth", "Batches decoded and waiting for the model.", float(self._queue_depth())
        )
        g = self._gpu.read() if self._gpu else {}
        for key, name, doc in (
            ("util", "sluice_gpu_utilization_ratio", "GPU busy fraction (NVML)."),
            ("mem", "sluice_gpu_memory_used_bytes", "GPU memory used (NVML)."),
            ("power", "sluice_gpu_power_watts", "GPU power draw (NVML)."),
            ("temp", "sluice_gpu_temperature_celsius", "GPU temperature (NVML)."),
        ):
            if key in g:
                yield self._gauge(name, doc, g[key])


def rank_registry(collector: RankCollector) -> CollectorRegistry:
    """A fresh registry (not the global one) holding the rank's collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg


def series_count(registry: CollectorRegistry) -> int:
    """Series the registry exposes, excluding prometheus_client's *_created timestamps."""
    return sum(1 for fam in registry.collect() for s in fam.samples if not s.name.endswith("_created"))


def instance_type(configured: str = "") -> str:
    """`configured` (SLUICE_INSTANCE_TYPE, gpu_worker.env.ContainerEnv) when set, else the EC2 instance
    type (Nitro exposes it via DMI), else "local"."""
    if configured:
        return configured
    try:
        with open("/sys/devices/virtual/dmi/id/product_name", encoding="ascii") as fh:
            name = fh.read().strip()
        if "." in name and name.replace(".", "").replace("-", "").isalnum():
            return name
    except OSError:
        pass
    return "local"


class RankMetrics:
    """A rank's registry, its /metrics endpoint and its remote writer; `stop()` flushes."""

    def __init__(
        self, collector: RankCollector, *, port: int = 0, remote_write_url: str = "", push: PushPolicy | None = None
    ) -> None:
        """`port`: serve /metrics there (0: not at all); `remote_write_url`: push there as `push` says."""
        self.registry = rank_registry(collector)
        self._server: Any = None
        self.writer: Any = None
        if port:
            try:
                from prometheus_client import start_http_server

                self._server, _ = start_http_server(port, registry=self.registry)
                log.info("serving /metrics on port %d", port)
            except OSError as exc:  # a busy port must never stop inference
                log.warning("cannot serve /metrics on port %d: %s", port, exc)
        if remote_write_url:
            from gpu_worker.remote_write import PushPolicy, RemoteWriter

            self.writer = RemoteWriter(
                remote_write_url, self.registry, labels=collector.labels, policy=push or PushPolicy(keep=CRITICAL)
            ).start()

    def series(self) -> int:
        return series_count(self.registry)

    def stop(self) -> None:
        """Push once more (a short job's last samples) within the writer's shutdown bound, stop serving."""
        if self.writer is not None:
            res = self.writer.stop(flush=True)
            log.info("final remote write: %s", res)
        if self._server is not None:
            # shutdown() waits for serve_forever's 0.5 s poll; the rank is exiting, so do not wait.
            threading.Thread(target=self._server.shutdown, daemon=True).start()
            self._server = None


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
