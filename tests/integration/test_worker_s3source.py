"""Ranged reads of a shard on S3: a rank fetches the tail (footer+index), the header and its own blocks."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from gpu_worker.sources.ranged import S3RangeSource
from sluice.errors import ShardFormatError
from sluice.shards import ShardReader, encode_shard, rank_slice


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="shards")
        yield client


def test_each_rank_reads_only_its_blocks(s3):
    keys = [f"images/{i:06d}.jpg" for i in range(5000)]
    data = encode_shard([("imgs", keys)], sort=False, block_keys=100, codec="none")
    s3.put_object(Bucket="shards", Key="0.shard", Body=data)
    whole = ShardReader(data)
    world = 4
    for rank in range(world):
        src = S3RangeSource(s3, "shards", "0.shard", tail_bytes=4096)
        reader = ShardReader(src)
        lo, hi = rank_slice(len(keys), world, rank)
        assert [k for _, ks in reader.groups(lo, hi) for k in ks] == keys[lo:hi]
        tail, header, *blocks = src.requests
        assert tail == (len(data) - 4096, 4096) and header == (0, 16)
        mine = {(b.offset, b.length) for b in whole.blocks if b.first < hi and b.first + b.n_keys > lo}
        assert set(blocks) <= mine  # nothing outside the slice ...
        assert all(off >= tail[0] for off, _ in mine - set(blocks))  # ... the rest came with the tail
        assert sum(n for _, n in blocks) < len(data) / 3


def test_small_object_is_read_in_one_request(s3):
    data = encode_shard([("imgs", ["a", "b", "c"])])
    s3.put_object(Bucket="shards", Key="small.shard", Body=data)
    src = S3RangeSource(s3, "shards", "small.shard")
    assert list(ShardReader(src).uris()) == ["s3://imgs/a", "s3://imgs/b", "s3://imgs/c"]
    assert src.requests == [(0, len(data))]


def test_truncated_shard_is_a_format_error(s3):
    data = encode_shard([("imgs", [f"k{i}" for i in range(300)])], block_keys=10)
    s3.put_object(Bucket="shards", Key="cut.shard", Body=data[:-5])
    with pytest.raises(ShardFormatError):
        ShardReader(S3RangeSource(s3, "shards", "cut.shard"))
