"""A slow but moving worker's remaining keys are split off to a new shard: every key once, the run succeeds.

Three shards on three slots: the worker of shard 0 is slowed 10x once its model is ready
(SIGSTOP for 0.9 of every 0.5 s, SIGCONT for the rest, from the test: it still beats, so no
stall fires), the other two run free and end. The sweep sees shard 0 expected far past the
median and splits its remaining keys off to shard 3, which the local executor runs like any job. No
threshold races the clock: the split depends on the ratio of the two workers' rates, which
the machine's load changes for both.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

from tests import pace

IMAGES = 1200
SLOW = 10.0
PERIOD_S = 0.5


def _index(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except (FileNotFoundError, PermissionError, ProcessLookupError):
        return None
    found = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"AWS_BATCH_JOB_ARRAY_INDEX=")]
    return found[0] if found else None


def _slow_shard_0(out: Path, pid_file: Path, stop: threading.Event) -> None:
    """Find shard 0's worker; once its log says its model is ready, stop and continue it on a duty cycle."""
    pid = None
    while not stop.is_set():
        if pid is None and pid_file.exists():
            pid = next((int(p) for p in pid_file.read_text().split() if _index(int(p)) == "0"), None)
        ready = any('"model ready"' in f.read_text(errors="replace") for f in out.glob("*/logs/*_0-attempt1.log"))
        if pid is not None and ready:
            break
        time.sleep(0.05)
    while pid is not None and not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(PERIOD_S * (1 - 1 / SLOW))
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(PERIOD_S / SLOW)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_slow_worker_is_split_and_every_key_is_embedded_once(tmp_path: Path) -> None:
    out, pid_file = tmp_path / "out", tmp_path / "pids"
    cmd = [sys.executable, "-m", "sluice.cli", "local", "run", "--demo", str(IMAGES), "--shards", "3", "--slots", "3"]
    cmd += ["--json", "--no-prometheus", "--out", str(out), "--pid-file", str(pid_file)]
    env = {**os.environ, "SLUICE_SPLIT_STARTUP_S": "0", "SLUICE_SPLIT_AFTER": "1.5", "SLUICE_SPLIT_MIN_KEYS": "16"}
    env["SLUICE_SPLIT_SHARE"] = "1"
    # Small batches and no read-ahead past the loaders' buffers: a rank reserves only a few dozen
    # keys past those it embeds, so 200-key shards leave room for a split (at a GPU shard's size the
    # defaults read a few percent ahead).
    env |= {"SLUICE_WORKER_BATCH_SIZE": "8", "SLUICE_WORKER_PREFETCH_MIB": "0"}
    stop = threading.Event()
    slower = threading.Thread(target=_slow_shard_0, args=(out, pid_file, stop), daemon=True)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    slower.start()
    try:
        stdout, stderr = proc.communicate(timeout=pace.scaled(400))
    finally:
        stop.set()
        slower.join(timeout=5)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    s = json.loads(stdout)
    assert (s["outcome"], s["processed"], s["failed"]) == ("succeeded", IMAGES, 0)
    assert s["splits"] == 1 and 16 <= s["split_keys"] <= IMAGES // 3 - 16, s
    assert s["stalled"] == []  # slow, not stalled
    files = sorted(Path(s["output_dir"], "output").rglob("*.parquet"))
    keys = [r["key"] for f in files for r in pq.read_table(f, columns=["key"]).to_pylist()]
    assert len(keys) == IMAGES == len(set(keys))  # every image once: none twice, none missing
    assert any("shard=3" in str(f) for f in files)  # the split child's own output
    assert s["events"].count("Run Succeeded") == 1
