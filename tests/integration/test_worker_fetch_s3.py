"""The fetcher on moto's S3: the bytes read come with their ETag and version id."""

from __future__ import annotations

import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.sources.fetch import Fetcher


@pytest.mark.parametrize("versioned", [False, True])
def test_the_object_version_comes_with_its_bytes(aws, versioned):
    """On moto's S3: the ETag (unquoted) and, in a versioned bucket, the version id of the bytes read."""
    s3 = aws.s3
    s3.create_bucket(Bucket="imgs")
    if versioned:
        s3.put_bucket_versioning(Bucket="imgs", VersioningConfiguration={"Status": "Enabled"})
    s3.put_object(Bucket="imgs", Key="a.jpg", Body=b"old")
    put = s3.put_object(Bucket="imgs", Key="a.jpg", Body=b"new bytes")
    got = Fetcher(WorkerConfig(), client=s3).get("imgs", "a.jpg")
    assert got.data == b"new bytes" and got.etag == put["ETag"].strip('"') and '"' not in got.etag
    assert got.version_id == (put["VersionId"] if versioned else None)
