"""The CLI and incremental runs: `sluice plan` shows the lineage, `sluice status` the skip, `sluice output sql`."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.cli import main
from sluice.models import RunPlan
from sluice.ops.status import render
from tests.conftest import moto_s3

CTL = "ctl-bucket"


@pytest.fixture
def s3() -> Iterator[Any]:
    yield from moto_s3(CTL)


def _plan(s3: Any, run_id: str, lineage: list[str], **kw: Any) -> RunPlan:
    plan = RunPlan.standalone(run_id, f"s3://{CTL}/runs/{run_id}/", n_shards=1, total_keys=3, lineage=lineage, **kw)
    s3.put_object(Bucket=CTL, Key=f"runs/{run_id}/plan.json", Body=plan.model_dump_json().encode())
    s3.put_object(Bucket=CTL, Key=f"runs/{run_id}/output/shard=0/part-0000-000000000.parquet", Body=b"x")
    return plan


def test_plan_shows_the_lineage_of_an_incremental_manifest(s3, tmp_path, capsys, monkeypatch):
    _plan(s3, "first", [])
    _plan(s3, "second", ["first"])
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"version": 1, "input": {"keys": ["s3://images/a.jpg"], "since_run": "second"}}))
    monkeypatch.setenv("SLUICE_CONTROL_BUCKET", CTL)
    assert main(["plan", str(path), "--json"]) == 0
    inc = json.loads(capsys.readouterr().out)["incremental"]
    assert inc["since_run"] == "second" and inc["lineage"] == ["second", "first"] and inc["skipped"] is None
    assert "prepare stage decides" in inc["note"]
    assert main(["plan", str(path)]) == 0
    assert "since run       second  (lineage second, first)" in capsys.readouterr().out
    path.write_text(json.dumps({"version": 1, "input": {"keys": ["s3://images/a.jpg"], "since_run": "nope"}}))
    assert main(["plan", str(path)]) == 1
    assert "input.since_run: run 'nope' has no plan" in capsys.readouterr().err


def test_status_shows_the_lineage_and_the_skipped_keys() -> None:
    out = io.StringIO()
    render(
        {
            "run_id": "r",
            "status": "SUBMITTED",
            "lineage": ["b", "a"],
            "skipped": {"unchanged": 1200},
            "total_keys": 30,
            "shards_done": 0,
            "shards_total": 3,
            "shards_failed": 0,
            "keys_processed": 0,
            "keys_failed": 0,
        },
        out,
    )
    assert "since     b, a (incremental: skipped 1,200 unchanged)" in out.getvalue()


def test_output_sql_reads_the_lineage_from_the_control_bucket(s3, capsys):
    _plan(s3, "full", [])
    _plan(s3, "inc", ["full"])
    assert main(["output", "sql", "inc", "--bucket", CTL]) == 0
    sql = capsys.readouterr().out
    assert f"'s3://{CTL}/runs/inc/output/shard=*/part-*.parquet', 's3://{CTL}/runs/full/output/shard=*/part-*" in sql
    assert "_commits/*.json" in sql and "('inc', 0), ('full', 1)" in sql
    assert "o.model_id IN ('builtin:reference-cnn@1')" in sql
    assert main(["output", "sql", "missing", "--bucket", CTL]) == 1
    assert "AWS error" in capsys.readouterr().err
