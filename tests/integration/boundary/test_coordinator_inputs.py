"""Odd but good inputs give exactly the right keys; transient S3 errors are retried; the unforeseen is a rejection."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tracemalloc
import zlib

import pytest
from botocore.exceptions import ClientError

from sluice.aws import clients as sluice_aws
from sluice.contracts.plan import RunPlan
from sluice.control.table.ledger import Ledger
from sluice.errors import RetriableError
from tests.integration.helpers import (
    DEFAULT_MODEL_ENV,
    INPUT_BUCKET,
    bus_events,
    deliver,
    invoke_manifest_handler,
    object_created_event,
    shard_pairs,
)

BOM = "\ufeff"


@pytest.fixture(autouse=True)
def _fresh(aws, stack):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    bus_events(aws, stack)
    yield


def _keys_of(aws, stack, out) -> list[tuple[str, str]]:
    assert out["status"] == "submitted", out
    return sorted(p for s in shard_pairs(aws, stack, out["run_id"]) for p in s)


def _put(aws, key: str, body: bytes | str) -> str:
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key=key, Body=body.encode() if isinstance(body, str) else body)
    return f"s3://{INPUT_BUCKET}/{key}"


WANT = [(INPUT_BUCKET, "a.jpg"), (INPUT_BUCKET, "b c.jpg")]

GOOD = [
    ("txt-bom", "l.txt", f"{BOM}a.jpg\r\nb c.jpg\n"),
    ("txt-bom-uri", "l.txt", f"{BOM}s3://{INPUT_BUCKET}/a.jpg\ns3://{INPUT_BUCKET}/b c.jpg"),
    ("csv-bom-header", "l.csv", f"{BOM}key\r\na.jpg\r\nb c.jpg\r\n"),
    ("csv-bom-bucket-key-header", "l.csv", f"{BOM}bucket,key\n{INPUT_BUCKET},a.jpg\n{INPUT_BUCKET},b c.jpg\n"),
    ("csv-bom-no-header", "l.csv", f"{BOM}s3://{INPUT_BUCKET}/a.jpg\n{INPUT_BUCKET},b c.jpg\n"),
    ("jsonl-bom", "l.jsonl", f'{BOM}"a.jpg"\n{{"key": "b c.jpg", "bucket": "{INPUT_BUCKET}"}}\n'),
    ("txt-blank-lines", "l.txt", "\n  \na.jpg\n\t\nb c.jpg\n\n"),
]


@pytest.mark.parametrize(("name", "obj", "body"), GOOD, ids=[g[0] for g in GOOD])
def test_a_bom_or_blank_lines_never_become_part_of_a_key(aws, stack, monkeypatch, name, obj, body):
    uri = _put(aws, f"lists/{name}/{obj}", body)
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"key_list": uri, "bucket": INPUT_BUCKET},
    }
    out = invoke_manifest_handler(aws, stack, f"manifests/{name}.json", json.dumps(manifest), monkeypatch)
    assert _keys_of(aws, stack, out) == WANT


def test_a_plain_key_list_upload_with_a_bom(aws, stack, monkeypatch):
    body = f"{BOM}s3://{INPUT_BUCKET}/a.jpg\ns3://{INPUT_BUCKET}/b c.jpg\n"
    out = invoke_manifest_handler(aws, stack, "manifests/bom-list.txt", body, monkeypatch, DEFAULT_MODEL_ENV)
    assert _keys_of(aws, stack, out) == WANT


def test_a_json_manifest_with_a_bom(aws, stack, monkeypatch):
    body = BOM + json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"keys": ["a.jpg", "b c.jpg"], "bucket": INPUT_BUCKET},
        }
    )
    out = invoke_manifest_handler(aws, stack, "manifests/bom.json", body.encode(), monkeypatch)
    assert _keys_of(aws, stack, out) == WANT


def test_what_the_checks_allow_runs(aws, stack, monkeypatch):
    """A model object that exists, an allowed output bucket, Sluice's own queue by ARN, a local path in local mode."""
    aws.s3.create_bucket(Bucket="embeddings-out")
    model = _put(aws, "models/m.pt", b"model bytes")
    queue = next(q["jobQueueArn"] for q in aws.batch.describe_job_queues()["jobQueues"] if "mnp" in q["jobQueueName"])
    manifest = {
        "version": 1,
        "input": {"keys": ["a.jpg"], "bucket": INPUT_BUCKET},
        "model": {"uri": model},
        "output": {"prefix": "s3://embeddings-out/run-7"},
        "job": {"mode": "multinode", "nodes": 2, "queue": queue},
    }
    env = {"SLUICE_ALLOWED_OUTPUT_BUCKETS": "embeddings-out"}
    out = invoke_manifest_handler(aws, stack, "manifests/ok.json", json.dumps(manifest), monkeypatch, extra_env=env)
    assert out["status"] == "submitted", out
    plan = RunPlan.model_validate_json(
        aws.s3.get_object(Bucket=stack.names["ControlBucket"], Key=f"runs/{out['run_id']}/plan.json")["Body"].read()
    )
    assert plan.output_prefix == "s3://embeddings-out/run-7/" and plan.model.uri == model

    local = {"version": 1, "input": {"keys": ["a.jpg"], "bucket": INPUT_BUCKET}, "model": {"uri": "/m/model.pt2"}}
    body = json.dumps(local)
    assert invoke_manifest_handler(aws, stack, "manifests/l.json", body, monkeypatch)["status"] == "rejected"
    out = invoke_manifest_handler(
        aws, stack, "manifests/l.json", body, monkeypatch, extra_env={"SLUICE_LOCAL_MODE": "1"}
    )
    assert out["status"] == "submitted", out


