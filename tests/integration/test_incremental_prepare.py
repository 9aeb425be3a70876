"""Incremental runs (input.since_run) through the real handlers on moto: route, prepare, skip, submit.

The manifest handler sends every since_run manifest to the prepare stage; the prepare
workers' own code runs in-process against moto S3 (HEADs, listings, ranged reads of the
earlier Parquet output); the reduce job's event reaches the real completion handler, which
numbers the shards, writes plan.json (skipped, lineage) and announces "Run Submitted".
"""

from __future__ import annotations

import csv
import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import MapResult, PrepareSpec
from sluice.contracts.sections import ModelSpec
from sluice.contracts.status import RunStatus
from sluice.control.table.ledger import Ledger
from sluice.ops.status import run_status
from sluice.paths import RunPaths
from sluice.prepare import prepare_store
from tests.integration.completion_support import deliver_job_event
from tests.integration.helpers import INPUT_BUCKET, bus_events, invoke_manifest_handler, shard_pairs
from tests.integration.incremental_support import (
    earlier_plan,
    md5,
    prepare_events,
    record_run,
    run_prepare,
    write_chunk,
    write_output,
)

CNN = ModelSpec(uri="builtin:reference-cnn")
RESNET = ModelSpec(uri="builtin:reference-cnn-large")
# The identity a run records: the artifact, then the preprocessing (sluice.modelid); 224 px is the default.
CNN_ID, RESNET_ID = "builtin:reference-cnn@1;image_size=224", "builtin:reference-cnn-large@1;image_size=224"


def _images(aws, names: list[str], version: str = "v1") -> dict[str, str]:
    """Upload one small object per name; returns name -> ETag."""
    if INPUT_BUCKET not in [b["Name"] for b in aws.s3.list_buckets()["Buckets"]]:
        aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    out = {}
    for n in names:
        body = f"{n}:{version}".encode()
        aws.s3.put_object(Bucket=INPUT_BUCKET, Key=n, Body=body)
        out[n] = md5(body)
    return out


def _uri(name: str) -> str:
    return f"s3://{INPUT_BUCKET}/{name}"


def _root(stack, run_id: str) -> str:
    return RunPaths.in_bucket(stack.names["ControlBucket"], run_id).root


def _prepare_and_submit(aws, stack, monkeypatch, out: dict) -> tuple[RunPlan, PrepareSpec]:
    """Run the prepare workers, deliver the prepare jobs' ends; returns the plan and the spec."""
    assert out["status"] == "preparing", out
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.prepare is not None
    spec = PrepareSpec.model_validate_json(ObjectStore(aws.s3).get(row.prepare.spec_uri))
    run_prepare(prepare_store(aws.s3), spec)
    for ev in prepare_events(stack, out["run_id"], out["job_ids"], spec):
        deliver_job_event(stack, ev, monkeypatch)
    plan = RunPlan.model_validate_json(
        ObjectStore(aws.s3).get(RunPaths.in_bucket(stack.names["ControlBucket"], out["run_id"]).plan)
    )
    return plan, spec


def _manifest(input_: dict, **rest) -> str:
    return json.dumps({"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": input_, **rest})


