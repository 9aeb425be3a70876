"""`sluice plan` and `sluice submit` validate as the manifest Lambda does, naming local files by their path."""

from __future__ import annotations

import json

from sluice.cli import main


def _write(tmp_path, name: str, doc: object) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def test_plan_names_the_local_file_not_a_made_up_uri(tmp_path, capsys):
    path = _write(tmp_path, "m.json", '{"version": 1,')
    assert main(["plan", path]) == 1
    err = capsys.readouterr().err
    assert f"{path}: not valid JSON" in err and "s3://local" not in err


def test_plan_says_version_1_is_a_number(tmp_path, capsys):
    path = _write(tmp_path, "m.json", {"version": "1", "input": {"keys": ["s3://images/a"]}})
    assert main(["plan", path]) == 1
    err = capsys.readouterr().err
    assert "the string '1' is not a version: write the number" in err and "reads version 1" not in err


def test_plan_bare_key_reason_names_the_bucket_flag(tmp_path, capsys):
    path = _write(tmp_path, "keys.txt", "a.jpg\n")
    assert main(["plan", path, "--model", "builtin:reference-cnn"]) == 1
    assert "bare key 'a.jpg' but no bucket: write s3://bucket/key, or pass --bucket BUCKET" in capsys.readouterr().err
    assert main(["plan", path, "--bucket", "images", "--model", "builtin:reference-cnn", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["buckets"] == ["images"]
    doc = _write(tmp_path, "m.json", {"version": 1, "input": {"keys": ["a.jpg"]}})  # --bucket serves JSON too
    assert main(["plan", doc, "--bucket", "images", "--model", "builtin:reference-cnn", "--json"]) == 0


def test_plan_runs_the_lambdas_checks(tmp_path, capsys, monkeypatch):
    doc = {"version": 1, "input": {"keys": ["s3://images/a"]}, "model": {"uri": "./m.pt"}, "job": {"queue": "q"}}
    path = _write(tmp_path, "m.json", doc)
    assert main(["plan", path]) == 1
    err = capsys.readouterr().err
    assert "model.uri: './m.pt' is a local path" in err and "job.queue: 'q' is not one of Sluice's" in err
    monkeypatch.setenv("SLUICE_LOCAL_MODE", "1")
    monkeypatch.setenv("SLUICE_JOB_QUEUE", "q")
    assert main(["plan", path]) == 0


def test_plan_of_a_local_key_list_names_its_line(tmp_path, capsys):
    path = tmp_path / "keys.txt"
    path.write_bytes(b"\xef\xbb\xbfs3://images/a.jpg\ns3://images/b\x00.jpg\n")
    assert main(["plan", str(path), "--model", "builtin:reference-cnn"]) == 1
    assert "keys.txt line 2: not a key" in capsys.readouterr().err


def test_plan_of_a_missing_file_is_a_rejection_naming_it_without_a_traceback(tmp_path, capfd):
    for name in ("missing.json", "missing.txt"):
        path = str(tmp_path / name)
        assert main(["plan", path]) == 1
        err = capfd.readouterr().err
        assert f"{path}: no such file" in err
        assert "Traceback" not in err and '"level"' not in err
