"""Data locality on moto: an input bucket in another Region is warned about, by name, with its transfer priced."""

from __future__ import annotations

import json

import pytest

from sluice.cli import main
from sluice.preflight import locality
from sluice.preflight.estimate import TRANSFER_PER_GB
from tests.integration.helpers import bus_events, invoke_manifest_handler


@pytest.fixture(autouse=True)
def _fresh_region_cache():
    locality._REGIONS.clear()  # moto sessions reuse bucket names across tests
    yield
    locality._REGIONS.clear()


def _bucket(aws, name: str, region: str) -> None:
    conf = {} if region == "us-east-1" else {"CreateBucketConfiguration": {"LocationConstraint": region}}
    aws.s3.create_bucket(Bucket=name, **conf)


def _manifest(keys: list[str]) -> str:
    return json.dumps(
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"keys": keys},
            "job": {"keys_per_shard": 100},
        }
    )


def test_the_manifest_function_warns_about_a_bucket_in_another_region(aws, stack, monkeypatch):
    _bucket(aws, "photos-far", "eu-west-1")
    _bucket(aws, "photos-near", "us-east-1")
    keys = [f"s3://photos-far/a/{i}.jpg" for i in range(40)] + [f"s3://photos-near/b/{i}.jpg" for i in range(40)]
    out = invoke_manifest_handler(aws, stack, "manifests/far.json", _manifest(keys), monkeypatch)
    assert out["status"] == "submitted", out
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    far = [w for w in ev["detail"]["warnings"] if w.startswith("preflight: data locality")]
    assert len(far) == 1, ev["detail"]["warnings"]
    # 40 of the 80 keys at the assumed 250 KB an object: 0.01 GB at $0.02/GB.
    assert "input bucket photos-far is in eu-west-1, the stack in us-east-1" in far[0]
    assert "photos-near" not in far[0] and "assumed 250 KB an object" in far[0] and "$0.02/GB" in far[0]
    assert locality._REGIONS == {"photos-far": "eu-west-1", "photos-near": "us-east-1"}  # asked once each


def test_sluice_plan_prices_the_transfer_into_the_estimate(aws, tmp_path, capsys):
    _bucket(aws, "archive-tokyo", "ap-northeast-1")
    for i in range(5):
        aws.s3.put_object(Bucket="archive-tokyo", Key=f"img/{i}.jpg", Body=b"x")
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"prefix": "s3://archive-tokyo/img/"}}
        )
    )
    assert main(["plan", str(path), "--json", "--input-gb", "500"]) == 0
    s = json.loads(capsys.readouterr().out)
    (check,) = [c for c in s["checks"] if c["name"] == "data locality"]
    assert check["status"] == "warn" and "archive-tokyo is in ap-northeast-1" in check["advice"]
    assert "the input's size" in check["advice"] and check["value"] == 500
    assert s["cost"]["transfer_gb"] == 500 and s["cost"]["transfer_usd"] == 500 * TRANSFER_PER_GB
    gpu_usd = round(s["cost"]["gpu_hours"] * 1.861, 2)  # g6e On-Demand, plus the transfer
    assert abs(s["cost"]["on_demand_usd"] - (gpu_usd + 10.0)) < 0.02
    assert main(["plan", str(path), "--input-gb", "500"]) == 0  # the table says it too
    assert "includes $10.00 for 500.0 GB across Regions" in capsys.readouterr().out


def test_a_bucket_in_the_stacks_region_is_not_warned_about(aws, tmp_path, capsys):
    _bucket(aws, "local-pics", "us-east-1")
    aws.s3.put_object(Bucket="local-pics", Key="img/0.jpg", Body=b"x")
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {"version": 1, "model": {"uri": "builtin:reference-cnn"}, "input": {"prefix": "s3://local-pics/img/"}}
        )
    )
    assert main(["plan", str(path), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert not [c for c in s["checks"] if c["name"] == "data locality"] and "transfer_usd" not in s["cost"]