def test_a_prefix_since_run_skips_the_unchanged_keys_and_submits_the_rest(aws, stack, monkeypatch):
    names = [f"img/{i:03d}.jpg" for i in range(30)]
    etags = _images(aws, names)
    unchanged, changed, failed, new = names[:20], names[20:25], names[25:28], names[28:]
    store = prepare_store(aws.s3)
    a = earlier_plan("full-a", _root(stack, "full-a"), [(CNN, CNN_ID)], n_shards=3, total_keys=28)
    rows = [(_uri(n), etags[n], None) for n in unchanged] + [(_uri(n), "0" * 32, None) for n in changed]
    write_output(store, a, [rows])
    # A killed attempt's leftover (no commit marker) names a new key with its current ETag: it does not count.
    write_chunk(
        store,
        a.output_dir(0),
        "part-0001-000000000",
        [(_uri(new[0]), etags[new[0]], None)],
        "m",
        CNN_ID,
        "full-a",
        committed=False,
    )
    # A chunk written before output recorded object versions (key and embedding only): it matches nothing.
    legacy = io.BytesIO()
    pq.write_table(
        pa.table({"key": [_uri(new[1])], "embedding": pa.array([[0.5, 0.5]], pa.list_(pa.float32(), 2))}), legacy
    )
    store.put(a.output_dir(1) + "part-0009-000000000.parquet", legacy.getvalue())
    store.put(a.output_dir(1) + "_commits/part-0009-000000000.json", b"{}")
    record_run(aws, stack, a)
    body = _manifest({"prefix": f"s3://{INPUT_BUCKET}/img/", "since_run": "full-a"}, job={"keys_per_shard": 4})
    out = invoke_manifest_handler(aws, stack, "manifests/inc.json", body, monkeypatch)
    assert [e["detail-type"] for e in bus_events(aws, stack)] == ["Run Preparing"], "a small input is prepared too"
    plan, spec = _prepare_and_submit(aws, stack, monkeypatch, out)

    assert spec.since_run == "full-a" and spec.model_ids == [CNN_ID] and spec.earlier
    assert plan.skipped == {"unchanged": 20} and plan.lineage == ["full-a"]
    assert plan.total_keys == 10 and plan.models[0].model_id == CNN_ID
    embedded = sorted(k for shard in shard_pairs(aws, stack, out["run_id"]) for _, k in shard)
    assert embedded == sorted(changed + failed + new), "exactly the keys to embed, each once"
    assert all(0 < n <= 4 for n in (len(s) for s in shard_pairs(aws, stack, out["run_id"])))
    (submitted,) = bus_events(aws, stack)
    assert submitted["detail-type"] == "Run Submitted"
    assert submitted["detail"]["skipped"] == {"unchanged": 20} and submitted["detail"]["lineage"] == ["full-a"]
    assert submitted["detail"]["total_keys"] == 10 and submitted["detail"]["shards"] == plan.n_shards
    assert any("1 earlier output files have no object versions" in w for w in submitted["detail"]["warnings"])
    shown = run_status(Ledger(aws.dynamodb, stack.names["RunsTable"]), out["run_id"])
    assert shown is not None and shown["status"] == "SUBMITTED"
    assert shown["lineage"] == ["full-a"] and shown["skipped"] == {"unchanged": 20}
    maps = [
        MapResult.model_validate_json(ObjectStore(aws.s3).get(RunPaths(spec.root).map_result(w)))
        for w in range(spec.workers)
    ]
    assert sum(m.versions.listed for m in maps if m.versions) == 30, "the listing's ETags: no HEAD"
    assert sum(m.versions.heads for m in maps if m.versions) == 0
    assert sum(m.versions.earlier_files for m in maps if m.versions) == 10, "committed chunks only (3 x 3, + legacy)"


def test_a_key_list_since_run_heads_each_key_and_needs_every_model_in_a_lineage_of_two(aws, stack, monkeypatch):
    names = [f"pics/{i:02d}.jpg" for i in range(12)]
    v1 = _images(aws, names)
    v2 = _images(aws, names[:3], version="v2")  # changed since run full-a; run inc-b re-embedded them
    store = prepare_store(aws.s3)
    a = earlier_plan("full-a", _root(stack, "full-a"), [(CNN, CNN_ID), (RESNET, RESNET_ID)], n_shards=2, total_keys=12)
    write_output(store, a, [[(_uri(n), v1[n], None) for n in names], [(_uri(n), v1[n], None) for n in names[:-1]]])
    b = earlier_plan(
        "inc-b",
        _root(stack, "inc-b"),
        [(CNN, CNN_ID), (RESNET, RESNET_ID)],
        n_shards=1,
        total_keys=4,
        lineage=["full-a"],
    )
    write_output(store, b, [[(_uri(n), v2[n], None) for n in names[:3]], [(_uri(n), v2[n], None) for n in names[:2]]])
    record_run(aws, stack, a)
    record_run(aws, stack, b)
    keys = [*names, "pics/missing.jpg"]
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key="lists/keys.txt", Body="\n".join(_uri(k) for k in keys).encode())
    models = [{"uri": "builtin:reference-cnn"}, {"uri": "builtin:reference-cnn-large"}]
    body = _manifest({"key_list": f"s3://{INPUT_BUCKET}/lists/keys.txt", "since_run": "inc-b"}, model=models)
    out = invoke_manifest_handler(aws, stack, "manifests/inc2.json", body, monkeypatch)
    plan, spec = _prepare_and_submit(aws, stack, monkeypatch, out)

    # 0, 1: inc-b has both models at v2. 2: inc-b re-embedded it with the CNN only, and full-a's resnet row is
    # of v1. 3..10: full-a has both. 11: full-a has no resnet row. missing: no object, so no version.
    assert plan.lineage == ["inc-b", "full-a"] and plan.skipped == {"unchanged": 10}
    embedded = sorted(k for shard in shard_pairs(aws, stack, out["run_id"]) for _, k in shard)
    assert embedded == sorted([names[2], names[11], "pics/missing.jpg"])
    maps = [
        MapResult.model_validate_json(ObjectStore(aws.s3).get(RunPaths(spec.root).map_result(w)))
        for w in range(spec.workers)
    ]
    counts = [m.versions for m in maps if m.versions]
    assert sum(c.heads for c in counts) == 13 and sum(c.head_missing for c in counts) == 1
    assert [m.model_id for m in plan.models] == [CNN_ID, RESNET_ID]


