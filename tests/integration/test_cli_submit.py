"""`sluice submit` and `sluice plan` against S3 (moto): what is uploaded, and inventory data files read from S3."""

from __future__ import annotations

import json

import pytest

from sluice.cli import main
from tests.conftest import moto_s3
from tests.unit.test_cli_validate import _write


@pytest.fixture
def s3():
    yield from moto_s3("ctl-bucket")


def _uploaded(s3) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket="ctl-bucket").get("Contents", [])]


def test_submit_refuses_what_plan_rejects_unless_told_not_to_validate(tmp_path, capsys, s3):
    bad = _write(
        tmp_path,
        "m.json",
        {
            "version": 1,
            "model": {"uri": "builtin:reference-cnn"},
            "input": {"keys": ["s3://images/a"]},
            "job": {"keys_per_shard": True},
        },
    )
    assert main(["submit", bad, "--bucket", "ctl-bucket"]) == 1
    err = capsys.readouterr().err
    assert "not uploaded" in err and "job.keys_per_shard: Input should be a valid integer, not true" in err
    assert _uploaded(s3) == []
    assert main(["submit", bad, "--bucket", "ctl-bucket", "--no-validate"]) == 0
    assert _uploaded(s3) == ["manifests/m.json"]


def test_submit_checks_the_output_prefix_against_its_control_bucket(tmp_path, capsys, s3):
    doc = {
        "version": 1,
        "model": {"uri": "builtin:reference-cnn"},
        "input": {"keys": ["s3://images/a"]},
        "output": {"prefix": "s3://elsewhere/out/"},
    }
    assert main(["submit", _write(tmp_path, "o.json", doc), "--bucket", "ctl-bucket"]) == 1
    assert (
        "bucket 'elsewhere' is not the control bucket or an allowed output bucket (ctl-bucket"
        in capsys.readouterr().err
    )
    doc["output"] = {"prefix": "s3://ctl-bucket/out/"}
    assert main(["submit", _write(tmp_path, "o.json", doc), "--bucket", "ctl-bucket", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["manifest"] == "s3://ctl-bucket/manifests/o.json"


def test_plan_of_a_local_inventory_manifest_reads_its_data_files_from_s3(tmp_path, capsys, s3):
    import gzip
    import hashlib

    s3.put_object(Bucket="ctl-bucket", Key="inv/a.csv.gz", Body=gzip.compress(b'"images","a.jpg"\n"images","b.jpg"\n'))
    raw = json.dumps(
        {
            "sourceBucket": "images",
            "destinationBucket": "arn:aws:s3:::ctl-bucket",
            "fileFormat": "CSV",
            "fileSchema": "Bucket, Key",
            "files": [{"key": "inv/a.csv.gz", "size": 40}],
        }
    )
    path = _write(tmp_path, "manifest.json", raw)
    assert main(["plan", path, "--json", "--model", "builtin:reference-cnn"]) == 0
    assert json.loads(capsys.readouterr().out)["unique_keys"] == 2
    (tmp_path / "manifest.checksum").write_text("0" * 32)
    assert main(["plan", path]) == 1
    assert f"{path}: its MD5 does not match" in capsys.readouterr().err
    (tmp_path / "manifest.checksum").write_text(hashlib.md5(raw.encode()).hexdigest())
    assert main(["plan", path, "--model", "builtin:reference-cnn"]) == 0
