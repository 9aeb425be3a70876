"""Per-rank metrics: names, values from Stats, bounded labels, the 40-series budget, the push list."""

from __future__ import annotations

import threading
import urllib.request
import weakref

import pytest
from prometheus_client import exposition

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ConfigError
from gpu_worker.telemetry.collector import RankCollector, rank_registry, series_count
from gpu_worker.telemetry.families import CRITICAL, FAMILIES, FETCH_BUCKETS, INFER_BUCKETS, LABELS, keep_list
from gpu_worker.telemetry.observe import count_retry, observe, retry_class
from gpu_worker.telemetry.remote_write import PushPolicy, RemoteWriter
from gpu_worker.telemetry.serve import RankMetrics
from gpu_worker.telemetry.stats import Stats
from gpu_worker.telemetry.write_request import registry_series
from sluice.contracts.status import KIND_FAILURE_REASONS, FailureReason

LBL = {
    "run_id": "r1",
    "shard": "3",
    "node": "0",
    "rank": "1",
    "gpu": "1",
    "attempt": "2",
    "instance_type": "g6e.xlarge",
    "kind": "text",
}
# Every reason a run of the kind with the most can record, present at once (a run has one kind).
ALL_REASONS = {r.value: 1 for r in max(KIND_FAILURE_REASONS.values(), key=len)}


class FakeGpu:
    def read(self):
        return {"util": 0.93, "mem": 8e9, "power": 250.0, "temp": 61.0}


def _worst_case_registry():
    s = Stats()
    s.incr("images", 1000)
    s.incr("s3_bytes", 5e6)
    s.incr("wait_seconds", 3.0)
    for code in ("SlowDown", "500", "RequestTimeout", "AccessDenied", "503"):
        count_retry(s, code)
    for v in (0.005, 0.02, 0.2, 0.5, 2.0, 9.0):
        observe(s, "infer", v, INFER_BUCKETS)
        observe(s, "fetch", v, FETCH_BUCKETS)
    col = RankCollector(s.snapshot, LBL, reasons=lambda: ALL_REASONS, queue_depth=lambda: 2, gpu=FakeGpu())
    return rank_registry(col)


def test_every_reason_belongs_to_some_kind():
    assert set().union(*KIND_FAILURE_REASONS.values()) == set(FailureReason)


def test_worst_case_stays_within_40_series_and_labels_are_bounded():
    reg = _worst_case_registry()
    assert 0 < series_count(reg) <= 42
    for fam in reg.collect():
        assert fam.name.startswith("sluice_")
        for s in fam.samples:
            assert set(s.labels) - {"reason", "code", "le"} == set(LABELS)


def test_values_come_from_stats():
    samples = {
        (smp.name, smp.labels.get("code") or smp.labels.get("le")): smp.value
        for fam in _worst_case_registry().collect()
        for smp in fam.samples
    }
    assert samples[("sluice_images_processed_total", None)] == 1000
    assert samples[("sluice_bytes_read_total", None)] == 5e6
    assert samples[("sluice_s3_retries_total", "throttle")] == 2 and samples[("sluice_s3_retries_total", "other")] == 1
    assert samples[("sluice_batch_inference_seconds_bucket", "+Inf")] == 6
    assert samples[("sluice_object_fetch_seconds_count", None)] == 6
    assert samples[("sluice_data_wait_seconds_total", None)] == 3.0  # a counter: rate() gives the recent ratio
    assert samples[("sluice_gpu_utilization_ratio", None)] == 0.93
    assert samples[("sluice_prefetch_queue_depth", None)] == 2
    text = exposition.generate_latest(_worst_case_registry()).decode()
    assert (
        'sluice_images_processed_total{attempt="2",gpu="1",instance_type="g6e.xlarge",kind="text",node="0",rank="1",'
        in text
    )


def test_histogram_buckets_are_cumulative():
    s = Stats()
    for v in (0.005, 0.05, 0.05, 10):
        observe(s, "infer", v, INFER_BUCKETS)
    reg = rank_registry(RankCollector(s.snapshot, LBL))
    buckets = {
        smp.labels["le"]: smp.value
        for fam in reg.collect()
        for smp in fam.samples
        if smp.name == "sluice_batch_inference_seconds_bucket"
    }
    assert buckets == {"0.01": 1, "0.03": 1, "0.1": 3, "0.3": 3, "1.0": 3, "3.0": 3, "+Inf": 4}


def test_no_gpu_means_no_gpu_series():
    reg = rank_registry(RankCollector(Stats().snapshot, LBL, gpu=None))
    names = {fam.name for fam in reg.collect()}
    assert not any(n.startswith("sluice_gpu_") for n in names)


