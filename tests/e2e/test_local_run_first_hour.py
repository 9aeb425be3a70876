"""`sluice local run` where a new user meets it: a kept emulator reused, a pipe closed under it, Ctrl-C
after that, and --manifest with flags on top. Real subprocesses, a real moto server, real workers."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from sluice.local.emulator.server import MotoServer
from tests.e2e.test_local_run import _alive, _jpeg

CLI = [sys.executable, "-m", "sluice.cli", "local", "run"]


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_a_kept_emulator_runs_only_each_runs_own_jobs(tmp_path):
    """`--endpoint-url`: the second run reuses the emulator and the stack's resources, and runs its own jobs only."""
    out = tmp_path / "out"
    with MotoServer() as server:
        runs = []
        for _ in range(2):
            proc = _run("--demo", "3", "--shards", "1", "--no-prometheus", "--json", "--endpoint-url", server.endpoint,
                        "--out", str(out))  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert json.loads(proc.stdout)["processed"] == 3
            runs.append(json.loads(proc.stdout)["run_id"])
            assert "failed (exit" not in proc.stderr
            assert not any(f'"run":"{r}"' in proc.stderr for r in runs[:-1])  # no earlier run's worker ran
        assert server.pid is not None and os.kill(server.pid, 0) is None  # still running: not the runs' to stop
    for run in runs:  # one job of one child each, then its index stage: two logs, of that run's own jobs
        assert len(list((out / run / "logs").iterdir())) == 2, run


def _wait_for_pids(pid_file: Path, n: int, deadline_s: float = 120) -> list[int]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if pid_file.exists() and len(pid_file.read_text().split()) >= n:
            break
        time.sleep(0.2)
    return [int(p) for p in pid_file.read_text().split()]


def _closed_after_three_lines(args: list[str]) -> subprocess.Popen[bytes]:
    """`sluice local run ... 2>&1 | head -3`: the reader takes three lines and goes away."""
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()
    return proc


def test_a_closed_pipe_lets_the_run_finish_save_its_output_and_stop_its_servers(tmp_path):
    pid_file, out = tmp_path / "pids", tmp_path / "out"
    proc = _closed_after_three_lines(["--demo", "30", "--shards", "2", "--out", str(out), "--pid-file", str(pid_file)])
    assert proc.wait(timeout=300) == 0  # the run succeeded: the exit code says so, not the pipe
    (run_dir,) = list(out.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["outcome"], summary["processed"]) == ("succeeded", 30)
    assert list((run_dir / "output").rglob("*.parquet")) and (run_dir / "failures").is_dir()
    time.sleep(0.5)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) >= (4 if shutil.which("prometheus") else 3)  # server, Prometheus, two workers
    assert [p for p in pids if _alive(p)] == []


def test_ctrl_c_after_the_pipe_closed_stops_everything(tmp_path):
    pid_file = tmp_path / "pids"
    proc = _closed_after_three_lines(["--demo", "400", "--shards", "2", "--out", str(tmp_path / "out"),
                                      "--pid-file", str(pid_file)])  # fmt: skip
    pids = _wait_for_pids(pid_file, 3 if shutil.which("prometheus") else 2)  # servers and a worker
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    time.sleep(0.5)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert [p for p in pids if _alive(p)] == []


def test_manifest_takes_max_failed_fraction_on_top(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(10):
        (photos / f"p{i}.jpg").write_bytes(_jpeg(i))
    (photos / "broken.jpg").write_text("not a jpeg\n")  # 1 of 11: 9.1% > the manifest's 5%
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"version": 1, "max_failed_fraction": 0.05, "job": {"keys_per_shard": 100}}))
    common = ("--manifest", str(manifest), "--images", str(photos), "--no-prometheus", "--out", str(tmp_path / "o"))
    # --shards sets keys_per_shard on top of the manifest's too (two runs: one on top, one without)
    split = _run(*common, "--shards", "2", "--max-failed-fraction", "0.5")
    assert split.returncode == 0, split.stdout + split.stderr[-3000:]
    assert "with --max-failed-fraction, --shards applied on top" in split.stderr, split.stderr[-3000:]
    assert "outcome         succeeded" in split.stdout and re.search(r"^  shards +2$", split.stdout, re.M)
    proc = _run(*common)  # the manifest's own 5%: the run fails, and says the threshold it used
    assert proc.returncode == 1 and "(9.09% > 5.00%)" in proc.stdout
    assert "the run failed: output/ holds only the shards that committed" in proc.stdout


def test_a_kept_emulator_with_a_run_interrupted_then_resumed_reports_each_run_on_its_own(tmp_path):
    out, pid_file = tmp_path / "out", tmp_path / "pids"
    with MotoServer() as server:
        common = ["--endpoint-url", server.endpoint, "--no-prometheus", "--out", str(out)]
        first = subprocess.Popen(
            [*CLI, "--demo", "300", "--shards", "2", "--pid-file", str(pid_file), *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for_pids(pid_file, 1)  # a worker runs
        time.sleep(2.0)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=60) == 130
        (a_dir,) = list(out.iterdir())
        a = json.loads((a_dir / "summary.json").read_text())
        assert a["interrupted"] is True and a["outcome"] == "failed"  # concluded, not left RUNNING
        assert a["events"].count("Run Submitted") == 1 and "Run Failed" in a["events"]

        resumed = _run("--since-run", a["run_id"], "--json", *common)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        b = json.loads(resumed.stdout)
        assert b["outcome"] == "succeeded" and b["run_id"] != a["run_id"]
        # Its own events only (one of each), and its own count: what the first run left, no more.
        assert b["events"].count("Run Submitted") == 1 and b["events"].count("Run Succeeded") == 1
        assert "Run Failed" not in b["events"]
        assert b["processed"] + sum(b["skipped"].values()) == 300 and b["processed"] > 0
