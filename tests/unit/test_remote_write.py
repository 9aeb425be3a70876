"""Remote write: protobuf bytes match the official schema, retries, Retry-After, drops, bounded shutdown."""

from __future__ import annotations

import http.server
import math
import socket
import struct
import threading
import time

import cramjam
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpu_worker.telemetry.remote_write import PushPolicy, RemoteWriter, retry_after_s
from gpu_worker.telemetry.write_request import STALE_NAN, encode_write_request, registry_series, snappy_block
from tests import pace

ID = {"run_id": "r1", "rank": "0", "gpu": ""}  # a CPU rank's identity: gpu is empty


def _prompb():
    """prometheus/prompb WriteRequest, TimeSeries, Label, Sample (remote write 1.0), built as a descriptor."""
    f = descriptor_pb2.FileDescriptorProto(name="prompb_test.proto", package="prometheus", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto

    def msg(name, fields):
        m = f.message_type.add(name=name)
        for fname, num, ftype, label, type_name in fields:
            fd = m.field.add(name=fname, number=num, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name

    opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED
    msg("Label", [("name", 1, T.TYPE_STRING, opt, None), ("value", 2, T.TYPE_STRING, opt, None)])
    msg("Sample", [("value", 1, T.TYPE_DOUBLE, opt, None), ("timestamp", 2, T.TYPE_INT64, opt, None)])
    msg(
        "TimeSeries",
        [
            ("labels", 1, T.TYPE_MESSAGE, rep, ".prometheus.Label"),
            ("samples", 2, T.TYPE_MESSAGE, rep, ".prometheus.Sample"),
        ],
    )
    msg("WriteRequest", [("timeseries", 1, T.TYPE_MESSAGE, rep, ".prometheus.TimeSeries")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


def _registry():
    reg = CollectorRegistry()
    Counter("sluice_images_processed_total", "x", ["run_id", "rank"], registry=reg).labels("r1", "0").inc(42)
    Gauge("sluice_data_wait_ratio", "x", ["run_id", "rank"], registry=reg).labels("r1", "0").set(0.25)
    h = Histogram("sluice_batch_inference_seconds", "x", ["run_id"], buckets=(0.1, 1.0), registry=reg)
    h.labels("r1").observe(0.5)
    return reg


def test_encoded_bytes_decode_with_the_official_schema_to_the_same_series():
    series = registry_series(_registry(), extra={"node": "3"})
    WriteRequest = _prompb()
    req = WriteRequest()
    req.ParseFromString(encode_write_request(series, 1_700_000_000_123))
    got = {
        tuple((lb.name, lb.value) for lb in ts.labels): (ts.samples[0].value, ts.samples[0].timestamp)
        for ts in req.timeseries
    }
    assert got == {labels: (value, 1_700_000_000_123) for labels, value in series}
    names = {dict(k)["__name__"] for k in got}
    assert names == {
        "sluice_images_processed_total",
        "sluice_data_wait_ratio",
        "sluice_batch_inference_seconds_bucket",
        "sluice_batch_inference_seconds_sum",
        "sluice_batch_inference_seconds_count",
    }
    for labels in got:  # sorted, __name__ included, extra labels applied
        assert list(labels) == sorted(labels) and dict(labels)["node"] == "3"
    buckets = {dict(k)["le"]: v for k, (v, _) in got.items() if dict(k)["__name__"].endswith("_bucket")}
    assert buckets == {"0.1": 0.0, "1.0": 1.0, "+Inf": 1.0}


def test_keep_list_forwards_only_the_named_families():
    series = registry_series(_registry(), keep=["sluice_images_processed_total"])
    assert [dict(k)["__name__"] for k, _ in series] == ["sluice_images_processed_total"]


def test_snappy_is_raw_block_format():
    data = encode_write_request(registry_series(_registry()), 1)
    assert bytes(cramjam.snappy.decompress_raw(snappy_block(data))) == data


class _Receiver:
    """A loopback HTTP server answering a scripted list of (status, headers) replies; records arrival times."""

    def __init__(self, replies):
        self.replies = [r if isinstance(r, tuple) else (r, {}) for r in replies]
        self.requests = []
        self.times = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((dict(self.headers), body))
                outer.times.append(time.monotonic())
                code, headers = outer.replies.pop(0) if outer.replies else (204, {})
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(b"out of order sample" if code == 400 else b"")

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def receiver():
    made = []

    def make(replies):
        r = _Receiver(replies)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


@pytest.fixture
def hanging_url():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/api/v1/write"
    sock.close()


def _decode(body):
    req = _prompb()()
    req.ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    return req


def test_5xx_and_429_are_retried_then_sent(receiver):
    r = receiver([500, 429, 204])
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(backoff_s=0.01))
    res = w.push_once()
    assert res.status == "sent" and len(r.requests) == 3
    headers, body = r.requests[-1]
    assert headers["Content-Encoding"] == "snappy" and headers["Content-Type"] == "application/x-protobuf"
    assert "Authorization" not in headers  # not an AMP URL: no signing
    assert len(_decode(body).timeseries) == len(registry_series(w.registry))
    assert w.dropped_samples == 0 and w.outcomes == {"sent": 1}


def test_400_drops_the_batch_once_and_counts_it(receiver):
    r = receiver([400])
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(backoff_s=0.01))
    res = w.push_once()
    assert res.status == "dropped" and res.http_status == 400 and len(r.requests) == 1
    assert w.dropped_samples == res.samples > 0


def test_a_dead_endpoint_gives_up_without_raising(receiver):
    r = receiver([503] * 10)
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(max_attempts=3, backoff_s=0.01))
    assert w.push_once().status == "failed" and len(r.requests) == 3
    w2 = RemoteWriter(
        "http://127.0.0.1:9/api/v1/write", _registry(), labels=ID, policy=PushPolicy(max_attempts=2, backoff_s=0.01)
    )
    assert w2.push_once().status == "failed"


def test_retry_after_on_429_is_honoured(receiver):
    r = receiver([(429, {"Retry-After": "1"}), 204])
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(backoff_s=0.001))
    assert w.push_once().status == "sent" and len(r.requests) == 2
    assert r.times[1] - r.times[0] >= 0.95  # the receiver's 1 s, not the 1 ms backoff


