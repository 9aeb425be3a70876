"""Every bad input is rejected with a specific reason; nothing is submitted or written."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib

import pytest

from sluice.control.table.ledger import Ledger
from tests.integration.helpers import (
    DEFAULT_MODEL_ENV,
    INPUT_BUCKET,
    all_jobs,
    bus_events,
    invoke_manifest_handler,
    run_objects,
)


# One emulated stack for the whole module (a rejection writes nothing under runs/ and submits
# nothing, so cases cannot see each other's); each test starts with an empty input bucket.
@pytest.fixture(autouse=True)
def _fresh_inputs(aws, stack):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    for page in aws.s3.get_paginator("list_objects_v2").paginate(Bucket=INPUT_BUCKET):
        for o in page.get("Contents", []):
            aws.s3.delete_object(Bucket=INPUT_BUCKET, Key=o["Key"])
    bus_events(aws, stack)  # drained
    yield


OK_INPUT = {"keys": ["a.jpg"], "bucket": INPUT_BUCKET}
INV = f"s3://{INPUT_BUCKET}/inv/manifest.json"


def _m(**kw: object) -> str:
    return json.dumps({"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": OK_INPUT, **kw})


def _inv_manifest() -> str:
    return json.dumps({"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"inventory": INV}})


def _inventory(data: bytes, *, fmt: str = "CSV", schema: str = "Bucket, Key, Size", checksum: str | None = None):
    """The objects of an S3 Inventory report with one data file: manifest.json, its checksum, the data."""
    name = "inv/data/a.csv.gz" if fmt == "CSV" else "inv/data/a.parquet"
    raw = json.dumps(
        {
            "sourceBucket": INPUT_BUCKET,
            "destinationBucket": f"arn:aws:s3:::{INPUT_BUCKET}",
            "fileFormat": fmt,
            "fileSchema": schema,
            "files": [{"key": name, "size": len(data), "MD5checksum": hashlib.md5(data).hexdigest()}],
        }
    ).encode()
    return {
        f"{INPUT_BUCKET}/inv/manifest.json": raw,
        f"{INPUT_BUCKET}/inv/manifest.checksum": (checksum or hashlib.md5(raw).hexdigest()).encode(),
        f"{INPUT_BUCKET}/{name}": data,
    }


def _bomb_csv_gz(inflated: int) -> bytes:
    """A small .csv.gz of one row repeated until it inflates to `inflated` bytes."""
    row = f'"{INPUT_BUCKET}","a.jpg","1"\n'.encode()
    block = row * (2**20 // len(row))
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [z.compress(block) for _ in range(inflated // len(block))]
    return b"".join(out) + z.flush()


def _parquet(table: dict) -> bytes:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    buf = io.BytesIO()
    pq.write_table(pa.table(table), buf)
    return buf.getvalue()


def _keylist(name: str, body: bytes | str) -> tuple[str, dict[str, bytes]]:
    """A JSON manifest naming a key-list object, and that object."""
    data = body.encode() if isinstance(body, str) else body
    manifest = json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"key_list": f"s3://{INPUT_BUCKET}/lists/{name}"},
        }
    )
    return manifest, {f"{INPUT_BUCKET}/lists/{name}": data}


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
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": ["a"], "prefix": "s3://xyz/y"}}
        ),
        {},
        {},
        "exactly one of keys, key_list, prefix, inventory (got keys, prefix)",
    ),
    (
        "zero-keys",
        "m.json",
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": [], "bucket": INPUT_BUCKET}}
        ),
        {},
        {},
        "zero keys",
    ),
    (
        "key-too-long",
        "m.json",
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"keys": ["é" * 600], "bucket": INPUT_BUCKET},
            }
        ),
        {},
        {},
        "input.keys[0]: key is 1200 bytes; S3 keys are at most 1024",
    ),
    (
        "bucket-not-allowed",
        "m.json",
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": ["s3://secret-bucket/a.jpg"]}}
        ),
        {"SLUICE_ALLOWED_BUCKETS": INPUT_BUCKET},
        {},
        "bucket 'secret-bucket' is not allowed",
    ),
    (
        "prefix-empty",
        "m.json",
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"prefix": f"s3://{INPUT_BUCKET}/nothing/"},
            }
        ),
        {},
        {},
        "matched no objects",
    ),
    (
        "prefix-no-bucket",
        "m.json",
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"prefix": "s3://no-such-bucket-x/p/"}}
        ),
        {},
        {},
        "the bucket does not exist",
    ),
    (
        "inventory-missing",
        "m.json",
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"inventory": f"s3://{INPUT_BUCKET}/inv/manifest.json"},
            }
        ),
        {},
        {},
        f"s3://{INPUT_BUCKET}/inv/manifest.json does not exist",
    ),
    (
        "inventory-not-inventory",
        "m.json",
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"inventory": f"s3://{INPUT_BUCKET}/inv/manifest.json"},
            }
        ),
        {},
        {f"{INPUT_BUCKET}/inv/manifest.json": b'{"hello": 1}'},
        "not an S3 Inventory manifest.json",
    ),
    (
        "key-list-missing",
        "m.json",
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"key_list": f"s3://{INPUT_BUCKET}/lists/none.txt"},
            }
        ),
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

_CSV_HUGE_FIELD = _keylist("big.csv", "key\n" + "x" * 200_000 + "\n")
_JSONL_SURROGATE = _keylist("s.jsonl", '"ok.jpg"\n"bad\\ud800.jpg"\n')
_JSONL_DEEP = _keylist("d.jsonl", "[" * 50_000 + "\n")
_LONG_LINE = _keylist("long.txt", "a.jpg\n" + "b" * (2**20 + 10))
_NUL_LINE = _keylist("nul.txt", f"s3://{INPUT_BUCKET}/a.jpg\ns3://{INPUT_BUCKET}/b\0.jpg\n")
_TAB_CSV = _keylist("tab.csv", f"bucket,key\n{INPUT_BUCKET},a\tb.jpg\n")
_JSONL_BUCKET_NUM = _keylist("b.jsonl", '{"key": "a.jpg", "bucket": 5}\n')
_JSONL_BOTH = _keylist("both.jsonl", f'{{"uri": "s3://{INPUT_BUCKET}/a.jpg", "key": "b.jpg"}}\n')
_GZ = gzip.compress(f'"{INPUT_BUCKET}","a.jpg","1"\n'.encode())

# The four kinds of defect: what raised (a retry loop), what read keys silently wrong, what was
# accepted though it could not work; each is now a rejection whose reason names the place.
NEW_CASES = [
    # -- raised instead of rejecting
    ("deep-json", "m.json", "[" * 100_000, {}, {}, "nested deeper than 32 levels"),
    (
        "deep-json-in-a-field",
        "m.json",
        _m(job={"x": json.loads("[" * 40 + "]" * 40)}),
        {},
        {},
        "nested deeper than 32 levels",
    ),
    ("int-of-5000-digits", "m.json", _m()[:-1] + ', "retry_failed": ' + "9" * 5000 + "}", {}, {}, "4300 digits"),
    ("nan", "m.json", _m()[:-1] + ', "max_failed_fraction": NaN}', {}, {}, "NaN is not a JSON number"),
    ("json-lone-surrogate", "m.json", _m(name="x\ud800"), {}, {}, "name: holds a lone UTF-16 surrogate"),
    ("csv-field-over-csv-limit", "m.json", _CSV_HUGE_FIELD[0], {}, _CSV_HUGE_FIELD[1], "big.csv line 2: not CSV"),
    ("jsonl-lone-surrogate", "m.json", _JSONL_SURROGATE[0], {}, _JSONL_SURROGATE[1], "s.jsonl line 2: not a key"),
    ("jsonl-deep-line", "m.json", _JSONL_DEEP[0], {}, _JSONL_DEEP[1], "d.jsonl line 1: not JSON: RecursionError"),
    ("line-over-1-mib", "m.json", _LONG_LINE[0], {}, _LONG_LINE[1], "long.txt line 2: longer than 1048576 bytes"),
    ("inventory-corrupt-gzip", "m.json", _inv_manifest(), {}, _inventory(b"\x1f\x8b\x08garbage"), "not gzip data"),
    ("inventory-not-gzip", "m.json", _inv_manifest(), {}, _inventory(b"a,b,c\n"), "inv/data/a.csv.gz: not gzip"),
    ("inventory-truncated-gzip", "m.json", _inv_manifest(), {}, _inventory(_GZ[:-12]), "gzip data is truncated"),
    (
        "inventory-schema-without-key",
        "m.json",
        _inv_manifest(),
        {},
        _inventory(_GZ, schema="Bucket, Size"),
        "fileSchema 'Bucket, Size' has no Bucket and Key columns",
    ),
    (
        "inventory-corrupt-parquet",
        "m.json",
        _inv_manifest(),
        {},
        _inventory(b"PAR1 not really parquet PAR1", fmt="Parquet", schema="message s3.inventory { }"),
        "inv/data/a.parquet: not a readable Parquet file",
    ),
    (
        "inventory-parquet-without-key",
        "m.json",
        _inv_manifest(),
        {},
        _inventory(_parquet({"bucket": [INPUT_BUCKET], "size": [1]}), fmt="Parquet", schema="message s3.inventory { }"),
        "inv/data/a.parquet: has no bucket and key columns",
    ),
    (
        "inventory-compression-bomb",
        "m.json",
        _inv_manifest(),
        {},
        _inventory(_bomb_csv_gz(64 * 2**20)),  # ~400x: past the ratio limit within its first MiB
        "a compression bomb",
    ),
    (
        "inventory-key-not-url-encoded-utf8",
        "m.json",
        _inv_manifest(),
        {},
        _inventory(gzip.compress(f'"{INPUT_BUCKET}","a%FF.jpg","1"\n'.encode())),
        "line 1: key 'a%FF.jpg' is not URL-encoded UTF-8",
    ),
    # -- read keys silently wrong
    ("nul-in-key-list-line", "m.json", _NUL_LINE[0], {}, _NUL_LINE[1], "nul.txt line 2: not a key"),
    (
        "tab-in-csv-key",
        "m.json",
        _TAB_CSV[0],
        {},
        _TAB_CSV[1],
        "tab.csv line 2: not a key: 'a\\tb.jpg' holds a control",
    ),
    ("nul-in-inline-key", "m.json", _m(input={"keys": ["a\0.jpg"], "bucket": INPUT_BUCKET}), {}, {}, "U+0000"),
    (
        "jsonl-bucket-not-a-string",
        "m.json",
        _JSONL_BUCKET_NUM[0],
        {},
        _JSONL_BUCKET_NUM[1],
        "'bucket' must be a string",
    ),
    ("jsonl-uri-and-key", "m.json", _JSONL_BOTH[0], {}, _JSONL_BOTH[1], "give 'uri', or 'key' and 'bucket', not both"),
    (
        "duplicate-field",
        "m.json",
        '{"version": 1, "version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {}}',
        {},
        {},
        "field 'version' appears twice",
    ),
    (
        "duplicate-nested-field",
        "m.json",
        '{"version": 1, "model": {"uri": "builtin:reference-cnn"}, '
        '"input": {"keys": ["a"], "bucket": "b1x", "bucket": "b2x"}}',
        {},
        {},
        "field 'bucket' appears twice",
    ),
    ("version-true", "m.json", json.dumps({"version": True, "input": OK_INPUT}), {}, {}, "version: true is not a"),
    ("version-string", "m.json", json.dumps({"version": "1", "input": OK_INPUT}), {}, {}, "the string '1' is not a"),
    (
        "version-float",
        "m.json",
        json.dumps({"version": 1.0, "input": OK_INPUT}),
        {},
        {},
        "unsupported manifest version 1.0",
    ),
    ("keys-per-shard-true", "m.json", _m(job={"keys_per_shard": True}), {}, {}, "job.keys_per_shard: Input should be"),
    ("batch-size-string", "m.json", _m(model={"batch_size": "64"}), {}, {}, "not the string '64'"),
    ("fraction-false", "m.json", _m(max_failed_fraction=False), {}, {}, "max_failed_fraction: Input should be a valid"),
    (
        "thousands-of-mistyped-keys",
        "m.json",
        _m(input={"keys": list(range(5000)), "bucket": INPUT_BUCKET}),
        {},
        {},
        "... and 4980 more problems",
    ),
    ("field-name-of-100-kb", "m.json", _m(**{"x" * 100_000: 1}), {}, {}, "...: unknown field"),
    ("inline-key-number", "m.json", _m(input={"keys": [5], "bucket": INPUT_BUCKET}), {}, {}, "input.keys[0]: Input"),
    # -- accepted what cannot work
    (
        "bucket-uppercase",
        "m.json",
        _m(input={"keys": ["a"], "bucket": "My_Bucket"}),
        {},
        {},
        "input.bucket: 'My_Bucket'",
    ),
    ("bucket-ip", "m.json", _m(input={"keys": ["a"], "bucket": "10.0.0.1"}), {}, {}, "formatted as an IP address"),
    ("bucket-reserved", "m.json", _m(input={"keys": ["a"], "bucket": "xn--abc"}), {}, {}, "reserved by S3"),
    ("bucket-too-short", "m.json", _m(input={"keys": ["a"], "bucket": "ab"}), {}, {}, "3 to 63 characters"),
    (
        "prefix-bad-bucket",
        "m.json",
        json.dumps({"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"prefix": "s3://Bad..b/p/"}}),
        {},
        {},
        "input.prefix: 's3://Bad..b/p/'",
    ),
    ("output-https", "m.json", _m(output={"prefix": "https://x.example/out/"}), {}, {}, "output.prefix: 'https://"),
    ("output-local-path", "m.json", _m(output={"prefix": "/data/out/"}), {}, {}, "is not an s3:// URI"),
    (
        "output-other-bucket",
        "m.json",
        _m(output={"prefix": "s3://someone-else/out/"}),
        {},
        {},
        "bucket 'someone-else' is not the control bucket or an allowed output bucket",
    ),
    ("model-https", "m.json", _m(model={"uri": "https://hub.example/m.pt"}), {}, {}, "workers read models from s3://"),
    ("model-unknown-builtin", "m.json", _m(model={"uri": "builtin:vit-h"}), {}, {}, "unknown builtin model 'vit-h'"),
    (
        "model-missing-object",
        "m.json",
        _m(model={"uri": f"s3://{INPUT_BUCKET}/models/none.pt"}),
        {},
        {},
        f"model.uri: s3://{INPUT_BUCKET}/models/none.pt does not exist",
    ),
    ("model-local-path", "m.json", _m(model={"uri": "/models/m.pt"}), {}, {}, "is a local path"),
    ("queue-not-ours", "m.json", _m(job={"queue": "someone-elses-queue"}), {}, {}, "is not one of Sluice's job queues"),
    (
        "queue-multinode-on-array-queue",
        "m.json",
        _m(job={"mode": "multinode", "queue": "sluice-gpu"}),
        {},
        {},
        "multi-node jobs run only on the On-Demand MNP queue",
    ),
    (
        "inventory-checksum-mismatch",
        "m.json",
        _inv_manifest(),
        {},
        _inventory(_GZ, checksum="0" * 32),
        "does not match s3://images-in/inv/manifest.checksum",
    ),
    (
        "inventory-checksum-missing",
        "m.json",
        _inv_manifest(),
        {},
        {k: v for k, v in _inventory(_GZ).items() if not k.endswith(".checksum")},
        "inv/manifest.checksum does not exist",
    ),
    (
        "inventory-destination-not-a-bucket",
        "m.json",
        _inv_manifest(),
        {},
        {
            **_inventory(_GZ),
            f"{INPUT_BUCKET}/inv/manifest.json": json.dumps(
                {
                    "sourceBucket": "x",
                    "destinationBucket": "arn:aws:s3:::NO",
                    "fileFormat": "CSV",
                    "files": [{"key": "k"}],
                }
            ).encode(),
        },
        "destinationBucket: 'NO' is not a valid bucket name",
    ),
]
CASES += NEW_CASES


@pytest.mark.parametrize(("name", "key", "body", "env", "objects", "reason"), CASES, ids=[c[0] for c in CASES])
def test_rejected_with_a_specific_reason_and_nothing_written(
    aws, stack, monkeypatch, name, key, body, env, objects, reason
):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    for path, data in objects.items():
        b, k = path.split("/", 1)
        aws.s3.put_object(Bucket=b, Key=k, Body=data)
    env = {**DEFAULT_MODEL_ENV, **env}  # a key list names no model: the stack's, so its lines are what is checked
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
    out = invoke_manifest_handler(aws, stack, "manifests/many.txt", body, monkeypatch, DEFAULT_MODEL_ENV)
    assert out["status"] == "rejected" and len(out["reasons"]) <= 21
    assert out["reasons"][0].startswith("many.txt line 1: not a key")
