"""The prepare stage's store on moto S3: scratch tags, ranged reads, streams, a missing key."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from sluice.aws.errors import AwsFatalError
from sluice.paths import SCRATCH_TAG
from sluice.prepare import prepare_store


@mock_aws
def test_s3_store_on_moto():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="ctl")
    store = prepare_store(s3)
    store.put("s3://ctl/runs/r/shards/0.shard", b"abcdef", tagging=SCRATCH_TAG)
    tags = s3.get_object_tagging(Bucket="ctl", Key="runs/r/shards/0.shard")["TagSet"]
    assert tags == [{"Key": "sluice-scratch", "Value": "true"}]
    assert store.get_range("s3://ctl/runs/r/shards/0.shard", 2, 4) == b"cd"
    assert store.get_range("s3://ctl/runs/r/shards/0.shard", 10, 20) == b""
    assert b"".join(store.stream("s3://ctl/runs/r/shards/0.shard", 1, chunk=2)) == b"bcdef"
    assert store.exists("s3://ctl/runs/r/shards/0.shard") and not store.exists("s3://ctl/nope")
    with pytest.raises(AwsFatalError, match="NoSuchKey"):
        store.get("s3://ctl/nope")
