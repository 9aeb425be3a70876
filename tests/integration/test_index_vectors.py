"""Amazon S3 Vectors as the index stage's second target (moto's s3vectors): sharded, batched, one vector a key.

The Lance build runs on local paths (as `sluice index build` does); the vectors go to moto's
S3 Vectors through the real boto3 client, whose PutVectors calls are counted by a botocore hook.
"""

from __future__ import annotations

from typing import Any

import boto3
import numpy as np
import pytest
from moto import mock_aws

from sluice.contracts.manifest import Manifest, VectorsTarget
from sluice.index.build import build
from sluice.index.vectors import PUT_BATCH, VectorsError, index_name, shard_of, upsert, vector
from tests.index_support import clustered, uris, write_run


@pytest.fixture
def vectors_client() -> Any:
    with mock_aws():
        c = boto3.client("s3vectors", region_name="us-east-1")
        c.create_vector_bucket(vectorBucketName="vecs")
        yield c


def _listed(c: Any, index: str) -> dict[str, Any]:
    got: dict[str, Any] = {}
    kwargs: dict[str, Any] = {
        "vectorBucketName": "vecs",
        "indexName": index,
        "returnData": True,
        "returnMetadata": True,
    }
    while True:
        resp = c.list_vectors(**kwargs)
        got.update({v["key"]: v for v in resp["vectors"]})
        if not resp.get("nextToken"):
            return got
        kwargs["nextToken"] = resp["nextToken"]


def _count_puts(c: Any) -> list[int]:
    sizes: list[int] = []
    c.meta.events.register(
        "before-parameter-build.s3vectors.PutVectors", lambda params, **_: sizes.append(len(params["vectors"]))
    )
    return sizes


def test_a_runs_rows_land_once_each_in_its_shards_index_in_batches_of_at_most_500(tmp_path, vectors_client):
    keys, x = uris(1300), clustered(1300, 16, 1)
    write_run(str(tmp_path / "runs"), "r1", keys, x, chunk_keys=400)
    report = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    sizes = _count_puts(vectors_client)

    got = upsert(report, "Cats_2026", VectorsTarget(bucket="vecs", shards=2), vectors_client)
    names = [index_name("Cats_2026", "reference-cnn", s) for s in range(2)]
    assert names == ["cats-2026-reference-cnn-000", "cats-2026-reference-cnn-001"]
    assert (got.bucket, got.indexes, got.vectors) == ("vecs", names, 1300)
    assert sum(sizes) == 1300 and max(sizes) == PUT_BATCH, sizes
    held = {name: _listed(vectors_client, name) for name in names}
    assert sum(len(v) for v in held.values()) == 1300
    for s, name in enumerate(names):
        assert all(shard_of(k, 2) == s for k in held[name]), "each key in its own shard's index"
    (desc,) = [vectors_client.get_index(vectorBucketName="vecs", indexName=names[0])["index"]]
    assert (desc["dimension"], desc["dataType"], desc["distanceMetric"]) == (16, "float32", "cosine")
    v = held[names[shard_of(keys[7], 2)]][keys[7]]
    assert np.allclose(v["data"]["float32"], x[7].astype(np.float16).astype(np.float32))
    mid = "builtin:reference-cnn@1;image_size=224"
    assert v["metadata"] == {"model_id": mid, "run": "r1", "etag": v["metadata"]["etag"]}

    # A retried stage: the table already holds r1 (skipped), its rows are put again, still one vector a key.
    again = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    assert again.tables[0].skipped == ["r1"]
    assert upsert(again, "Cats_2026", VectorsTarget(bucket="vecs", shards=2), vectors_client).vectors == 1300
    assert sum(len(_listed(vectors_client, n)) for n in names) == 1300


def test_an_incremental_run_replaces_its_keys_vectors_with_the_newest_rows(tmp_path, vectors_client):
    keys, x = uris(40), clustered(40, 8, 2)
    runs, idx = tmp_path / "runs", str(tmp_path / "idx")
    write_run(str(runs), "r1", keys, x, created_at="2026-01-01T00:00:00+00:00")
    target = VectorsTarget(bucket="vecs", shards=1)
    upsert(build([str(runs / "r1")], idx), "photos", target, vectors_client)
    x2 = clustered(10, 8, 3)
    write_run(str(runs), "r2", keys[:10], x2, created_at="2026-01-02T00:00:00+00:00", lineage=["r1"])
    got = upsert(build([str(runs / "r2")], idx), "photos", target, vectors_client)
    held = _listed(vectors_client, "photos-reference-cnn-000")
    assert got.vectors == 40 and len(held) == 40  # r2's 10 rows, and r1's 30 rows the table still holds
    assert {k for k, v in held.items() if v["metadata"]["run"] == "r2"} == set(keys[:10])
    assert np.allclose(held[keys[3]]["data"]["float32"], x2[3].astype(np.float16).astype(np.float32))


def test_a_key_too_long_for_s3_vectors_is_hashed_and_kept_in_the_metadata():
    long_key = "s3://images/" + "k" * 1100 + ".jpg"
    v = vector(long_key, [0.5], {"run": "r"})
    assert v["key"].startswith("sha256:") and len(v["key"]) == 71 and v["metadata"] == {"run": "r", "key": long_key}
    assert vector("s3://images/a.jpg", [0.5], {})["key"] == "s3://images/a.jpg"


def test_a_refused_call_names_the_bucket_index_and_the_grant(tmp_path, vectors_client):
    write_run(str(tmp_path / "runs"), "r1", uris(5), clustered(5, 4, 1))
    report = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    why = r"S3 Vectors create_index on missing/photos-reference-cnn-000 failed: .*CreateIndex and PutVectors on"
    with pytest.raises(VectorsError, match=why):
        upsert(report, "photos", VectorsTarget(bucket="missing", shards=1), vectors_client)


def test_the_manifest_names_the_target_and_its_shards():
    body = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"keys": ["a.jpg"], "bucket": "in-bucket"},
    }
    on = Manifest.model_validate({**body, "output": {"index": {"s3_vectors": {"bucket": "my-vectors", "shards": 4}}}})
    target = on.output.index.target("ctl-bucket", "cats")
    assert target is not None and target.s3_vectors == VectorsTarget(bucket="my-vectors", shards=4)
    for bad in ({"bucket": "My_Vectors"}, {"bucket": "vv", "shards": 0}, {"bucket": "vvv", "shards": 101}):
        with pytest.raises(ValueError, match="s3_vectors"):
            Manifest.model_validate({**body, "output": {"index": {"s3_vectors": bad}}})
