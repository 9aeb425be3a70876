"""`sluice plan`, `sluice shard pack` / `cat` on local files (no AWS)."""

from __future__ import annotations

import json

from sluice.cli import main


def test_pack_then_cat_round_trips_keys_exactly(tmp_path, capsys):
    keys = ["s3://images/b.jpg", "s3://images/a b.jpg", "s3://other/x/ü.png", "s3://images/b.jpg"]
    src = tmp_path / "keys.txt"
    src.write_text("\n".join(keys) + "\n")
    assert main(["shard", "pack", str(src), str(tmp_path / "k.shard")]) == 0
    capsys.readouterr()
    assert main(["shard", "cat", str(tmp_path / "k.shard")]) == 0
    assert capsys.readouterr().out.splitlines() == keys  # order and duplicates kept: "exactly as given"
    assert main(["shard", "cat", str(tmp_path / "k.shard"), "--start", "1", "--stop", "3", "--keys-only"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a b.jpg", "x/ü.png"]


def test_pack_with_bare_keys_needs_a_bucket(tmp_path, capsys):
    src = tmp_path / "keys.txt"
    src.write_text("a.jpg\n")
    assert main(["shard", "pack", str(src), str(tmp_path / "k.shard")]) == 1
    assert "bare key 'a.jpg' but no bucket" in capsys.readouterr().err
    assert main(["shard", "pack", str(src), str(tmp_path / "k.shard"), "--bucket", "images"]) == 0


def test_cat_of_a_corrupt_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.shard"
    bad.write_bytes(b"not a shard at all, just some bytes to be long enough....")
    assert main(["shard", "cat", str(bad)]) == 1
    assert "not a Sluice shard" in capsys.readouterr().err


def test_plan_json_reports_duplicates_and_layout(tmp_path, capsys):
    src = tmp_path / "list.txt"
    src.write_text("".join(f"s3://images/k{i % 90}.jpg\n" for i in range(100)))
    assert main(["plan", str(src), "--json", "--model", "builtin:reference-cnn"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["unique_keys"] == 90 and out["duplicates_removed"] == 10 and out["shards"] == 1
    assert out["jobs"] == [{"kind": "single", "shard_offset": 0, "shard_count": 1}]


def test_a_key_list_names_no_model_so_the_plan_refuses_it_unless_the_stack_names_one(tmp_path, capsys, monkeypatch):
    src = tmp_path / "list.txt"
    src.write_text("s3://images/a.jpg\n")
    assert main(["plan", str(src)]) == 1
    assert "model.uri: no model given" in capsys.readouterr().err
    monkeypatch.setenv("SLUICE_DEFAULT_MODEL_URI", "s3://models/minilm.pt")
    assert main(["plan", str(src), "--json", "--assume-keys", "10"]) == 0
    assert json.loads(capsys.readouterr().out)["checks"]


def test_plan_of_a_json_manifest_with_inline_keys(tmp_path, capsys):
    m = {
        "version": 1,
        "input": {"keys": [f"k{i}" for i in range(25)], "bucket": "images"},
        "job": {"mode": "multinode", "nodes": 4},
    }
    (tmp_path / "m.json").write_text(json.dumps(m))
    assert main(["plan", str(tmp_path / "m.json"), "--model", "builtin:reference-cnn"]) == 0
    out = capsys.readouterr().out
    assert "multinode  (On-Demand: MNP cannot use Spot)" in out and "4 x <= 7 keys" in out


def test_plan_of_a_bad_manifest_lists_reasons(tmp_path, capsys):
    (tmp_path / "m.json").write_text(json.dumps({"version": 1, "input": {"keys": ["a"]}, "extra": 1}))
    assert main(["plan", str(tmp_path / "m.json"), "--model", "builtin:reference-cnn"]) == 1
    assert "extra: unknown field" in capsys.readouterr().err
