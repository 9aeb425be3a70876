"""Remote write: protobuf bytes match the official schema, SigV4 for aps, retries and drops."""

from __future__ import annotations

import http.server
import threading

import cramjam
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpu_worker.remote_write import (
    HEADERS,
    RemoteWriter,
    encode_write_request,
    region_of,
    registry_series,
    sigv4_headers,
    snappy_block,
)


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


def test_sigv4_for_aps_with_the_region_of_the_workspace_url(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    url = "https://aps-workspaces.eu-west-1.amazonaws.com/workspaces/ws-1234/api/v1/remote_write"
    assert region_of(url) == "eu-west-1" and region_of("http://127.0.0.1:9090/api/v1/write") is None
    h = sigv4_headers(url, b"body", dict(HEADERS), "eu-west-1")
    assert h["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/aps/aws4_request" in h["Authorization"]
    assert "content-encoding" in h["Authorization"].split("SignedHeaders=")[1]
    assert h["X-Amz-Security-Token"] == "token" and "X-Amz-Date" in h
    assert h["Content-Encoding"] == "snappy" and h["X-Prometheus-Remote-Write-Version"] == "0.1.0"


class _Receiver:
    """A loopback HTTP server answering a scripted list of status codes."""

    def __init__(self, codes):
        self.codes = list(codes)
        self.requests = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((dict(self.headers), body))
                code = outer.codes.pop(0) if outer.codes else 204
                self.send_response(code)
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

    def make(codes):
        r = _Receiver(codes)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()


def test_5xx_and_429_are_retried_then_sent(receiver):
    r = receiver([500, 429, 204])
    w = RemoteWriter(r.url, _registry(), backoff_s=0.01)
    res = w.push_once()
    assert res.status == "sent" and len(r.requests) == 3
    headers, body = r.requests[-1]
    assert headers["Content-Encoding"] == "snappy" and headers["Content-Type"] == "application/x-protobuf"
    assert "Authorization" not in headers  # not an AMP URL: no signing
    _prompb()().ParseFromString(bytes(cramjam.snappy.decompress_raw(body)))
    assert w.dropped._value.get() == 0


def test_400_drops_the_batch_once_and_counts_it(receiver):
    r = receiver([400])
    reg = _registry()
    w = RemoteWriter(r.url, reg, backoff_s=0.01)
    res = w.push_once()
    assert res.status == "dropped" and res.http_status == 400 and len(r.requests) == 1
    assert w.dropped._value.get() == res.samples > 0


def test_a_dead_endpoint_gives_up_without_raising(receiver):
    r = receiver([503] * 10)
    w = RemoteWriter(r.url, _registry(), max_attempts=3, backoff_s=0.01)
    assert w.push_once().status == "failed" and len(r.requests) == 3
    w2 = RemoteWriter("http://127.0.0.1:9/api/v1/write", _registry(), max_attempts=2, backoff_s=0.01, timeout_s=1)
    assert w2.push_once().status == "failed"


def test_background_thread_pushes_and_flushes_at_stop(receiver):
    r = receiver([])
    w = RemoteWriter(r.url, _registry(), interval_s=0.05).start()
    threading.Event().wait(0.3)
    res = w.stop()
    assert res is not None and res.status == "sent" and len(r.requests) >= 3
