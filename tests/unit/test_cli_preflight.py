"""`sluice plan` as a preflight: the checks table, --assume-keys, --json, and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from sluice.cli import main


def _manifest(tmp_path, job: dict, name: str = "m.json") -> str:
    path = tmp_path / name
    doc = {
        "version": 1,
        "input": {"keys": ["s3://images/a.jpg", "s3://images/b.jpg"]},
        "job": job,
        "model": {"uri": "builtin:reference-cnn"},
    }
    path.write_text(json.dumps(doc))
    return str(path)


def test_assume_keys_plans_a_300m_run_without_reading_the_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLUICE_MAX_VCPUS", "8000")  # a stack deployed for 2,000 children of 4 vCPUs
    path = _manifest(tmp_path, {"keys_per_shard": 150_000})
    assert main(["plan", path, "--assume-keys", "300000000", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["assumed"] and (s["unique_keys"], s["shards"]) == (300_000_000, 2_000)
    checks = {c["name"]: c for c in s["checks"]}
    assert set(checks["array size"]) == {"name", "value", "limit", "status", "advice", "unit"}
    assert checks["vCPUs for all children at once"]["status"] == "ok"  # 8,000 of 8,000: every child fits
    assert checks["S3 GET/s"]["status"] == "warn" and checks["S3 GET/s"]["value"] == 2_000 * 700
    assert "Lambda memory" not in checks  # 300M keys go to the prepare stage
    assert s["cost"]["working_gpu_hours"] == round(300_000_000 / 700 / 3600, 2) and s["cost"]["family"] == "g6e"
    assert s["cost"]["gpu_hours"] == round(300_000_000 / 700 / 3600 + 2_000 * 60 / 3600, 2)  # and 60 s a child


def test_an_error_check_exits_non_zero_with_the_table(tmp_path, capsys):
    path = _manifest(tmp_path, {"keys_per_shard": 100_000, "timeout_s": 3600})
    assert main(["plan", path, "--assume-keys", "1000000", "--images-per-gpu-s", "10"]) == 1
    out, err = capsys.readouterr()
    assert "ERROR  shard time" in out and "a timed-out attempt is not retried" in out
    assert "1 check(s) failed: the manifest function would reject this run" in err
    assert "cost " in out and "GPU-hours" in out


def test_a_measured_rate_changes_the_estimate_and_the_derived_timeout(tmp_path, capsys):
    path = _manifest(tmp_path, {"keys_per_shard": 10_000})
    assert main(["plan", path, "--assume-keys", "100000", "--images-per-gpu-s", "0.263", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    # 10,000 keys at the case study's ~3.8 GPU-s an image: ~10.6 h a shard, so the timeout grows past 6 h.
    assert s["timeout_derived"] and s["timeout_s"] > 2 * 10_000 / 0.263
    assert s["images_per_gpu_s"] == 0.263 and s["images_per_gpu_s_source"].startswith("measured")
    assert {c["name"]: c["status"] for c in s["checks"]}["shard time"] == "ok"


def test_submit_refuses_what_the_preflight_rejects(tmp_path, capsys):
    path = _manifest(tmp_path, {"mode": "multinode", "nodes": 17})
    assert main(["submit", path, "--bucket", "control"]) == 1
    err = capsys.readouterr().err
    assert "would be rejected" in err and "preflight: MNP vCPUs: every node of an MNP job must run at once" in err


def test_plan_shows_the_index_stages_mode_children_time_and_cost(tmp_path, capsys, monkeypatch):
    from sluice.control.policy import (
        FARGATE_GB_HOUR,
        FARGATE_VCPU_HOUR,
        INDEX_BUILD_S_PER_ROW,
        INDEX_MERGE_S_PER_ROW,
    )

    for var in ("SLUICE_INDEX_FLEET_ROWS", "SLUICE_INDEX_ROWS_PER_CHILD"):
        monkeypatch.delenv(var, raising=False)  # the documented defaults: 2,000,000 and 10,000,000
    path = _manifest(tmp_path, {"keys_per_shard": 150_000})
    assert main(["plan", path, "--assume-keys", "300000000", "--json"]) in (0, 1)
    ix = json.loads(capsys.readouterr().out)["index"]
    assert (ix["mode"], ix["rows"], ix["children"]) == ("fleet", 300_000_000, 30)  # ceil(300M / 10M)
    stages = {s["stage"]: s for s in ix["stages"]}
    assert [s["stage"] for s in ix["stages"]] == ["train", "segments", "commit"] and stages["segments"]["jobs"] == 30
    # A child's time is its 10M rows at the measured build rate; train's the merge of all 300M plus a sample.
    assert stages["segments"]["seconds"] == round(10_000_000 * INDEX_BUILD_S_PER_ROW)
    assert stages["train"]["seconds"] > round(300_000_000 * INDEX_MERGE_S_PER_ROW)
    child_usd = stages["segments"]["seconds"] / 3600 * (4 * FARGATE_VCPU_HOUR + 16 * FARGATE_GB_HOUR)
    assert abs(stages["segments"]["usd"] - 30 * child_usd) < 0.02
    assert ix["wall_s"] == sum(s["seconds"] for s in ix["stages"]) and ix["usd"] > 0
    assert "fargate" in ix["prices"].lower() and "2025" in ix["prices"]

    # The text says it too; below the threshold it is one job, and an index turned off says so.
    assert main(["plan", path, "--assume-keys", "300000000"]) in (0, 1)
    text = capsys.readouterr().out
    assert "index mode      fleet" in text and "30 segment children" in text
    assert "  segments      30 x 4 vCPU / 16,384 MiB" in text and "index time      about " in text
    assert main(["plan", path, "--assume-keys", "1000", "--json"]) == 0
    small = json.loads(capsys.readouterr().out)["index"]
    assert (small["mode"], small["children"], [s["stage"] for s in small["stages"]]) == ("single", 0, ["single"])
    monkeypatch.setenv("SLUICE_INDEX_FLEET_ROWS", "500")
    assert main(["plan", path, "--assume-keys", "1000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["index"]["children"] == 2  # at least 2: Batch's array minimum
    off = tmp_path / "off.json"
    off.write_text(json.dumps({**json.loads(Path(path).read_text()), "output": {"index": False}}))
    assert main(["plan", str(off), "--assume-keys", "1000"]) == 0
    assert "index           off (output.index)" in capsys.readouterr().out
