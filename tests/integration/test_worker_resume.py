"""Crash and resume: SIGKILL a node mid-shard, rerun it as attempt 2, check nothing is lost or redone."""

from __future__ import annotations

import glob
import os
import signal
import time
from pathlib import Path

from sluice.contracts.results import ShardResult
from tests import pace
from tests.integration.conftest import (
    CONTROL_BUCKET,
    check_complete,
    finish,
    make_run,
    read_run,
    start_worker,
    worker_env,
)


def _remove_orphaned_semaphores(since: float) -> None:
    """SIGKILL of a whole process group leaves multiprocessing's named semaphores in /dev/shm (a
    container's /dev/shm goes with it; a test machine's does not). Remove ours (this uid) created
    since `since` that no live process of ours maps; touch nothing if a Python process is unreadable."""
    shm, uid = Path("/dev/shm"), os.getuid()
    if not shm.is_dir():
        return
    mapped: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid != uid:
                continue
            lines = (proc / "maps").read_text().splitlines()
        except FileNotFoundError:
            continue  # the process exited
        except PermissionError:
            comm = (proc / "comm").read_text().strip() if (proc / "comm").exists() else "?"
            if comm.startswith(("python", "pytest", "?")):
                return  # a Python process we cannot inspect might hold one: leave them all
            continue  # e.g. a sandbox's init: it maps no multiprocessing semaphores
        mapped.update(line.rsplit(None, 1)[-1] for line in lines if "/dev/shm/" in line)
    for sem in shm.glob("sem.mp-*"):
        try:
            st = sem.stat()
            if st.st_uid == uid and st.st_ctime >= since and str(sem) not in mapped:
                sem.unlink()
        except FileNotFoundError:
            pass


def _committed(s3, run_id: str) -> int:
    resp = s3.list_objects_v2(Bucket=CONTROL_BUCKET, Prefix=f"runs/{run_id}/output/shard=0/_commits/")
    return resp.get("KeyCount", 0)


def test_sigkill_mid_shard_then_resume(moto_server, dataset, tmp_path):
    shards = [dataset.keys]
    plan = make_run(moto_server, "crash-resume", shards, batch_size=8)
    s3 = moto_server.client()
    chunk = 20
    windows_total = len(dataset.keys) // chunk  # at least this many chunks in a full run
    # Slow GETs down (30 ms each, 2 at a time per rank) so the node is surely mid-shard when killed.
    moto_server.faults(latency_ms=30, latency_prefix="/worker-images/")
    env = worker_env(
        moto_server,
        plan,
        SLUICE_SHARD_INDEX="0",
        SLUICE_WORKER_CPU_RANKS="2",
        SLUICE_WORKER_LOADERS="1",
        SLUICE_WORKER_FETCH_CONCURRENCY="2",
        SLUICE_WORKER_CHUNK_KEYS=str(chunk),
        TMPDIR=str(tmp_path),  # the killed node cannot remove its work folder; tmp_path goes with the test
    )
    started = time.time()
    proc = start_worker(env)
    try:
        deadline = time.monotonic() + pace.scaled(120)  # a guard against a hang (tests/pace.py)
        while _committed(s3, plan.run_id) < 3:
            assert proc.poll() is None, f"worker ended before it could be killed: {proc.communicate()[1][-2000:]}"
            assert time.monotonic() < deadline, "no chunk committed in time"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the whole container: node, ranks, loaders
        proc.communicate()
        moto_server.faults()
        time.sleep(0.2)  # let the kernel finish tearing the group down
        _remove_orphaned_semaphores(started)
    first = read_run(moto_server, plan)
    assert 3 <= len(first.markers) < windows_total, "the kill must land mid-shard"
    assert not first.results, "a killed attempt writes no result.json"
    assert all(m["attempt"] == 1 for m in first.markers.values())

    rc, err = finish(start_worker({**env, "AWS_BATCH_JOB_ATTEMPT": "2"}))
    assert rc == 0, err[-3000:]
    second = read_run(moto_server, plan)
    check_complete(dataset, plan, second, shards)
    # Chunks committed by attempt 1 are untouched: same marker, same Parquet object (ETag, mtime).
    assert first.markers, "attempt 1 committed nothing: the test would check nothing"
    for key, marker in first.markers.items():
        assert second.markers[key] == marker
        if marker["file"]:
            pkey = key.replace("_commits/", "").replace(".json", ".parquet")
            assert second.files[pkey]["etag"] == first.files[pkey]["etag"]
            assert second.files[pkey]["last_modified"] == first.files[pkey]["last_modified"]
    new = {k: m for k, m in second.markers.items() if k not in first.markers}
    assert new and all(m["attempt"] == 2 for m in new.values())
    # Attempt 2 covered exactly what attempt 1 had not: no position settled twice.
    old_cover = {p for m in first.markers.values() for a, b in m["covers"] for p in range(a, b)}
    new_cover = [p for m in new.values() for a, b in m["covers"] for p in range(a, b)]
    assert len(new_cover) == len(set(new_cover))
    assert not old_cover & set(new_cover)
    assert old_cover | set(new_cover) == set(range(len(dataset.keys)))
    result = ShardResult.model_validate(second.results[0])
    assert result.attempt == 2
    assert result.resumed_chunks == len(first.markers)
    # Rows embedded by attempt 2 == keys attempt 1 had not committed (nothing recomputed).
    assert result.stats["images"] == sum(m["rows"] for m in new.values())
    for leftover in glob.glob("/dev/shm/sluice-*"):
        # The killed attempt's shared memory; attempt 2 reused and unlinked the same names.
        assert "crash-resume" not in leftover
