"""The manifest handler on moto: shards, plan, Batch jobs, ledger row, bus events."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json

import pytest

from sluice.contracts.plan import RunPlan
from sluice.control.table.ledger import Ledger
from tests.integration.helpers import (
    DEFAULT_MODEL_ENV,
    INPUT_BUCKET,
    all_jobs,
    bus_events,
    deliver,
    invoke_manifest_handler,
    object_created_event,
    shard_pairs,
)


@pytest.fixture
def images(aws, stack):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    return INPUT_BUCKET


def _keys(n: int, dup_every: int = 0) -> list[str]:
    ks = [f"assets/2024/07/{i % 28 + 1:02d}/img-{i:05d}.jpg" for i in range(n)]
    if dup_every:
        ks += ks[::dup_every]
    return ks


def test_array_run_shards_exactly_the_unique_keys(aws, stack, images, monkeypatch):
    keys = _keys(95, dup_every=10)  # 95 unique + 10 duplicates
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"keys": keys, "bucket": images},
        "job": {"keys_per_shard": 20},
    }
    out = invoke_manifest_handler(aws, stack, "manifests/cats.json", json.dumps(manifest), monkeypatch)

    assert out["status"] == "submitted", out
    run_id = out["run_id"]
    shards = shard_pairs(aws, stack, run_id)
    flat = [p for s in shards for p in s]
    assert sorted(flat) == sorted({(images, k) for k in keys}) and len(flat) == 95
    assert [len(s) for s in shards] == [20, 20, 20, 20, 15]

    (job,) = all_jobs(aws)
    assert job["arrayProperties"]["size"] == len(shards) == 5
    assert job["jobName"] == f"sluice-{run_id}-0"
    assert job["jobQueue"].endswith("/sluice-gpu")
    env = {e["name"]: e["value"] for e in job["container"]["environment"]}
    assert env["SLUICE_PLAN_URI"] == out["plan_uri"] and env["SLUICE_RUN_ID"] == run_id
    assert job["tags"]["sluice:run-id"] == run_id

    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    assert row.status == "SUBMITTED" and row.total_keys == 95 and row.duplicates == 10
    assert row.job_ids == [job["jobId"]] and row.shards == 5

    (event,) = bus_events(aws, stack)
    assert event["detail-type"] == "Run Submitted" and event["source"] == "sluice"
    d = event["detail"]
    assert (d["run_id"], d["total_keys"], d["shards"], d["mode"], d["job_ids"]) == (
        run_id,
        95,
        5,
        "array",
        [job["jobId"]],
    )
    assert d["manifest"].endswith("/manifests/cats.json")

    plan = RunPlan.model_validate_json(
        aws.s3.get_object(Bucket=stack.names["ControlBucket"], Key=f"runs/{run_id}/plan.json")["Body"].read()
    )
    assert plan.spot_allowed and plan.n_shards == 5 and plan.model.uri == "builtin:reference-cnn"


def test_multinode_run_has_one_shard_per_node_and_no_spot(aws, stack, images, monkeypatch):
    keys = _keys(31)
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"keys": keys, "bucket": images},
        "job": {"mode": "multinode", "nodes": 3},
    }
    out = invoke_manifest_handler(aws, stack, "manifests/mnp.json", json.dumps(manifest), monkeypatch)
    assert out["status"] == "submitted", out
    shards = shard_pairs(aws, stack, out["run_id"])
    assert [len(s) for s in shards] == [11, 11, 9]
    assert sorted(p for s in shards for p in s) == sorted((images, k) for k in keys)
    (job,) = all_jobs(aws)
    assert job["jobQueue"].endswith("/sluice-gpu-mnp")
    # moto echoes the definition's nodeProperties, not nodeOverrides: numNodes=3 is asserted on
    # the request in tests/unit/test_batch.py.
    assert "sluice-worker-mnp" in job["jobDefinition"]
    plan = json.loads(
        aws.s3.get_object(Bucket=stack.names["ControlBucket"], Key=f"runs/{out['run_id']}/plan.json")["Body"].read()
    )
    assert plan["spot_allowed"] is False and plan["mode"] == "multinode"


def test_duplicate_delivery_three_times_submits_one_run(aws, stack, images, monkeypatch):
    control = stack.names["ControlBucket"]
    body = json.dumps(
        {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": _keys(10), "bucket": images}}
    )
    put = aws.s3.put_object(Bucket=control, Key="manifests/dup.json", Body=body)
    event = object_created_event(control, "manifests/dup.json", put, len(body))
    results = [deliver(stack, event, monkeypatch) for _ in range(3)]
    assert [r["status"] for r in results] == ["submitted", "duplicate", "duplicate"]
    assert len({r["run_id"] for r in results}) == 1
    assert len(all_jobs(aws)) == 1
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Run Submitted"]


def test_a_new_upload_of_the_same_key_is_a_new_run(aws, stack, images, monkeypatch):
    body = json.dumps(
        {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": _keys(4), "bucket": images}}
    )
    a = invoke_manifest_handler(aws, stack, "manifests/again.json", body, monkeypatch)
    b = invoke_manifest_handler(aws, stack, "manifests/again.json", body, monkeypatch)
    assert a["status"] == b["status"] == "submitted" and a["run_id"] != b["run_id"]
    assert len(all_jobs(aws)) == 2


def test_a_single_shard_is_a_plain_job_naming_its_shard(aws, stack, images, monkeypatch):
    out = invoke_manifest_handler(
        aws,
        stack,
        "manifests/one.json",
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": ["a.jpg"], "bucket": images}}
        ),
        monkeypatch,
    )
    (job,) = all_jobs(aws)
    assert "arrayProperties" not in job or not job["arrayProperties"].get("size")
    env = {e["name"]: e["value"] for e in job["container"]["environment"]}
    assert env["SLUICE_SHARD_INDEX"] == "0" and out["shards"] == 1


def test_more_shards_than_one_array_allows_become_several_array_jobs(aws, stack, images, monkeypatch):
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"keys": _keys(25), "bucket": images},
        "job": {"keys_per_shard": 2},
    }
    out = invoke_manifest_handler(
        aws, stack, "manifests/big.json", json.dumps(manifest), monkeypatch, extra_env={"SLUICE_MAX_ARRAY_SIZE": "5"}
    )
    assert out["shards"] == 13 and len(out["job_ids"]) == 3
    jobs = sorted(all_jobs(aws), key=lambda j: j["jobName"])
    sizes = [j.get("arrayProperties", {}).get("size") for j in jobs]
    offsets = [{e["name"]: e["value"] for e in j["container"]["environment"]}["SLUICE_SHARD_OFFSET"] for j in jobs]
    assert sizes == [5, 5, 3] and offsets == ["0", "5", "10"]


def test_plain_key_list_uploads_are_runs(aws, stack, images, monkeypatch):
    lines = [f"s3://{images}/{k}" for k in _keys(30)] + [f"s3://{images}/assets/2024/07/01/img-00000.jpg"]
    out = invoke_manifest_handler(
        aws, stack, "manifests/list.txt", "\n".join(lines) + "\n", monkeypatch, DEFAULT_MODEL_ENV
    )
    assert out["status"] == "submitted" and out["total_keys"] == 30 and out["duplicates"] == 1


@pytest.mark.parametrize("fmt", ["txt", "csv", "jsonl"])
def test_key_list_object_formats(aws, stack, images, monkeypatch, fmt):
    keys = [*_keys(40), 'with, comma and "quote".jpg']
    if fmt == "txt":
        body = "\r\n".join(keys[:-1]) + "\n"  # CRLF tolerated; a comma key would be fine too
        keys = keys[:-1]
    elif fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["bucket", "key"])
        for k in keys:
            w.writerow([images, k])
        body = buf.getvalue()
    else:
        body = "\n".join(json.dumps(k if i % 2 else {"key": k, "bucket": images}) for i, k in enumerate(keys))
    aws.s3.put_object(Bucket=images, Key=f"lists/keys.{fmt}", Body=body.encode())
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"key_list": f"s3://{images}/lists/keys.{fmt}", "bucket": images},
    }
    out = invoke_manifest_handler(aws, stack, f"manifests/{fmt}.json", json.dumps(manifest), monkeypatch)
    assert out["status"] == "submitted", out
    flat = [p for s in shard_pairs(aws, stack, out["run_id"]) for p in s]
    assert sorted(flat) == sorted((images, k) for k in keys)


def test_prefix_listing_is_paginated_and_skips_folder_markers(aws, stack, images, monkeypatch):
    for i in range(1_205):  # > 1,000: two ListObjectsV2 pages
        aws.s3.put_object(Bucket=images, Key=f"photos/{i:05d}.jpg", Body=b"x")
    aws.s3.put_object(Bucket=images, Key="photos/sub/", Body=b"")
    aws.s3.put_object(Bucket=images, Key="photos/readme.txt", Body=b"x")
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"prefix": f"s3://{images}/photos/", "suffixes": [".jpg"]},
        "job": {"keys_per_shard": 500},
    }
    out = invoke_manifest_handler(aws, stack, "manifests/prefix.json", json.dumps(manifest), monkeypatch)
    assert out["status"] == "submitted" and out["total_keys"] == 1_205 and out["shards"] == 3


def test_s3_inventory_csv_report(aws, stack, images, monkeypatch):
    keys = ["plain.jpg", "with space.jpg", "plus+sign.jpg", "ünïcode/é.jpg", "folder/"]
    from urllib.parse import quote_plus

    rows = "".join(f'"{images}","{quote_plus(k, safe="/")}","123"\n' for k in keys)
    aws.s3.put_object(Bucket=images, Key="inv/data/a.csv.gz", Body=gzip.compress(rows.encode()))
    inv = {
        "sourceBucket": images,
        "destinationBucket": f"arn:aws:s3:::{images}",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size",
        "files": [{"key": "inv/data/a.csv.gz", "size": 1, "MD5checksum": "x"}],
    }
    raw = json.dumps(inv).encode()
    aws.s3.put_object(Bucket=images, Key="inv/manifest.json", Body=raw)
    aws.s3.put_object(Bucket=images, Key="inv/manifest.checksum", Body=hashlib.md5(raw).hexdigest().encode())
    manifest = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"inventory": f"s3://{images}/inv/manifest.json"},
    }
    out = invoke_manifest_handler(aws, stack, "manifests/inv.json", json.dumps(manifest), monkeypatch)
    assert out["status"] == "submitted", out
    flat = [k for s in shard_pairs(aws, stack, out["run_id"]) for _, k in s]
    assert sorted(flat) == sorted(keys[:-1])  # decoded; folder marker skipped


def test_objects_outside_manifests_are_ignored(aws, stack, monkeypatch):
    out = invoke_manifest_handler(aws, stack, "runs/whatever.json", "{}", monkeypatch)
    assert out["status"] == "ignored" and all_jobs(aws) == [] and bus_events(aws, stack) == []


def test_shards_are_tagged_for_the_scratch_lifecycle_rule(aws, stack, images, monkeypatch):
    out = invoke_manifest_handler(
        aws,
        stack,
        "manifests/tag.json",
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"keys": ["a.jpg"], "bucket": images}}
        ),
        monkeypatch,
    )
    control = stack.names["ControlBucket"]
    tags = aws.s3.get_object_tagging(Bucket=control, Key=f"runs/{out['run_id']}/shards/0.shard")["TagSet"]
    assert {"Key": "sluice-scratch", "Value": "true"} in tags
    plan_tags = aws.s3.get_object_tagging(Bucket=control, Key=f"runs/{out['run_id']}/plan.json")["TagSet"]
    assert plan_tags == []  # the plan and results stay
