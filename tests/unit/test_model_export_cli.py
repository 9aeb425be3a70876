"""`sluice model export` refuses a bad spec (the export to S3 and a node running it: tests/integration)."""

from __future__ import annotations

from sluice.cli import main


def test_cli_reports_a_bad_spec(capsys):
    assert main(["model", "export", "keras:resnet50", "--out", "m.pt"]) == 1
    assert "expected one of torchvision:NAME" in capsys.readouterr().err
