"""Split estimates and prefix ranges on moto S3: inventory HEADs, real listings."""

from __future__ import annotations

import gzip
import json
import os

import boto3
from moto import mock_aws

from sluice.prepare import prepare_store
from sluice.prepare.split import estimate_inventory, estimate_prefix, prefix_tasks
from tests.unit.test_prepare_split import FakeLister, _listed


@mock_aws
def test_inventory_estimate_heads_unsized_files():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="inv")
    for name, n in (("a.csv.gz", 1000), ("b.csv.gz", 3000)):
        s3.put_object(Bucket="inv", Key=name, Body=gzip.compress(os.urandom(n)))
    manifest = {
        "fileFormat": "CSV",
        "destinationBucket": "arn:aws:s3:::inv",
        "files": [{"key": "a.csv.gz"}, {"key": "b.csv.gz"}],
    }
    s3.put_object(Bucket="inv", Key="m.json", Body=json.dumps(manifest).encode())
    est = estimate_inventory(prepare_store(s3), "s3://inv/m.json")
    assert est.total_bytes == sum(
        s3.head_object(Bucket="inv", Key=k)["ContentLength"] for k in ("a.csv.gz", "b.csv.gz")
    )
    assert est.keys_estimate == est.total_bytes // 20
    one_head = estimate_inventory(prepare_store(s3), "s3://inv/m.json", max_heads=1)
    assert one_head.total_bytes == 2 * one_head.report.sizes[0]  # the unHEADed file gets the mean


@mock_aws
def test_prefix_ranges_on_moto_and_estimate():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="imgs")
    keys = [f"cam/{c}/{i:03d}.jpg" for c in ("a", "b", "c") for i in range(40)] + [
        "cam/top.jpg",
        "cam/b/",
        "other/x.jpg",
    ]
    for k in keys:
        s3.put_object(Bucket="imgs", Key=k, Body=b"x")
    tasks = prefix_tasks(s3, "imgs", "cam/", 3)
    assert sorted(_listed(prepare_store(s3), tasks)) == sorted(
        k for k in keys if k.startswith("cam/") and not k.endswith("/")
    )
    assert estimate_prefix(s3, "imgs", "cam/", max_pages=5).keys_estimate == 121
    partial = estimate_prefix(prepare_store(FakeLister(set(keys), 10)), "imgs", "cam/", max_pages=2, max_keys=999)
    assert (partial.listed, partial.exact, partial.keys_estimate) == (20, False, 999)