def test_a_retry_after_past_the_deadline_gives_up_at_once(receiver):
    r = receiver([(429, {"Retry-After": "120"})])
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(backoff_s=0.001))
    t0 = time.monotonic()
    assert w.push_once(deadline=time.monotonic() + 60).status == "failed"
    # No early retry, and no waiting for a deadline the answer's 120 s would pass anyway (room on a busy machine).
    assert time.monotonic() - t0 < pace.scaled(1) and len(r.requests) == 1


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after_s("7") == 7.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_s(None) is None and retry_after_s("soon") is None


def test_stop_is_bounded_against_a_hanging_endpoint(hanging_url):
    w = RemoteWriter(
        hanging_url, _registry(), labels=ID, policy=PushPolicy(interval_s=0.1, timeout_s=60, shutdown_s=1.5)
    ).start()
    time.sleep(0.5)  # the background push is now waiting for an answer that never comes
    t0 = time.monotonic()
    w.stop()
    assert time.monotonic() - t0 < pace.scaled(2.5)  # its shutdown_s, not join(60 s) + 5 attempts x 60 s


def test_final_flush_is_bounded_too(hanging_url):
    w = RemoteWriter(hanging_url, _registry(), labels=ID, policy=PushPolicy(timeout_s=60, shutdown_s=1.0))
    t0 = time.monotonic()
    res = w.stop()  # no background thread: the final push itself hangs
    assert time.monotonic() - t0 < pace.scaled(2.0)  # its shutdown_s, not the 60 s timeout
    assert res is not None and res.status == "failed"


def test_stop_pushes_the_last_values_then_staleness_markers(receiver):
    r = receiver([])
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(interval_s=0.05)).start()
    threading.Event().wait(0.3)
    res = w.stop()
    assert res is not None and res.status == "sent" and len(r.requests) >= 3
    last, stale = _decode(r.requests[-2][1]), _decode(r.requests[-1][1])

    def names(req):
        return [tuple((lb.name, lb.value) for lb in ts.labels) for ts in req.timeseries]

    assert names(stale) == names(last)
    for ts in stale.timeseries:
        raw = struct.pack("<d", ts.samples[0].value)
        assert math.isnan(ts.samples[0].value) and raw == STALE_NAN
        assert ts.samples[0].timestamp > last.timeseries[0].samples[0].timestamp


def test_the_drop_counter_carries_the_rank_identity_and_no_empty_label(receiver):
    r = receiver([204])
    w = RemoteWriter(r.url, _registry(), labels={"run_id": "r9", "rank": "3", "gpu": ""})
    w.push_once()
    sent = {
        tuple((lb.name, lb.value) for lb in ts.labels): ts.samples[0].value
        for ts in _decode(r.requests[0][1]).timeseries
    }
    drops = [dict(k) for k in sent if dict(k)["__name__"] == "sluice_remote_write_dropped_samples_total"]
    assert drops == [{"__name__": "sluice_remote_write_dropped_samples_total", "rank": "3", "run_id": "r9"}]
    assert all(value != "" for labels in sent for _, value in labels)


def test_empty_label_values_are_not_encoded():
    reg = CollectorRegistry()
    Gauge("sluice_gpu_utilization_ratio", "x", ["run_id", "gpu"], registry=reg).labels("r1", "").set(0.5)
    assert registry_series(reg) == [((("__name__", "sluice_gpu_utilization_ratio"), ("run_id", "r1")), 0.5)]


def test_the_first_push_is_at_start_not_after_an_interval(receiver):
    r = receiver([])
    w = RemoteWriter(r.url, _registry(), labels=ID, policy=PushPolicy(interval_s=600)).start()
    deadline = time.monotonic() + pace.scaled(5)
    while not r.requests and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    w.stop()
    assert len(r.requests) == 3  # at start, the final push, the staleness markers
    assert time.monotonic() - t0 < pace.scaled(1)  # stop() does not wait out the 600 s interval