def _report(aws, prefix: str, data: bytes, schema: str = "Bucket, Key", md5: str | None = None) -> bytes:
    entry = {"key": f"{prefix}data.csv.gz", "size": len(data), **({"MD5checksum": md5} if md5 else {})}
    raw = json.dumps(
        {
            "sourceBucket": INPUT_BUCKET,
            "destinationBucket": f"arn:aws:s3:::{INPUT_BUCKET}",
            "fileFormat": "CSV",
            "fileSchema": schema,
            "files": [entry],
        }
    ).encode()
    _put(aws, f"{prefix}data.csv.gz", data)
    return raw


def test_a_data_file_that_does_not_match_its_md5_rejects_the_run(aws, stack, monkeypatch):
    data = gzip.compress(f'"{INPUT_BUCKET}","a.jpg"\n"{INPUT_BUCKET}","b.jpg"\n'.encode())
    for name, md5, ok in (("good", hashlib.md5(data).hexdigest(), True), ("bad", "0" * 32, False)):
        raw = _report(aws, f"{name}/", data, md5=md5)
        _put(aws, f"{name}/manifest.json", raw)
        _put(aws, f"{name}/manifest.checksum", hashlib.md5(raw).hexdigest())
        manifest = json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"inventory": f"s3://{INPUT_BUCKET}/{name}/manifest.json"},
            }
        )
        out = invoke_manifest_handler(aws, stack, f"manifests/{name}.json", manifest, monkeypatch)
        if ok:
            assert _keys_of(aws, stack, out) == [(INPUT_BUCKET, "a.jpg"), (INPUT_BUCKET, "b.jpg")]
        else:
            assert out["status"] == "rejected", out
            assert out["reasons"] == [
                f"inventory file s3://{INPUT_BUCKET}/bad/data.csv.gz: MD5 {md5 and hashlib.md5(data).hexdigest()} "
                f"does not match the report's MD5checksum {'0' * 32}: the file is damaged or was changed after "
                "delivery; use an intact report"
            ]


