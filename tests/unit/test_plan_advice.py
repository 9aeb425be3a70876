"""`sluice plan --assume-keys` on a big input: the advice a capacity plan needs, and no warning about
a limit Sluice handles itself."""

from __future__ import annotations

import json

from sluice.cli import main


def _plan(tmp_path, capsys, inp: dict, job: dict, keys: int) -> dict:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"version": 1, "input": inp, "job": job, "model": {"uri": "builtin:reference-cnn"}}))
    assert main(["plan", str(path), "--assume-keys", str(keys), "--json"]) == 0
    return {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}


def test_300m_keys_of_a_prefix_get_the_inventory_and_start_up_advice(tmp_path, capsys):
    checks = _plan(tmp_path, capsys, {"prefix": "s3://my-images/stock/"}, {"keys_per_shard": 10_000}, 300_000_000)
    listing = checks["prefix listing"]
    assert listing["status"] == "warn" and listing["value"] == 300_000 and "S3 Inventory" in listing["advice"]
    startup = checks["child start-up share"]  # 30,000 children of ~14 s of GPU work each
    assert startup["status"] == "warn" and "each of 30,000 children spends about 60 s starting" in startup["advice"]
    assert "raise job.keys_per_shard to about" in startup["advice"]
    assert checks["array size"]["status"] == "ok"  # 10,000 of 10,000: Sluice splits the run into 3 jobs


def test_a_key_list_and_long_shards_get_neither(tmp_path, capsys):
    checks = _plan(tmp_path, capsys, {"key_list": "s3://my-images/keys.txt"}, {"keys_per_shard": 200_000}, 20_000_000)
    assert "prefix listing" not in checks
    assert checks["child start-up share"]["status"] == "ok"  # 60 s against ~286 s of work: under a quarter


def test_a_few_short_children_are_not_worth_a_warning(tmp_path, capsys):
    checks = _plan(tmp_path, capsys, {"prefix": "s3://my-images/stock/"}, {"keys_per_shard": 10}, 200)
    assert checks["child start-up share"]["status"] == "ok"  # 20 children: 20 minutes of start-up in all
