"""A worker that hangs mid-shard (SIGSTOP) is ended by the sweep and its shard resumed: the run still succeeds.

The thresholds race real start-up and real batches, so they scale with how busy the machine
is (tests/pace.py): on a loaded machine a healthy worker is not ended for being slow, and the
tests check what the sweep did, never how soon.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests import pace

STALL_AFTER_S = 10  # on an idle machine: a hung worker is ended after this (tests/pace.py scales it)
LOAD_GRACE_S = 10  # on an idle machine: an attempt without a first beat is ended after this (scaled too)


def _state(pid: int) -> str | None:
    """The process state letter (R, S, T stopped, Z zombie), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _array_index(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, PermissionError):
        return None
    found = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"AWS_BATCH_JOB_ARRAY_INDEX=")]
    return found[0] if found else None


def _ready(log: Path, stall_after_s: int) -> bool:
    """The worker's watchdog saw its model ready (a beat with the plain limit: no load grace left)."""
    for line in log.read_text(errors="replace").splitlines():
        if '"progress beat"' in line and json.loads(line).get("limit_s") == stall_after_s:
            return True
    return False


def _stop_a_ready_worker(
    out: Path, pid_file: Path, proc: subprocess.Popen[str], stall_after_s: int
) -> tuple[int, float]:
    """SIGSTOP the first worker whose model is ready: mid-shard, with none or some of its keys done."""
    deadline = time.monotonic() + pace.scaled(240)
    while time.monotonic() < deadline and proc.poll() is None:
        for log in out.glob("*/logs/*-attempt1.log"):
            if not _ready(log, stall_after_s):
                continue
            index = log.name.rsplit("-attempt", 1)[0].rsplit("_", 1)[1]
            for pid in (int(p) for p in pid_file.read_text().split()):
                if _array_index(pid) == index and _state(pid) not in (None, "Z"):
                    os.kill(pid, signal.SIGSTOP)
                    return pid, time.monotonic()
        time.sleep(0.05)
    raise AssertionError("no worker got to its model in time")


def test_a_stopped_worker_is_ended_and_its_shard_resumed(tmp_path: Path) -> None:
    out, pid_file = tmp_path / "out", tmp_path / "pids"
    stall_after_s = pace.scaled_s(STALL_AFTER_S)  # a healthy worker's batches come well within it, however busy
    cmd = [sys.executable, "-m", "sluice.cli", "local", "run", "--demo", "128", "--shards", "2", "--slots", "2"]
    cmd += ["--json", "--no-prometheus", "--out", str(out), "--pid-file", str(pid_file)]
    env = {**os.environ, "SLUICE_STALL_AFTER_S": str(stall_after_s), "SLUICE_WORKER_LOG_LEVEL": "DEBUG"}
    env["SLUICE_WORKER_BEAT_INTERVAL_S"] = "0.25"  # the test sees the model ready soon after it is
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stopped, at = _stop_a_ready_worker(out, pid_file, proc, stall_after_s)
        stdout, stderr = proc.communicate(timeout=pace.scaled(240))
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"stopped pid {stopped}; the run ended {time.monotonic() - at:.1f} s after the hang")
    assert proc.returncode == 0, stderr[-3000:]
    s = json.loads(stdout)
    assert (s["outcome"], s["processed"], s["failed"]) == ("succeeded", 128, 0)
    # The summary names the stalled attempt: which shard, its first attempt, ended after stall_after_s
    # (not before: the sweep waits out the threshold; how long after depends on the machine).
    assert len(s["stalled"]) == 1, s["stalled"]
    stalled = s["stalled"][0]
    assert stalled["attempt"] == 1 and stalled["shard"] in (0, 1)
    assert stalled["after_s"] >= stall_after_s, stalled
    assert "Run Progress" in s["events"] and s["events"].count("Run Succeeded") == 1
    # Every image embedded exactly once, the resumed shard's included.
    files = sorted(Path(s["output_dir"], "output").rglob("*.parquet"))
    keys = [r["key"] for f in files for r in pq.read_table(f, columns=["key"]).to_pylist()]
    assert len(keys) == 128 == len(set(keys))
    # The stopped worker was killed (SIGKILL ends a stopped process), and no worker is left stopped.
    assert _state(stopped) in (None, "Z")
    pids = [int(p) for p in pid_file.read_text().split()]
    assert [p for p in pids if _state(p) == "T"] == []


def _stop_a_starting_worker(pid_file: Path, proc: subprocess.Popen[str]) -> tuple[int, str, float]:
    """SIGSTOP the first worker process as soon as it exists: before its plan read, model load and first beat."""
    deadline = time.monotonic() + pace.scaled(240)
    while time.monotonic() < deadline and proc.poll() is None:
        pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
        for pid in pids:
            index = _array_index(pid)
            if index is not None and _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGSTOP)
                return pid, index, time.monotonic()
        time.sleep(0.02)
    raise AssertionError("no worker started in time")


def test_a_worker_stopped_before_its_first_beat_is_ended_after_the_load_grace(tmp_path: Path) -> None:
    out, pid_file, manifest = tmp_path / "out", tmp_path / "pids", tmp_path / "m.json"
    # The grace a healthy attempt needs for its first beat (process start, imports, plan read),
    # however busy the machine. No stall threshold of the test's own: the plan's (minutes) lets the
    # healthy attempts, the resumed one included, load their model however long that takes here.
    load_grace_s = pace.scaled_s(LOAD_GRACE_S)
    manifest.write_text(json.dumps({"version": 1, "job": {"load_grace_s": load_grace_s}}))
    cmd = [sys.executable, "-m", "sluice.cli", "local", "run", "--demo", "64", "--shards", "2", "--slots", "2"]
    cmd += ["--manifest", str(manifest), "--json", "--no-prometheus", "--out", str(out), "--pid-file", str(pid_file)]
    env = {k: v for k, v in os.environ.items() if k != "SLUICE_STALL_AFTER_S"}
    env["SLUICE_WORKER_LOG_LEVEL"] = "DEBUG"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stopped, index, at = _stop_a_starting_worker(pid_file, proc)
        stdout, stderr = proc.communicate(timeout=pace.scaled(240))
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"stopped pid {stopped} (shard {index}) at start; the run ended {time.monotonic() - at:.1f} s after the hang")
    assert proc.returncode == 0, stderr[-3000:]
    s = json.loads(stdout)
    assert (s["outcome"], s["processed"], s["failed"]) == ("succeeded", 64, 0)
    # It never beat: the stopped attempt's log (if it got that far) has no progress beat.
    logs = list(out.glob(f"*/logs/*_{index}-attempt1.log"))
    assert all('"progress beat"' not in p.read_text(errors="replace") for p in logs)
    # Only the stopped attempt was ended (cause no_beat), after its load grace, not before.
    (stalled,) = s["stalled"]
    assert (stalled["shard"], stalled["attempt"], stalled["cause"]) == (int(index), 1, "no_beat")
    assert stalled["after_s"] >= load_grace_s, stalled
    files = sorted(Path(s["output_dir"], "output").rglob("*.parquet"))
    keys = [r["key"] for f in files for r in pq.read_table(f, columns=["key"]).to_pylist()]
    assert len(keys) == 64 == len(set(keys))
    assert _state(stopped) in (None, "Z")
