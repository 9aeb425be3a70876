"""`sluice local run` as a new user meets it: their own folders, --out, --keep, bad flags, progress."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import pace
from tests.e2e.test_local_run import _alive, _jpeg, _rows

CLI = [sys.executable, "-m", "sluice.cli"]


def _local_run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 300):
    return subprocess.run(
        [*CLI, "local", "run", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def _photo_folder(root: Path) -> None:
    """What a real photo folder holds: photos, two files that only look like photos, and clutter."""
    (root / "trip").mkdir(parents=True)
    for i in range(10):
        (root / "trip" / f"IMG_{i:04d}.JPG").write_bytes(_jpeg(i))
    (root / "broken.jpg").write_text("not really a jpeg\n")
    (root / "truncated.jpeg").write_bytes(_jpeg(3)[:60])
    (root / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (root / "README.txt").write_text("holiday photos\n")


def test_a_photo_folder_skips_clutter_and_a_failure_quotes_the_worker(tmp_path):
    _photo_folder(tmp_path / "photos")
    out = tmp_path / "results"
    (out / "mine").mkdir(parents=True)
    (out / "notes.txt").write_text("my own notes")  # a user's files in --out: never touched
    proc = _local_run(
        "--images",
        str(tmp_path / "photos"),
        "--shards",
        "1",
        "--out",
        str(out),
        env={"SLUICE_LOCAL_PROGRESS_S": "0.2"},
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # a failed run exits non-zero
    assert "skipped 2 file(s) that are not images by name: .DS_Store, README.txt" in proc.stderr
    # 2 of the 12 uploaded keys fail for their data: over the 5% default, the run fails, and the reason says so.
    assert "outcome         failed" in proc.stdout
    assert (
        "1 of 1 shards failed: shard 0 (2 of 12 keys failed for their data (16.67% > 5.00%): corrupt 1, not_image 1)"
        in proc.stdout
    ), proc.stdout
    assert "Essential container" not in proc.stdout
    assert (out / "notes.txt").read_text() == "my own notes" and (out / "mine").is_dir()
    (run_dir,) = [p for p in out.iterdir() if p.name not in ("notes.txt", "mine")]
    assert json.loads((run_dir / ".sluice-run.json").read_text())["run_id"] == run_dir.name
    assert list((run_dir / "logs").iterdir())  # the worker logs live with the run, not in /tmp
    progress = [line for line in proc.stderr.splitlines() if line.startswith("sluice: progress: ")]
    assert progress and all("img/s ETA" in line for line in progress)
    assert "images 12/12" in progress[-1]
    if shutil.which("prometheus"):  # its URL is not printed as if it still answered
        assert "metrics         local Prometheus stopped with the run (use --keep to query it" in proc.stdout


def test_max_failed_fraction_flag_and_keep_give_a_working_status_command(tmp_path):
    _photo_folder(tmp_path / "photos")
    pid_file = tmp_path / "pids"
    proc = _local_run(
        "--images",
        str(tmp_path / "photos"),
        "--shards",
        "1",
        "--max-failed-fraction",
        "0.5",
        "--json",
        "--keep",
        "--out",
        str(tmp_path / "out"),
        "--pid-file",
        str(pid_file),
        cwd=tmp_path,
        env={"TMPDIR": str(tmp_path)},  # what --keep keeps (Prometheus's data folder) goes with the test
    )
    pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        s = json.loads(proc.stdout)
        assert (s["outcome"], s["processed"], s["failed"], s["skipped_files"]) == ("succeeded", 10, 2, 2)
        assert s["output_dir"] == str(tmp_path / "out" / s["run_id"]) and len(_rows(s["output_dir"])) == 10
        (line,) = [x for x in proc.stderr.splitlines() if x.strip().startswith("export ")]
        env = dict(kv.split("=", 1) for kv in shlex.split(line.strip())[1:])
        assert env["SLUICE_RUNS_TABLE"]
        status = subprocess.run(
            [*CLI, "status", s["run_id"]], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
        )
        assert status.returncode == 0 and "SUCCEEDED" in status.stdout, status.stderr
        runs = subprocess.run(
            [*CLI, "runs", "--json"], capture_output=True, text=True, env={**os.environ, **env}, timeout=60
        )
        assert runs.returncode == 0 and s["run_id"] in runs.stdout, runs.stderr
        if s["metrics"] is not None:  # a Prometheus on PATH: kept too, its URL printed
            assert s["metrics"].startswith("http://127.0.0.1:")
        (stop,) = [x for x in proc.stderr.splitlines() if x.startswith("stop them with: ")]
        assert subprocess.run(stop.removeprefix("stop them with: "), shell=True, timeout=30).returncode == 0
        deadline = time.monotonic() + pace.scaled(10)
        while [p for p in pids if _alive(p)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [p for p in pids if _alive(p)] == []  # the printed command stops them, and removes its folder
        assert not [d for d in stop.split() if d.startswith("/tmp/sluice-prometheus-") and os.path.exists(d)]
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--demo", "0", "0 is too small: use 1 or more"),
        ("--demo", "-5", "-5 is too small: use 1 or more"),
        ("--shards", "0", "0 is too small: use 1 or more"),
        ("--nodes", "0", "0 is too small: use 1 or more"),
        ("--ranks", "0", "0 is too small: use 1 or more"),
        ("--slots", "-1", "-1 is too small: use 0 or more"),
        ("--image-size", "4", "4 is too small: use 8 or more"),
        ("--max-failed-fraction", "1.5", "1.5 is outside 0..1"),
        ("--demo", "ten", "'ten' is not an integer"),
    ],
)
def test_out_of_range_values_are_refused_before_anything_starts(tmp_path, flag, value, message):
    proc = _local_run(flag, value, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and flag in proc.stderr  # the argument parser's refusal
    assert "sluice: run" not in proc.stderr and not (tmp_path / "sluice-output").exists()


def test_an_unusable_out_is_refused_before_the_run(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    proc = _local_run("--demo", "4", "--out", str(target), timeout=60, cwd=tmp_path)
    assert proc.returncode == 1 and "a file, not a directory" in proc.stderr
    assert target.read_text() == "keep me" and "sluice: run" not in proc.stderr
    if os.geteuid() != 0:  # root writes anywhere: only a non-root user meets a read-only folder
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        proc = _local_run("--demo", "4", "--out", str(ro / "sub"), timeout=60)
        assert proc.returncode == 1 and "cannot write there" in proc.stderr
