"""A stopped index build ends "Index Failed" naming its timeout, at it; a rerun builds the index.

The real pieces: a moto server; `sluice local run` against it (its workers, its "Run Succeeded",
then the index stage's job, `python -m sluice.index build --bucket --run`, run by its local
executor) with SLUICE_INDEX_TIMEOUT_S short; the index process SIGSTOPped as soon as it starts;
the executor ends it at its timeout with Batch's reason and the job-state handler records
"Index Failed". Then `sluice.control.indexing.stage.rerun` with a longer timeout submits a job of its
own name, which a local executor (as sluice/local/run.py wires it: the template's handlers
through sluice/local/router.py) runs to "Run Indexed", and the index finds the run's rows.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from sluice.local.emulator.server import FAKE_CREDENTIALS, MotoServer
from tests import pace

TIMEOUT_S = 4  # the stopped build's: SLUICE_INDEX_TIMEOUT_S (local runs take any; AWS Batch at least 60 s)
RERUN_TIMEOUT_S = 900  # the rerun's: ample for a real build on a busy machine
IMAGES = 6


def _state(pid: int) -> str | None:
    """The process state letter (R, S, T stopped, Z zombie), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _index_build(pid: int) -> str | None:
    """The run id when `pid` is the index stage's job (`python -m sluice.index build --bucket B --run R`)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return argv[argv.index("--run") + 1] if "sluice.index" in argv and "--run" in argv else None


def _stop_the_index_build(pid_file: Path, proc: subprocess.Popen[str]) -> tuple[int, str, float]:
    """SIGSTOP the index build as soon as its process exists: (pid, run id, when)."""
    deadline = time.monotonic() + pace.scaled(180)
    while time.monotonic() < deadline and proc.poll() is None:
        for pid in (int(p) for p in pid_file.read_text().split()) if pid_file.exists() else ():
            run_id = _index_build(pid)
            if run_id and _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGSTOP)
                return pid, run_id, time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"no index build started (local run exit {proc.poll()})")


def _wait_for(get: Any, done: Any, timeout_s: float, step: Any = None) -> Any:
    """Poll `get()` (after `step()`) until `done(value)`; the value, or AssertionError at the timeout."""
    deadline = time.monotonic() + pace.scaled(timeout_s)  # a guard against a hang: room on a busy machine
    while time.monotonic() < deadline:
        if step is not None:
            step()
        value = get()
        if done(value):
            return value
        time.sleep(0.05)
    raise AssertionError(f"not done within {timeout_s} s: {value!r}")


def _leave_nothing_behind(proc: subprocess.Popen[str], stopped: int) -> None:
    """A failed test's leftovers: the local run (SIGTERM stops its workers, then SIGKILL) and the stopped build."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=pace.scaled(30))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if stopped and _state(stopped) not in (None, "Z"):
        os.kill(stopped, signal.SIGKILL)  # ends it stopped, too


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch):
    """A moto server of the test's own, this process's clients pointed at it; stopped after."""
    from sluice.aws import clients

    srv = MotoServer().start()
    for k, v in {**FAKE_CREDENTIALS, **srv.env}.items():
        monkeypatch.setenv(k, v)
    clients.reset_clients()
    try:
        yield srv
    finally:
        clients.reset_clients()
        srv.stop()


