"""docs/schemas/ holds the current JSON Schema of every event detail (CI fails when it is stale)."""

from __future__ import annotations

import json

import pytest

from sluice.contracts.events import EVENT_DETAILS, RunFailed, RunSucceeded, parse_detail
from sluice.ops import schemas


def test_committed_schemas_are_current():
    assert schemas.stale() == [], "run `python -m sluice.ops.schemas` and commit docs/schemas/"


def test_every_event_detail_has_a_schema_file():
    names = sorted(schemas.file_name(c) for c in EVENT_DETAILS)
    assert names == sorted(p.name for p in schemas.SCHEMA_DIR.glob("*.json"))
    # Run Preparing, Run Submitted, Manifest Rejected, Run Progress, Run Waiting, Run Succeeded, Run Failed,
    # Run Indexed, Index Failed
    assert len(names) == 9


def test_check_detects_a_stale_or_extra_schema(tmp_path):
    assert schemas.main(["--dir", str(tmp_path)]) == 0
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 0
    target = tmp_path / "run-failed.json"
    doc = json.loads(target.read_text())
    doc["properties"].pop("stage")
    target.write_text(json.dumps(doc))
    (tmp_path / "old-event.json").write_text("{}")
    assert schemas.stale(tmp_path) == ["old-event.json", "run-failed.json"]
    assert schemas.main(["--check", "--dir", str(tmp_path)]) == 1


def test_schema_forbids_unknown_fields_and_lists_required_ones():
    doc = json.loads((schemas.SCHEMA_DIR / "run-succeeded.json").read_text())
    assert doc["additionalProperties"] is False and doc["title"] == "Run Succeeded"
    assert {"run_id", "processed", "failed", "output_prefix"} <= set(doc["required"])


def test_parse_detail_round_trips_and_rejects_drift():
    ok = RunFailed(run_id="r", reason="x", shards_failed=[1], failed_keys_uri=None)
    assert parse_detail("Run Failed", json.loads(ok.model_dump_json())) == ok
    with pytest.raises(ValueError):
        parse_detail("Run Failed", {**ok.model_dump(), "shards_failed": 0})  # the int an old writer sent
    with pytest.raises(ValueError):
        parse_detail("Run Succeeded", {"run_id": "r", "surprise": 1})
    with pytest.raises(ValueError, match="not a Sluice event"):
        parse_detail("Run Exploded", {})
    assert RunSucceeded.detail_type == "Run Succeeded"
