"""Models in S3 (moto): resolve_uri downloads a model and its sidecar spec."""

from __future__ import annotations

import pytest
import torch

from gpu_worker.errors import ConfigError
from gpu_worker.models.load import load_model
from gpu_worker.models.spec import resolve_uri
from tests.unit.test_worker_model import Tiny

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")


def test_resolve_uri_downloads_model_and_sidecar(tmp_path):
    from moto import mock_aws

    from sluice.aws.store import ObjectStore

    src = tmp_path / "src.pt"
    torch.jit.save(torch.jit.script(Tiny().eval()), str(src))
    with mock_aws():
        import boto3

        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="models")
        s3.put_object(Bucket="models", Key="m/tiny.pt", Body=src.read_bytes())
        s3.put_object(Bucket="models", Key="m/tiny.pt.json", Body=b'{"output_dim": 12}')
        local = resolve_uri("s3://models/m/tiny.pt", str(tmp_path / "work"), ObjectStore(s3))
        assert resolve_uri("builtin:reference-cnn", str(tmp_path), ObjectStore(s3)) == "builtin:reference-cnn"
        with pytest.raises(ConfigError, match="cannot download model"):
            resolve_uri("s3://models/m/missing.pt", str(tmp_path / "work"), ObjectStore(s3))
    _, info = load_model(local, 16)
    assert info.output_dim == 12