def test_a_stopped_index_build_fails_at_its_timeout_and_a_rerun_indexes_the_run(server, tmp_path: Path) -> None:
    from sluice.aws.clients import Clients
    from sluice.control.table.ledger import Ledger
    from sluice.local.emulator.infra import create_local

    c = Clients()
    stack = create_local(c, observe_bus_events=False)  # what the local run finds (idempotent)
    ledger = Ledger(c.dynamodb, stack.names["RunsTable"])
    out, pid_file = tmp_path / "out", tmp_path / "pids"
    cmd = [
        sys.executable,
        "-m",
        "sluice.cli",
        "local",
        "run",
        "--demo",
        str(IMAGES),
        "--shards",
        "1",
        "--endpoint-url",
        server.endpoint,
    ]
    cmd += ["--out", str(out), "--pid-file", str(pid_file), "--json", "--no-prometheus"]
    env = {**os.environ, "SLUICE_INDEX_TIMEOUT_S": str(TIMEOUT_S)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stopped = 0
    try:
        stopped, run_id, at = _stop_the_index_build(pid_file, proc)
        ix = _wait_for(lambda: ledger.get(run_id).index, lambda x: x.state == "failed", TIMEOUT_S + 30)
        failed_s = time.monotonic() - at
        stdout, stderr = proc.communicate(timeout=pace.scaled(60))
    finally:
        _leave_nothing_behind(proc, stopped)
    print(f"\nindex build SIGSTOPped; 'Index Failed' recorded {failed_s:.1f} s later (timeout {TIMEOUT_S} s)")
    assert proc.returncode == 0, stderr[-3000:]  # the run succeeded: a failed index stage does not touch it
    # Ended at its timeout (counted from its start, a moment before the stop), not before: the job
    # was stopped, so only the timeout ended it (how soon after depends on the machine).
    assert failed_s >= TIMEOUT_S - 1, failed_s
    assert f"ran past its {TIMEOUT_S} s timeout (SLUICE_INDEX_TIMEOUT_S)" in str(ix.reason), ix.reason
    assert f"sluice index rerun {run_id}" in str(ix.reason)
    s = json.loads(stdout)
    assert s["events"][-2:] == ["Run Succeeded", "Index Failed"], s["events"]
    assert s["index"] is None and s["index_error"] == ix.reason
    assert _state(stopped) in (None, "Z")  # the executor killed the stopped build (SIGKILL ends it stopped)

    indexed = _rerun(c, stack, ledger, run_id, tmp_path)
    keys = sorted(
        r["key"] for f in Path(s["output_dir"], "output").rglob("*.parquet") for r in pq.read_table(f).to_pylist()
    )
    assert len(keys) == IMAGES and indexed.rows == IMAGES
    from sluice.index.search import Searcher

    searcher = Searcher.open(indexed.uri)  # on the server (AWS_ENDPOINT_URL): Lance's own S3 client
    assert searcher.describe()["rows"] == IMAGES
    for key in keys:  # every row is found, each its own nearest
        [[best, *_]] = searcher.search(searcher.vector_of(key), k=3)
        assert best.key == key and best.score > 0.99


def _rerun(c: Any, stack: Any, ledger: Any, run_id: str, tmp_path: Path) -> Any:
    """`rerun` with a longer timeout, its job run by a new local executor to "Run Indexed"; the index record."""
    from sluice.control.context import Context
    from sluice.control.indexing.jobs import job_name
    from sluice.control.indexing.stage import rerun
    from sluice.local.emulator.bus import BusTap
    from sluice.local.emulator.executor import ExecutorConfig, LocalExecutor
    from sluice.local.emulator.sweep import JOB_STATE_FUNCTION
    from sluice.local.router import Router
    from sluice.settings import Settings

    tap = BusTap.open(c, stack)
    queues = (stack.names["GpuJobQueue"], stack.names["MnpJobQueue"], stack.names["PrepareJobQueue"])
    config = ExecutorConfig(
        run_id, queues, str(tmp_path / "rerun-logs"), out=io.StringIO(), since_ms=int(time.time() * 1000)
    )
    executor = LocalExecutor(c.batch, ledger, Router(stack, {"SLUICE_LOCAL_MODE": "1"}), config)
    try:
        ctx = Context.build(Settings.from_env(stack.env_for(JOB_STATE_FUNCTION)), c)
        job_id = rerun(ctx, run_id, RERUN_TIMEOUT_S)
        claimed = ledger.get(run_id).index  # its own timeout replaces the one SLUICE_INDEX_TIMEOUT_S fixed
        assert (claimed.state, claimed.timeout_s, claimed.timeout_fixed) == ("submitted", RERUN_TIMEOUT_S, False)
        described = c.batch.describe_jobs(jobs=[job_id])["jobs"][0]
        assert described["jobName"] == job_name(run_id, 1)  # its own name: the failed job is not adopted
        assert described["timeout"]["attemptDurationSeconds"] == RERUN_TIMEOUT_S

        def step() -> None:
            executor.discover()
            executor.step()

        ix = _wait_for(lambda: ledger.get(run_id).index, lambda x: x.state != "submitted", 120, step)
        assert [j.job_id for j in executor.jobs.values()] == [job_id]  # the earlier jobs are not run again
        assert ix.state == "indexed" and ix.job_id == job_id, ix
        events = [e["detail-type"] for e in tap.events(c, run_id)]
        assert events == ["Run Indexed"], events
        return ix
    finally:
        executor.stop()
        tap.close(c)
