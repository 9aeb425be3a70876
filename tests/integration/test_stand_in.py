"""No silent stand-in: a deployed run names its model; a builtin named explicitly runs, warned about everywhere."""

from __future__ import annotations

import io
import json

from sluice.control.table.ledger import Ledger
from sluice.ops.status import cmd_status, render, run_status
from tests.integration.helpers import INPUT_BUCKET, STAND_IN, all_jobs, bus_events, invoke_manifest_handler


def _manifest(**extra) -> str:
    return json.dumps({"version": 1, "input": {"keys": ["img/a.jpg", "img/b.jpg"], "bucket": INPUT_BUCKET}, **extra})


def test_a_deployed_run_without_a_model_is_refused_naming_model_uri_and_how_to_export_one(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    out = invoke_manifest_handler(aws, stack, "manifests/nomodel.json", _manifest(), monkeypatch)
    assert out["status"] == "rejected", out
    (reason,) = out["reasons"]
    assert reason.startswith("model.uri: no model given, and a deployed run does not embed with the builtin stand-in")
    assert "sluice model export" in reason and "docs/models.md" in reason
    assert all_jobs(aws) == []  # nothing ran on random weights
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Manifest Rejected"]
    assert ev["detail"]["reasons"] == out["reasons"]


def test_a_model_entry_without_its_uri_is_refused_too(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    model = [{"uri": STAND_IN}, {"name": "big", "batch_size": 8}]
    out = invoke_manifest_handler(aws, stack, "manifests/half.json", _manifest(model=model), monkeypatch)
    assert out["status"] == "rejected" and out["reasons"][0].startswith("model[1].uri: no model given"), out


def test_a_named_stand_in_runs_with_a_warning_in_run_submitted_the_run_item_and_status(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    body = _manifest(model={"uri": STAND_IN})
    out = invoke_manifest_handler(aws, stack, "manifests/named.json", body, monkeypatch)
    assert out["status"] == "submitted", out
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    warning = ev["detail"]["warnings"][0]
    assert warning.startswith(f"model.uri {STAND_IN}: a builtin stand-in with untrained weights"), warning

    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.get(out["run_id"]).warnings == ev["detail"]["warnings"]  # the RUN item
    shown = run_status(ledger, out["run_id"])
    assert shown["warnings"] == ev["detail"]["warnings"] and shown["gpu_family"] == "g6e"
    text = io.StringIO()
    render(shown, text)
    assert f"warning   {warning}\n" in text.getvalue()  # sluice status
    assert cmd_status(ledger, out["run_id"], watch=False, as_json=False, out=io.StringIO()) == 0


def test_the_old_name_of_the_large_stand_in_is_refused_naming_the_new_one(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    body = _manifest(model={"uri": "builtin:resnet50"})
    out = invoke_manifest_handler(aws, stack, "manifests/old.json", body, monkeypatch)
    assert out["status"] == "rejected", out
    assert "builtin:resnet50 is now builtin:reference-cnn-large: an untrained network" in out["reasons"][0]


def test_local_mode_keeps_the_stand_in_for_a_manifest_without_a_model_and_says_so(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    env = {"SLUICE_LOCAL_MODE": "1"}
    out = invoke_manifest_handler(aws, stack, "manifests/local.json", _manifest(), monkeypatch, env)
    assert out["status"] == "submitted", out
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    assert ev["detail"]["warnings"][0].startswith("model.uri builtin:reference-cnn: a builtin stand-in")


def test_the_stacks_default_model_serves_a_manifest_that_names_none(aws, stack, monkeypatch):
    aws.s3.create_bucket(Bucket=INPUT_BUCKET)
    env = {"SLUICE_DEFAULT_MODEL_URI": "builtin:reference-cnn-large"}
    out = invoke_manifest_handler(aws, stack, "manifests/default.json", _manifest(), monkeypatch, env)
    assert out["status"] == "submitted", out
    (ev,) = [e for e in bus_events(aws, stack) if e["detail-type"] == "Run Submitted"]
    assert ev["detail"]["warnings"][0].startswith("model.uri builtin:reference-cnn-large: a builtin stand-in")
