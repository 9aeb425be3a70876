"""A rank's registry: one collector that reads the rank's live Stats at every scrape or push."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_worker.telemetry.families import FETCH_BUCKETS, INFER_BUCKETS, LABELS, RETRY_CLASSES
from gpu_worker.telemetry.gpu import GpuProbe


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

    def freeze(self) -> None:
        """Report the last readings from now on, and let go of the rank's objects the readers reached.

        The rank's metrics call this when they stop (gpu_worker.telemetry.serve): the readers
        close over the rank's pass (its models, loaders and sinks), which must be freed on the
        rank's own thread, not on a metrics thread that outlives it.
        """
        snapshot, reasons, depth = dict(self._snapshot()), dict(self._reasons()), float(self._queue_depth())
        self._snapshot = lambda: snapshot
        self._reasons = lambda: reasons
        self._queue_depth = lambda: depth
        self._gpu = None

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
        left = s.get("todo", 0.0) - s.get("images", 0.0) - s.get("failed", 0.0)
        yield self._gauge("sluice_keys_left", "Keys the rank has still to settle (less any split off).", max(0.0, left))
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
