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

import pyarrow.parquet as pq

from sluice.local.emulator.server import MotoServer
from tests import pace
from tests.e2e.test_local_run import _alive, _jpeg

CLI = [sys.executable, "-m", "sluice.cli", "local", "run"]


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _wait_for_pids(pid_file: Path, n: int, deadline_s: float = 120) -> list[int]:
    deadline = time.monotonic() + pace.scaled(deadline_s)
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


def test_a_multinode_run_whose_pipe_closes_finishes_saves_its_output_and_stops_its_servers(tmp_path):
    """`... 2>&1 | head -3` under a two-node multinode run: it goes on to the end, both nodes embed, every image
    once; its summary and output are saved, and everything it started is stopped."""
    pid_file, out = tmp_path / "pids", tmp_path / "out"
    args = ["--demo", "30", "--mode", "multinode", "--nodes", "2", "--out", str(out), "--pid-file", str(pid_file)]
    proc = _closed_after_three_lines(args)
    assert proc.wait(timeout=pace.scaled(300)) == 0  # the run succeeded: the exit code says so, not the pipe
    (run_dir,) = list(out.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["outcome"], summary["processed"], summary["shards"]) == ("succeeded", 30, 2)
    keys = [r["key"] for f in (run_dir / "output").rglob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert len(keys) == 30 == len(set(keys)) and (run_dir / "failures").is_dir()
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) >= (4 if shutil.which("prometheus") else 3)  # server, Prometheus, the two nodes
    assert [p for p in pids if _alive(p)] == []


def test_ctrl_c_after_the_pipe_closed_stops_everything(tmp_path):
    pid_file = tmp_path / "pids"
    proc = _closed_after_three_lines(["--demo", "400", "--shards", "2", "--out", str(tmp_path / "out"),
                                      "--pid-file", str(pid_file)])  # fmt: skip
    pids = _wait_for_pids(pid_file, 3 if shutil.which("prometheus") else 2)  # servers and a worker
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=pace.scaled(60)) == 130  # a guard against a hang: it has exited, and waited for each
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


def _job_ids(run_dir: Path) -> set[str]:
    """The jobs whose workers wrote logs in a run's folder (a log is <job id>[_<index>]-attempt<n>.log)."""
    return {re.sub(r"(_\d+)?-attempt\d+\.log$", "", p.name) for p in (run_dir / "logs").iterdir()}


def test_a_kept_emulator_runs_only_each_runs_own_jobs_and_a_run_interrupted_then_resumed_reports_on_its_own(tmp_path):
    """`--endpoint-url` on a kept emulator, three runs: a plain one; one interrupted part way; one resumed from
    it with --since-run. Each later run reuses the emulator and the stack's resources, runs only its own jobs
    (however many the emulator holds, those the interrupted run left unfinished included) and reports only
    its own events and count."""
    out, pid_file = tmp_path / "out", tmp_path / "pids"
    with MotoServer() as server:
        common = ["--endpoint-url", server.endpoint, "--no-prometheus", "--out", str(out)]
        plain = _run("--demo", "3", "--shards", "1", "--json", *common)
        assert plain.returncode == 0, plain.stderr[-3000:]
        assert json.loads(plain.stdout)["processed"] == 3 and "failed (exit" not in plain.stderr
        runs = [json.loads(plain.stdout)["run_id"]]

        first = subprocess.Popen(
            [*CLI, "--demo", "300", "--shards", "2", "--pid-file", str(pid_file), *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for_pids(pid_file, 1)  # a worker runs
        time.sleep(2.0)
        first.send_signal(signal.SIGINT)
        _, first_err = first.communicate(timeout=pace.scaled(60))
        assert first.returncode == 130
        assert not any(f'"run":"{r}"' in first_err for r in runs)  # no earlier run's worker ran
        (a_dir,) = [d for d in out.iterdir() if d.name not in runs]
        a = json.loads((a_dir / "summary.json").read_text())
        assert a["interrupted"] is True and a["outcome"] == "failed"  # concluded, not left RUNNING
        assert a["events"].count("Run Submitted") == 1 and "Run Failed" in a["events"]
        runs.append(a["run_id"])

        resumed = _run("--since-run", a["run_id"], "--json", *common)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "failed (exit" not in resumed.stderr
        assert not any(f'"run":"{r}"' in resumed.stderr for r in runs)  # no earlier run's worker ran
        b = json.loads(resumed.stdout)
        assert b["outcome"] == "succeeded" and b["run_id"] not in runs
        # Its own events only (one of each), and its own count: what the first run left, no more.
        assert b["events"].count("Run Submitted") == 1 and b["events"].count("Run Succeeded") == 1
        assert "Run Failed" not in b["events"]
        assert b["processed"] + sum(b["skipped"].values()) == 300 and b["processed"] > 0
        assert server.pid is not None and os.kill(server.pid, 0) is None  # still running: not the runs' to stop
    # The plain run: one job of one child, then its index stage: two logs, of that run's own jobs. Each
    # run's logs are of its own jobs only.
    assert len(list((out / runs[0] / "logs").iterdir())) == 2, runs[0]
    jobs = [_job_ids(out / r) for r in (*runs, b["run_id"])]
    assert all(jobs) and not (jobs[0] & jobs[1] or jobs[0] & jobs[2] or jobs[1] & jobs[2]), jobs
