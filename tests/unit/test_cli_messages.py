"""What the CLI says when a new user gets something wrong: no internal names, the flag to use, no retry promised."""

from __future__ import annotations

import pytest

from sluice.cli import main


def test_version_and_a_missing_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("sluice ")
    for argv, wanted in (([], "COMMAND"), (["local"], "run"), (["output"], "sql")):
        with pytest.raises(SystemExit):
            main(argv)
        err = capsys.readouterr().err
        assert f"the following arguments are required: {wanted}" in err and "_cmd" not in err


def test_prepare_names_bucket_once_and_leaves_no_prepare_folder(tmp_path, capsys):
    keys = tmp_path / "keys.txt"
    keys.write_text("".join(f"img/{i}.jpg\n" for i in range(1000)))
    out = tmp_path / "out"
    assert main(["prepare", str(keys), "--out", str(out), "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "keys.txt line 1: bare key 'img/0.jpg' but no bucket: pass --bucket BUCKET" in err
    assert err.count("bare key") == 1 and not (out / "prepare").exists()


def test_an_unreachable_endpoint_is_not_promised_a_retry(monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    from sluice.aws.clients import reset_clients

    reset_clients()
    try:
        assert main(["runs"]) == 1
    finally:
        reset_clients()
    err = capsys.readouterr().err
    assert "will retry" not in err and "not retried: check that http://127.0.0.1:9 is up" in err


def test_prepare_names_the_bare_key_from_its_problem_not_from_a_reasons_text(tmp_path, capsys):
    """A URL's reason also says "bare key", and a key may hold " but": the refusal names line and key as they are."""
    keys = tmp_path / "keys.txt"
    keys.write_text("http://example.com/a.jpg\nimg/a but b.jpg\n")
    out = tmp_path / "out"
    assert main(["prepare", str(keys), "--out", str(out), "--workers", "1"]) == 1
    assert capsys.readouterr().err == (
        "manifest rejected:\n"
        "  - keys.txt line 2: bare key 'img/a but b.jpg' but no bucket: pass --bucket BUCKET (the bucket the keys "
        "are in), or write s3://bucket/key lines\n"
    )
    assert not (out / "prepare").exists()