def test_an_inventory_manifest_dropped_under_manifests_is_checked_against_its_checksum(aws, stack, monkeypatch):
    control = stack.names["ControlBucket"]
    raw = _report(aws, "drop/", gzip.compress(f'"{INPUT_BUCKET}","a.jpg"\n'.encode()))
    # Its checksum may be copied too: that object is no run.
    put = aws.s3.put_object(Bucket=control, Key="manifests/manifest.checksum", Body=b"0" * 32)
    ignored = deliver(stack, object_created_event(control, "manifests/manifest.checksum", put, 32), monkeypatch)
    assert ignored["status"] == "ignored"
    out = invoke_manifest_handler(aws, stack, "manifests/manifest.json", raw, monkeypatch, DEFAULT_MODEL_ENV)
    assert out["status"] == "rejected" and "does not match" in out["reasons"][0], out
    aws.s3.put_object(Bucket=control, Key="manifests/manifest.checksum", Body=hashlib.md5(raw).hexdigest().encode())
    out = invoke_manifest_handler(aws, stack, "manifests/manifest.json", raw, monkeypatch, DEFAULT_MODEL_ENV)
    assert _keys_of(aws, stack, out) == [(INPUT_BUCKET, "a.jpg")]


def test_a_compression_bomb_is_rejected_while_streaming_in_bounded_memory(aws, stack, monkeypatch):
    row = f'"{INPUT_BUCKET}","a.jpg","{"0" * 100_000}"\n'.encode()  # a long third column: few rows to parse
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(z.compress(row * 10) for _ in range(500)) + z.flush()  # 500 MB from ~500 KB
    raw = _report(aws, "bomb/", bomb, schema="Bucket, Key, Size")
    _put(aws, "bomb/manifest.json", raw)
    _put(aws, "bomb/manifest.checksum", hashlib.md5(raw).hexdigest())
    manifest = json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"inventory": f"s3://{INPUT_BUCKET}/bomb/manifest.json"},
        }
    )
    tracemalloc.start()
    try:
        out = invoke_manifest_handler(aws, stack, "manifests/bomb.json", manifest, monkeypatch)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out["status"] == "rejected" and "a compression bomb" in out["reasons"][0], out
    # Stopped at 100 x its size + 1 MiB inflated, never holding more than a chunk and a line of it
    # (the reader alone peaks near 8 MiB; the rest is the handler's and moto's own).
    assert len(bomb) < 2**20 and peak < 64 * 2**20, (len(bomb), peak)


