"""The CLI and incremental runs on S3 (moto): `sluice plan` shows the lineage, `sluice output sql` reads it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.cli import main
from sluice.contracts.plan import RunPlan
from tests.conftest import moto_s3
from tests.plans import run_plan

CTL = "ctl-bucket"


def _plan(s3: Any, run_id: str, lineage: list[str], **kw: Any) -> RunPlan:
    plan = run_plan(run_id, f"s3://{CTL}/runs/{run_id}/", total_keys=3, lineage=lineage, **kw)
    s3.put_object(Bucket=CTL, Key=f"runs/{run_id}/plan.json", Body=plan.model_dump_json().encode())
    s3.put_object(Bucket=CTL, Key=f"runs/{run_id}/output/shard=0/part-0000-000000000.parquet", Body=b"x")
    return plan


@pytest.fixture
def s3() -> Iterator[Any]:
    yield from moto_s3(CTL)


def test_plan_shows_the_lineage_of_an_incremental_manifest(s3, tmp_path, capsys, monkeypatch):
    _plan(s3, "first", [])
    _plan(s3, "second", ["first"])
    path = tmp_path / "m.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"keys": ["s3://images/a.jpg"], "since_run": "second"},
            }
        )
    )
    monkeypatch.setenv("SLUICE_CONTROL_BUCKET", CTL)
    assert main(["plan", str(path), "--json"]) == 0
    inc = json.loads(capsys.readouterr().out)["incremental"]
    assert inc["since_run"] == "second" and inc["lineage"] == ["second", "first"] and inc["skipped"] is None
    assert "prepare stage decides" in inc["note"]
    assert main(["plan", str(path)]) == 0
    assert "since run       second  (lineage second, first)" in capsys.readouterr().out
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "model": {"uri": "builtin:reference-cnn"},
                "input": {"keys": ["s3://images/a.jpg"], "since_run": "nope"},
            }
        )
    )
    assert main(["plan", str(path)]) == 1
    assert "input.since_run: run 'nope' has no plan" in capsys.readouterr().err


def test_output_sql_reads_the_lineage_from_the_control_bucket(s3, capsys):
    _plan(s3, "full", [])
    _plan(s3, "inc", ["full"])
    assert main(["output", "sql", "inc", "--bucket", CTL]) == 0
    sql = capsys.readouterr().out
    assert f"'s3://{CTL}/runs/inc/output/shard=*/part-*.parquet', 's3://{CTL}/runs/full/output/shard=*/part-*" in sql
    assert "_commits/*.json" in sql and "('inc', 0), ('full', 1)" in sql
    assert "o.model_id IN ('builtin:reference-cnn@1;image_size=224')" in sql
    assert main(["output", "sql", "missing", "--bucket", CTL]) == 1
    err = capsys.readouterr().err  # the AWS error, translated once (sluice.aws.store): the object and what to check
    assert f"reading s3://{CTL}/runs/missing/plan.json: NoSuchKey" in err and "check that it exists" in err
