"""Every bad input is rejected with a specific reason; nothing is submitted or written."""

from __future__ import annotations

import json

import pytest

from sluice.ledger import Ledger
from tests.integration.helpers import INPUT_BUCKET, all_jobs, bus_events, invoke_manifest_handler, run_objects

OK_INPUT = {"keys": ["a.jpg"], "bucket": INPUT_BUCKET}


def _m(**kw: object) -> str:
    return json.dumps({"version": 1, "input": OK_INPUT, **kw})


CASES = [
    # (id, manifest key, body, extra env, setup objects {bucket/key: bytes}, expected reason fragment)
    ("not-json", "m.json", "{not json", {}, {}, "not valid JSON: Expecting property name"),
    ("not-utf8", "m.json", b'{"version": 1, "x": "\xff\xfe"}', {}, {}, "not UTF-8 (invalid byte at offset 21)"),
    ("json-array", "m.json", "[1, 2]", {}, {}, "a manifest is a JSON object, not list"),
    ("unknown-field", "m.json", _m(colour="red"), {}, {}, "colour: unknown field"),
    ("unknown-nested-field", "m.json", _m(job={"gpus": 2}), {}, {}, "job.gpus: unknown field"),
    (
        "wrong-version",
        "m.json",
        json.dumps({"version": 2, "input": OK_INPUT}),
        {},
        {},
        "unsupported manifest version 2",
    ),
    (
        "two-sources",
        "m.json",
        json.dumps({"version": 1, "input": {"keys": ["a"], "prefix": "s3://x/y"}}),
        {},
        {},
        "exactly one of keys, key_list, prefix, inventory (got keys, prefix)",
    ),
    (
        "zero-keys",
        "m.json",
        json.dumps({"version": 1, "input": {"keys": [], "bucket": INPUT_BUCKET}}),
        {},
        {},
        "zero keys",
    ),
    (
        "key-too-long",
        "m.json",
        json.dumps({"version": 1, "input": {"keys": ["é" * 600], "bucket": INPUT_BUCKET}}),
        {},
        {},
        "input.keys[0]: key is 1200 bytes; S3 keys are at most 1024",
    ),
    (
        "bucket-not-allowed",
        "m.json",
        json.dumps({"version": 1, "input": {"keys": ["s3://secret-bucket/a.jpg"]}}),
        {"SLUICE_ALLOWED_BUCKETS": INPUT_BUCKET},
        {},
        "bucket 'secret-bucket' is not allowed",
    ),
    (
        "prefix-empty",
        "m.json",
        json.dumps({"version": 1, "input": {"prefix": f"s3://{INPUT_BUCKET}/nothing/"}}),
        {},
        {},
        "matched no objects",
    ),
    (
        "prefix-no-bucket",
        "m.json",
        json.dumps({"version": 1, "input": {"prefix": "s3://no-such-bucket-x/p/"}}),
        {},
        {},
        "the bucket does not exist",
    ),
    (
        "inventory-missing",
        "m.json",
        json.dumps({"version": 1, "input": {"inventory": f"s3://{INPUT_BUCKET}/inv/manifest.json"}}),
        {},
        {},
        f"s3://{INPUT_BUCKET}/inv/manifest.json does not exist",
    ),
    (
        "inventory-not-inventory",
        "m.json",
        json.dumps({"version": 1, "input": {"inventory": f"s3://{INPUT_BUCKET}/inv/manifest.json"}}),
        {},
        {f"{INPUT_BUCKET}/inv/manifest.json": b'{"hello": 1}'},
        "not an S3 Inventory manifest.json",
    ),
    (
        "key-list-missing",
        "m.json",
        json.dumps({"version": 1, "input": {"key_list": f"s3://{INPUT_BUCKET}/lists/none.txt"}}),
        {},
        {},
        "lists/none.txt does not exist",
    ),
    (
        "manifest-too-big",
        "m.json",
        _m(name="x" * 10),
        {"SLUICE_MAX_MANIFEST_BYTES": "50"},
        {},
        "over the 50-byte limit (SLUICE_MAX_MANIFEST_BYTES)",
    ),
    (
        "line-not-a-key",
        "list.txt",
        f"s3://{INPUT_BUCKET}/ok.jpg\ns3://{INPUT_BUCKET}\n",
        {},
        {},
        "list.txt line 2: not a key: 's3://images-in' names a bucket but no object key",
    ),
    (
        "line-is-a-url",
        "list.txt",
        "https://example.com/a.jpg\n",
        {},
        {},
        "line 1: not a key: 'https://example.com/a.jpg' is a URL",
    ),
    ("line-is-a-prefix", "list.txt", f"s3://{INPUT_BUCKET}/folder/\n", {}, {}, "ends with '/' (a prefix)"),
    ("bare-key-no-bucket", "list.txt", "a.jpg\n", {}, {}, "line 1: bare key 'a.jpg' but no bucket"),
    ("keylist-not-utf8", "list.txt", b"s3://images-in/a.jpg\n\xff\n", {}, {}, "not UTF-8 (invalid byte at offset 21)"),
    (
        "jsonl-bad-line",
        "list.jsonl",
        '"s3://images-in/a.jpg"\n{oops\n',
        {},
        {},
        "list.jsonl line 2: not JSON: Expecting property name",
    ),
    ("unsupported-type", "m.yaml", "version: 1", {}, {}, "unsupported manifest type"),
]


@pytest.mark.parametrize(("name", "key", "body", "env", "objects", "reason"), CASES, ids=[c[0] for c in CASES])
def test_rejected_with_a_specific_reason_and_nothing_written(
    aws, stack, monkeypatch, name, key, body, env, objects, reason
):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    for path, data in objects.items():
        b, k = path.split("/", 1)
        aws.s3.put_object(Bucket=b, Key=k, Body=data)
    out = invoke_manifest_handler(aws, stack, f"manifests/{key}", body, monkeypatch, extra_env=env)

    assert out["status"] == "rejected", out
    assert any(reason in r for r in out["reasons"]), out["reasons"]
    assert all_jobs(aws) == []
    assert run_objects(aws, stack) == []
    (event,) = bus_events(aws, stack)
    assert event["detail-type"] == "Manifest Rejected"
    assert event["detail"]["reasons"] == out["reasons"] and event["detail"]["manifest"].endswith(key)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row.status == "REJECTED" and row.reasons == out["reasons"]


def test_many_bad_lines_are_summarised_not_all_listed(aws, stack, monkeypatch):
    body = "".join(f"http://x/{i}\n" for i in range(100))
    out = invoke_manifest_handler(aws, stack, "manifests/many.txt", body, monkeypatch)
    assert out["status"] == "rejected" and len(out["reasons"]) <= 21
    assert out["reasons"][0].startswith("many.txt line 1: not a key")