def test_retry_classes_are_a_fixed_set():
    assert {retry_class(c) for c in ("SlowDown", 429, "503", "500", "InternalError", "RequestTimeout", "x", None)} == {
        "throttle",
        "server",
        "timeout",
        "other",
    }


def test_default_keep_list_forwards_the_critical_families_only():
    names = {dict(k)["__name__"] for k, _ in registry_series(_worst_case_registry(), keep=CRITICAL)}
    assert "sluice_images_processed_total" in names and "sluice_gpu_utilization_ratio" in names
    assert "sluice_batch_inference_seconds_bucket" in names  # the p90 rule and panel read it
    assert "sluice_data_wait_seconds_total" in names
    assert not any("bytes_read" in n or "gpu_memory" in n or "fetch_seconds" in n for n in names)


def test_families_name_everything_a_rank_exports():
    reg = _worst_case_registry()
    RemoteWriter("http://127.0.0.1:9/api/v1/write", reg, labels=LBL)
    exported = {fam.name for fam in reg.collect()}
    assert {f.removesuffix("_total") for f in FAMILIES} == exported


def test_push_metrics_setting_is_validated():
    assert keep_list("") == CRITICAL and keep_list("all") is None
    assert keep_list("sluice_images_processed, sluice_gpu_power_watts") == (
        "sluice_images_processed_total",
        "sluice_gpu_power_watts",
    )
    with pytest.raises(ValueError, match=r"unknown metric 'sluice_gpu_utilisation_ratio'; valid: all, or .*"):
        keep_list("sluice_images_processed_total,sluice_gpu_utilisation_ratio")
    with pytest.raises(ConfigError, match=r"SLUICE_WORKER_PUSH_METRICS='sluice_imgs'.*sluice_gpu_utilization_ratio"):
        WorkerConfig.from_env({"SLUICE_WORKER_PUSH_METRICS": "sluice_imgs"})


def test_a_cpu_rank_sends_no_empty_gpu_label():
    reg = rank_registry(RankCollector(Stats().snapshot, {**LBL, "gpu": ""}))
    for fam in reg.collect():
        for smp in fam.samples:
            assert "gpu" not in smp.labels and all(smp.labels.values())
    assert all(v for labels, _ in registry_series(reg) for _, v in labels)


def test_served_on_metrics_endpoint():
    from prometheus_client import start_http_server

    from sluice.local.emulator.server import free_port

    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=_worst_case_registry())
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "sluice_images_processed_total" in body
    finally:
        server.shutdown()


def test_stopped_metrics_leave_no_thread_and_let_go_of_the_rank_on_its_thread():
    """stop() joins the server's thread and the collector drops the rank's readers: the pass dies on our thread.

    The server's thread used to outlive stop() and hold the pass (through the registry and the
    collector's queue_depth), so the rank's torch models were freed on that daemon thread, at times
    while the interpreter finalized: a rank that had committed everything then aborted (exit -6).
    """
    from sluice.local.emulator.server import free_port

    class Pass:  # stands for the rank's pass: its queue depth is a reader the collector calls
        def queue_depth(self) -> int:
            return 3

    freed_on: list[str] = []
    p, stats = Pass(), Stats()
    stats.incr("images", 5)
    weakref.finalize(p, lambda: freed_on.append(threading.current_thread().name))
    before = set(threading.enumerate())
    collector = RankCollector(stats.snapshot, LBL, queue_depth=p.queue_depth)
    metrics = RankMetrics(collector, port=free_port())
    assert [t for t in threading.enumerate() if t not in before], "the server should be running"
    metrics.stop()
    assert [t.name for t in threading.enumerate() if t not in before] == []
    del p
    assert freed_on == [threading.current_thread().name]
    values = {smp.name: smp.value for fam in collector.collect() for smp in fam.samples}
    assert values["sluice_images_processed_total"] == 5 and values["sluice_prefetch_queue_depth"] == 3


def test_remote_writer_counts_its_drops_in_the_same_registry_with_the_rank_identity():
    reg = _worst_case_registry()
    w = RemoteWriter(
        "http://127.0.0.1:9/api/v1/write", reg, labels=LBL, policy=PushPolicy(max_attempts=1, timeout_s=0.5)
    )
    w.push_once()
    assert series_count(reg) <= 42 and w.dropped_samples > 0
    drops = [
        smp for fam in reg.collect() for smp in fam.samples if smp.name == "sluice_remote_write_dropped_samples_total"
    ]
    assert [smp.labels for smp in drops] == [LBL] and drops[0].value == w.dropped_samples