def test_an_inventory_since_run_compares_version_ids_of_a_versioned_bucket(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    ctl = stack.names["ControlBucket"]
    rows = [  # Bucket, Key, VersionId, IsLatest, IsDeleteMarker, ETag
        (INPUT_BUCKET, "a.jpg", "va2", "true", "false", "ea"),  # a new version of the same bytes
        (INPUT_BUCKET, "a.jpg", "va1", "false", "false", "ea"),
        (INPUT_BUCKET, "b.jpg", "vb1", "true", "false", "eb"),
        (INPUT_BUCKET, "c.jpg", "vc1", "true", "false", "ec"),
        (INPUT_BUCKET, "d.jpg", "vd2", "true", "true", ""),  # deleted since: embedded (and failed as missing)
    ]
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    aws.s3.put_object(Bucket=ctl, Key="inputs/inv/data/1.csv.gz", Body=gzip.compress(buf.getvalue().encode()))
    _inventory_report(aws.s3, ctl, "inputs/inv/", "Bucket, Key, VersionId, IsLatest, IsDeleteMarker, ETag", 100)
    a = earlier_plan("full-a", _root(stack, "full-a"), [(CNN, CNN_ID)], n_shards=1, total_keys=4)
    write_output(
        prepare_store(aws.s3),
        a,
        [[(_uri("a.jpg"), "ea", "va1"), (_uri("b.jpg"), "eb", "vb1"), (_uri("d.jpg"), "ed", "vd1")]],
    )
    record_run(aws, stack, a)
    body = _manifest({"inventory": f"s3://{ctl}/inputs/inv/manifest.json", "since_run": "full-a"})
    plan, _ = _prepare_and_submit(
        aws, stack, monkeypatch, invoke_manifest_handler(aws, stack, "manifests/inv.json", body, monkeypatch)
    )
    assert plan.skipped == {"unchanged": 1}
    embedded = sorted(k for shard in shard_pairs(aws, stack, plan.run_id) for _, k in shard)
    assert embedded == ["a.jpg", "c.jpg", "d.jpg"]


def test_nothing_to_embed_rejects_the_run_saying_the_output_is_complete(aws, stack, monkeypatch):
    etags = _images(aws, ["x/1.jpg", "x/2.jpg"])
    a = earlier_plan("full-a", _root(stack, "full-a"), [(CNN, CNN_ID)], n_shards=1, total_keys=2)
    write_output(prepare_store(aws.s3), a, [[(_uri(n), e, None) for n, e in etags.items()]])
    record_run(aws, stack, a)
    body = _manifest(
        {"keys": ["x/1.jpg", "x/2.jpg"], "bucket": INPUT_BUCKET, "since_run": "full-a"},
        job={"mode": "multinode", "nodes": 2},
    )
    out = invoke_manifest_handler(aws, stack, "manifests/same.json", body, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.prepare is not None
    spec = PrepareSpec.model_validate_json(ObjectStore(aws.s3).get(row.prepare.spec_uri))
    assert [len(t.pairs) for t in spec.tasks if t.kind == "inline"] and spec.partitions == 2
    run_prepare(prepare_store(aws.s3), spec)
    for ev in prepare_events(stack, out["run_id"], out["job_ids"], spec):
        deliver_job_event(stack, ev, monkeypatch)
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.status == RunStatus.REJECTED
    assert row.reasons and "nothing to embed" in row.reasons[0] and "sluice output sql full-a" in row.reasons[0]


def test_another_image_size_embeds_every_key_again_instead_of_nothing_to_embed(aws, stack, monkeypatch):
    # The earlier run embedded both keys at 224 px; at 128 px the vectors differ, so none is "unchanged".
    etags = _images(aws, ["s/1.jpg", "s/2.jpg"])
    a = earlier_plan("at-224", _root(stack, "at-224"), [(CNN, CNN_ID)], n_shards=1, total_keys=2)
    write_output(prepare_store(aws.s3), a, [[(_uri(n), e, None) for n, e in etags.items()]])
    record_run(aws, stack, a)
    inp = {"keys": ["s/1.jpg", "s/2.jpg"], "bucket": INPUT_BUCKET, "since_run": "at-224"}
    body = json.dumps({"version": 1, "model": {"uri": "builtin:reference-cnn", "image_size": 128}, "input": inp})
    out = invoke_manifest_handler(aws, stack, "manifests/at-128.json", body, monkeypatch)
    plan, spec = _prepare_and_submit(aws, stack, monkeypatch, out)
    assert spec.model_ids == ["builtin:reference-cnn@1;image_size=128"] == [m.model_id for m in plan.models]
    assert plan.total_keys == 2 and plan.skipped == {"unchanged": 0}
    assert sorted(k for shard in shard_pairs(aws, stack, out["run_id"]) for _, k in shard) == ["s/1.jpg", "s/2.jpg"]


def test_bad_since_runs_are_rejected_at_upload_with_what_to_do(aws, stack, monkeypatch):
    _images(aws, ["r/1.jpg"])
    running = earlier_plan("still-running", _root(stack, "still-running"), [(CNN, CNN_ID)], n_shards=1, total_keys=1)
    record_run(aws, stack, running, RunStatus.RUNNING)
    rejected = earlier_plan("was-rejected", _root(stack, "was-rejected"), [(CNN, CNN_ID)], n_shards=1, total_keys=1)
    record_run(aws, stack, rejected, RunStatus.REJECTED)
    aws.s3.delete_object(Bucket=stack.names["ControlBucket"], Key="runs/was-rejected/plan.json")
    broken = earlier_plan("broken-plan", _root(stack, "broken-plan"), [(CNN, CNN_ID)], n_shards=1, total_keys=1)
    record_run(aws, stack, broken)
    aws.s3.put_object(Bucket=stack.names["ControlBucket"], Key="runs/broken-plan/plan.json", Body=b'{"run_id": 1}')
    long_ = earlier_plan(
        "long", _root(stack, "long"), [(CNN, CNN_ID)], n_shards=1, total_keys=1, lineage=[f"r{i}" for i in range(16)]
    )
    record_run(aws, stack, long_)
    done = earlier_plan("done", _root(stack, "done"), [(CNN, CNN_ID)], n_shards=1, total_keys=1)
    record_run(aws, stack, done)
    cases = {
        "no-such-run": "input.since_run: no run 'no-such-run'",
        "still-running": "is not finished (status RUNNING): wait until it succeeds or fails",
        "was-rejected": "was rejected and wrote no output",
        "broken-plan": "is not a plan Sluice reads",
        "long": "over the 16 an incremental run may build on",
    }
    for i, (since, expect) in enumerate(cases.items()):
        body = _manifest({"keys": ["r/1.jpg"], "bucket": INPUT_BUCKET, "since_run": since})
        out = invoke_manifest_handler(aws, stack, f"manifests/bad-{i}.json", body, monkeypatch)
        assert out["status"] == "rejected", (since, out)
        assert any(expect in r for r in out["reasons"]), (since, out["reasons"])
    overlap = _manifest(
        {"keys": ["r/1.jpg"], "bucket": INPUT_BUCKET, "since_run": "done"},
        output={"prefix": done.output_prefix + "again/"},
    )
    out = invoke_manifest_handler(aws, stack, "manifests/overlap.json", overlap, monkeypatch)
    assert out["status"] == "rejected" and out["reasons"][0].startswith("output.prefix: "), out
    ctl = stack.names["ControlBucket"]
    _inventory_report(aws.s3, ctl, "inputs/noetag/", "Bucket, Key, Size", 10, data="inputs/noetag/1.csv.gz")
    inv = _manifest({"inventory": f"s3://{ctl}/inputs/noetag/manifest.json", "since_run": "done"})
    out = invoke_manifest_handler(aws, stack, "manifests/noetag.json", inv, monkeypatch)
    assert out["status"] == "rejected" and "has no ETag field" in out["reasons"][0], out
    assert "input.key_list" in out["reasons"][0], "it says what to do instead"
    events = [e["detail-type"] for e in bus_events(aws, stack)]
    assert events == ["Manifest Rejected"] * 7, "nothing was prepared or submitted"


def test_the_prepare_route_plans_with_the_model_artifacts_resolved_ids(aws, stack, monkeypatch):
    # Not incremental: a forced prepare stage, whose plan must carry the s3:// model's real identity
    # (s3etag:<ETag>), which an incremental run built on it compares with, not the placeholder uri:...
    ctl = stack.names["ControlBucket"]
    model = aws.s3.put_object(Bucket=ctl, Key="models/m.pt", Body=b"weights")
    aws.s3.put_object(Bucket=ctl, Key="models/m.pt.json", Body=b'{"image_size": 336}')  # the file's spec decides
    _images(aws, ["m/1.jpg", "m/2.jpg"])
    aws.s3.put_object(Bucket=INPUT_BUCKET, Key="lists/m.txt", Body=b"m/1.jpg\nm/2.jpg\n")
    body = _manifest(
        {"key_list": f"s3://{INPUT_BUCKET}/lists/m.txt", "bucket": INPUT_BUCKET},
        model={"uri": f"s3://{ctl}/models/m.pt"},
    )
    out = invoke_manifest_handler(
        aws, stack, "manifests/s3model.json", body, monkeypatch, {"SLUICE_PREPARE_WORKERS": "2"}
    )
    assert out["status"] == "preparing", out
    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(out["run_id"])
    assert row is not None and row.prepare is not None
    spec = PrepareSpec.model_validate_json(ObjectStore(aws.s3).get(row.prepare.spec_uri))
    run_prepare(prepare_store(aws.s3), spec)
    for ev in prepare_events(stack, out["run_id"], out["job_ids"], spec):
        deliver_job_event(stack, ev, monkeypatch)
    plan = RunPlan.model_validate_json(ObjectStore(aws.s3).get(RunPaths.in_bucket(ctl, out["run_id"]).plan))
    want = "s3etag:" + model["ETag"].strip('"') + (f"@{model['VersionId']}" if model.get("VersionId") else "")
    want += ";image_size=336"  # the sidecar's size, which the worker uses, not the manifest's default 224
    assert plan.models[0].model_id == want == spec.model_ids[0]
    assert plan.lineage == [] and plan.skipped == {} and plan.total_keys == 2


def _inventory_report(s3, ctl: str, prefix: str, schema: str, size: int, data: str = "") -> None:
    """An S3 Inventory manifest.json (CSV, one data file) and its manifest.checksum under `prefix`."""
    report = {
        "sourceBucket": INPUT_BUCKET,
        "destinationBucket": f"arn:aws:s3:::{ctl}",
        "fileFormat": "CSV",
        "fileSchema": schema,
        "files": [{"key": data or prefix + "data/1.csv.gz", "size": size}],
    }
    raw = json.dumps(report).encode()
    s3.put_object(Bucket=ctl, Key=prefix + "manifest.json", Body=raw)
    s3.put_object(Bucket=ctl, Key=prefix + "manifest.checksum", Body=md5(raw).encode())
