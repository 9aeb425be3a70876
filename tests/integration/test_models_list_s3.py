"""A model in S3 (moto) is identified by its object version."""

from __future__ import annotations

from sluice import modelid


def test_an_s3_model_is_identified_by_its_object_version(aws):
    aws.s3.create_bucket(Bucket="models-bucket")
    aws.s3.put_object(Bucket="models-bucket", Key="m/clip.pt", Body=b"v1")
    first = modelid.resolve("s3://models-bucket/m/clip.pt", aws.s3)
    assert first == modelid.resolve("s3://models-bucket/m/clip.pt", aws.s3)
    aws.s3.put_object(Bucket="models-bucket", Key="m/clip.pt", Body=b"other weights")
    assert modelid.resolve("s3://models-bucket/m/clip.pt", aws.s3) != first
