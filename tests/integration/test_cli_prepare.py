"""`sluice prepare` on this machine: its map and reduce run in worker processes."""

from __future__ import annotations

import pytest

from sluice.cli import main

pytestmark = pytest.mark.subprocess  # the map and reduce workers are forkserver processes


def test_prepare_removes_its_prepare_folder_when_a_later_line_is_rejected(tmp_path, capsys):
    keys = tmp_path / "keys.txt"
    keys.write_text("".join(f"s3://bucket-a/img/{i}.jpg\n" for i in range(50)) + "s3://b/too-short-bucket.jpg\n")
    out = tmp_path / "out"
    (out / "mine").mkdir(parents=True)  # the user's: never touched
    assert main(["prepare", str(keys), "--out", str(out), "--workers", "1"]) == 1
    assert "line 51" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["mine"]