def _fail_once(op: str, code: str, status: int, match: str):
    """A botocore hook: the first `op` call whose URL holds `match` fails as S3 would answer it."""
    fired = []

    def hook(params, **_: object) -> None:
        # Ranged GETs are the input sizing's (sluice.prepare.prepare_store retries those in process).
        if not fired and match in params.get("url_path", "") and "Range" not in params.get("headers", {}):
            fired.append(op)
            raise ClientError(
                {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, op
            )

    return hook


TRANSIENT = [
    ("GetObject", "ServiceUnavailable", 503, "lists/"),  # the key list
    ("GetObject", "InternalError", 500, "manifests/"),  # the manifest itself
    ("HeadObject", "SlowDown", 503, "models/"),  # the model's HEAD
    ("GetObject", "ServiceUnavailable", 503, "manifest.checksum"),  # the inventory checksum
]


@pytest.mark.parametrize(("op", "code", "status", "match"), TRANSIENT, ids=[f"{t[0]}-{t[1]}-{t[3]}" for t in TRANSIENT])
def test_a_transient_s3_error_is_retried_not_rejected(aws, stack, monkeypatch, op, code, status, match):
    control = stack.names["ControlBucket"]
    model = _put(aws, "models/m.pt", b"m")
    if match == "manifest.checksum":
        raw = _report(aws, "tr/", gzip.compress(f'"{INPUT_BUCKET}","a.jpg"\n'.encode()))
        _put(aws, "tr/manifest.json", raw)
        _put(aws, "tr/manifest.checksum", hashlib.md5(raw).hexdigest())
        source = {"inventory": f"s3://{INPUT_BUCKET}/tr/manifest.json"}
    else:
        source = {"key_list": _put(aws, "lists/t.txt", "a.jpg\n"), "bucket": INPUT_BUCKET}
    body = json.dumps({"version": 1, "input": source, "model": {"uri": model}})
    key = f"manifests/t-{code}-{match.strip('/.')}.json"
    put = aws.s3.put_object(Bucket=control, Key=key, Body=body)
    event = object_created_event(control, key, put, len(body))
    s3 = sluice_aws.client("s3")
    s3.meta.events.register(f"before-call.s3.{op}", _fail_once(op, code, status, match), unique_id="transient")
    try:
        with pytest.raises(RetriableError, match=code):
            deliver(stack, event, monkeypatch)
    finally:
        s3.meta.events.unregister(f"before-call.s3.{op}", unique_id="transient")
    (item,) = [
        i
        for i in aws.dynamodb.scan(TableName=stack.names["RunsTable"])["Items"]
        if i["manifest_uri"]["S"].endswith(key)
    ]
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.get(item["pk"]["S"]).status == "RELEASED"
    assert bus_events(aws, stack) == []
    out = deliver(stack, event, monkeypatch)  # the retried event: not a duplicate, not rejected
    assert out["status"] == "submitted", out


def test_an_unforeseen_error_while_reading_the_input_is_a_rejection(aws, stack, monkeypatch, caplog):
    for i in range(3):
        _put(aws, f"pics/{i}.jpg", b"x")

    def boom(**_: object) -> None:
        raise KeyError("Contents")  # what a malformed listing could raise deep inside a reader

    s3 = sluice_aws.client("s3")
    s3.meta.events.register("before-call.s3.ListObjectsV2", boom, unique_id="boom")
    try:
        body = json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"prefix": f"s3://{INPUT_BUCKET}/pics/"}}
        )
        out = invoke_manifest_handler(aws, stack, "manifests/boom.json", body, monkeypatch)
    finally:
        s3.meta.events.unregister("before-call.s3.ListObjectsV2", unique_id="boom")
    assert out["status"] == "rejected"
    assert out["reasons"] == ["unexpected error while reading the input: KeyError: 'Contents'"]
    (event,) = bus_events(aws, stack)
    assert event["detail-type"] == "Manifest Rejected"
    assert any(r.exc_info and "unexpected error while reading the input" in r.getMessage() for r in caplog.records)


def test_a_parquet_inventory_is_read_a_row_group_at_a_time(aws, stack, monkeypatch):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    keys = [f"p/{i}.jpg" for i in range(2500)] + ["p/folder/"]
    buf = io.BytesIO()
    pq.write_table(pa.table({"bucket": [INPUT_BUCKET] * len(keys), "key": keys}), buf, row_group_size=1000)
    _put(aws, "pq/data/a.parquet", buf.getvalue())
    raw = json.dumps(
        {
            "sourceBucket": INPUT_BUCKET,
            "destinationBucket": f"arn:aws:s3:::{INPUT_BUCKET}",
            "fileFormat": "Parquet",
            "fileSchema": "message s3.inventory { required binary bucket (STRING); required binary key (STRING); }",
            "files": [{"key": "pq/data/a.parquet", "size": len(buf.getvalue())}],
        }
    ).encode()
    _put(aws, "pq/manifest.json", raw)
    _put(aws, "pq/manifest.checksum", hashlib.md5(raw).hexdigest())
    manifest = json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"inventory": f"s3://{INPUT_BUCKET}/pq/manifest.json"},
        }
    )
    out = invoke_manifest_handler(aws, stack, "manifests/pq.json", manifest, monkeypatch)
    assert _keys_of(aws, stack, out) == sorted((INPUT_BUCKET, k) for k in keys[:-1])
