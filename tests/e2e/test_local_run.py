"""`sluice local run` as a person runs it: a real subprocess against a real moto server."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "local", "run", *args], capture_output=True, text=True, timeout=300
    )


def test_demo_run_submits_and_reports_json():
    proc = _run("--demo", "64", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["outcome"] == "submitted" and out["ledger_status"] == "SUBMITTED"
    assert out["unique_keys"] == 64 and out["duplicates_removed"] == 1
    assert out["shards"] == 4 and out["jobs"][0]["array_size"] == 4
    assert out["events"] == ["Run Submitted"]


def test_multinode_demo():
    proc = _run("--demo", "30", "--mode", "multinode", "--nodes", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["shards"] == 2 and out["jobs"][0]["queue"] == "sluice-gpu-mnp"


def test_bad_manifest_exits_non_zero_with_reason(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "input": {"keys": ["a.jpg"]}, "typo": true}')
    proc = _run("--manifest", str(bad))
    assert proc.returncode == 1
    assert "typo: unknown field" in proc.stdout and "rejected" in proc.stdout
