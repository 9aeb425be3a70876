"""Recording rules, alerts and the dashboard stay consistent; promtool tests every rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

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


def _raw_families(expr: str) -> set[str]:
    """Raw sluice_* metric families an expression reads (histogram suffixes folded into the family)."""
    names = set(re.findall(r"\bsluice_[a-z0-9_]+", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_rules_read_exactly_the_default_push_list():
    from gpu_worker.telemetry.families import CRITICAL

    read = {n for g in _rules()["groups"] for r in g["rules"] for n in _raw_families(r["expr"])}
    assert read == set(CRITICAL), "pushed but unused, or used but not pushed by default"


def _real_label_names() -> dict[str, set[str]]:
    """Label names of every series a GPU rank really exports (collector and remote writer)."""
    from gpu_worker.telemetry.collector import RankCollector, rank_registry
    from gpu_worker.telemetry.families import FETCH_BUCKETS, INFER_BUCKETS
    from gpu_worker.telemetry.observe import count_retry, observe
    from gpu_worker.telemetry.remote_write import RemoteWriter
    from gpu_worker.telemetry.stats import Stats

    s = Stats()
    count_retry(s, "SlowDown")
    observe(s, "infer", 0.1, INFER_BUCKETS)
    observe(s, "fetch", 0.1, FETCH_BUCKETS)

    class Gpu:
        def read(self) -> dict[str, float]:
            return {"util": 0.5, "mem": 1.0, "power": 1.0, "temp": 1.0}

    ident = {"run_id": "r", "shard": "0", "node": "0", "rank": "0", "gpu": "0", "attempt": "1", "instance_type": "x"}
    reg = rank_registry(RankCollector(s.snapshot, ident, reasons=lambda: {"corrupt": 1}, gpu=Gpu()))
    RemoteWriter("http://127.0.0.1:9/", reg, labels=ident)
    return {smp.name: set(smp.labels) for fam in reg.collect() for smp in fam.samples}


def test_rule_test_inputs_carry_only_the_labels_real_series_carry():
    real = _real_label_names()
    tests = yaml.safe_load((OBS / "rules.test.yml").read_text())["tests"]
    inputs = [i["series"] for case in tests for i in case["input_series"]]
    assert inputs
    for series in inputs:
        name, _, rest = series.partition("{")
        given = set(re.findall(r"([a-z_]+)=", rest))
        assert name in real, f"{name}: not a series a rank exports"
        assert given in (real[name], real[name] - {"gpu"}), (
            f"{series}: labels differ from the real {sorted(real[name])}"
        )
