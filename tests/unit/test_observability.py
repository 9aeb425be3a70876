"""Recording rules, alerts and the dashboard stay consistent; promtool tests every rule."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

OBS = Path(__file__).resolve().parents[2] / "observability"


def _rules() -> dict:
    return yaml.safe_load((OBS / "rules.yml").read_text())


def test_dashboard_reads_only_recording_rules():
    recorded = {r["record"] for g in _rules()["groups"] for r in g["rules"] if "record" in r}
    dash = json.loads((OBS / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"[a-z_]+:[a-z0-9_:]+", e)}
    assert used and used <= recorded
    assert not any(re.search(r"\bsluice_[a-z_]+", e) for e in exprs), "raw per-rank series on the dashboard"


def test_every_rule_and_alert_has_a_promtool_test():
    tests = yaml.safe_load((OBS / "rules.test.yml").read_text())["tests"]
    assert tests, "rules.test.yml has no tests"
    tested_exprs = {t["expr"].split("{")[0] for case in tests for t in case.get("promql_expr_test", [])}
    tested_alerts = {a["alertname"] for case in tests for a in case.get("alert_rule_test", [])}
    rules = [r for g in _rules()["groups"] for r in g["rules"]]
    assert any("record" in r for r in rules) and any("alert" in r for r in rules)
    assert {r["record"] for r in rules if "record" in r} <= tested_exprs
    assert {r["alert"] for r in rules if "alert" in r} <= tested_alerts


def test_promtool_checks_and_tests_the_rules():
    if shutil.which("promtool") is None:
        if os.environ.get("CI"):
            pytest.fail("promtool missing in CI: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    for args in (["check", "rules", "rules.yml"], ["test", "rules", "rules.test.yml"]):
        proc = subprocess.run(["promtool", *args], cwd=OBS, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout
