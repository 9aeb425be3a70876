"""S3 throttling: 503 SlowDown on 20% of GETs, and the retry layers one by one."""

from __future__ import annotations

from tests.integration.conftest import (
    IMAGES_BUCKET,
    check_complete,
    make_run,
    read_run,
    run_worker,
    uri,
    worker_env,
)


def test_slowdown_on_a_fifth_of_all_gets_loses_nothing(moto_server, dataset):
    """20% of every GET (plan, shard ranges, listings, markers, images) answered 503 SlowDown.

    Image GETs use botocore's standard mode here: adaptive mode (the default) adds a client-side
    rate limiter that, against faults that ignore the request rate, throttles itself down to
    about one request a second (correct against real S3, far too slow for a test of 411 keys;
    the next test runs the default on a few keys).
    """
    shards = [dataset.keys[:200], dataset.keys[200:]]
    plan = make_run(moto_server, "throttle-20", shards)
    moto_server.faults(slowdown_rate=0.2, seed=5)
    try:
        for i in range(2):
            rc, err = run_worker(
                worker_env(
                    moto_server,
                    plan,
                    AWS_BATCH_JOB_ARRAY_INDEX=str(i),
                    SLUICE_WORKER_LOADERS="0",
                    SLUICE_WORKER_S3_RETRY_MODE="standard",
                    SLUICE_WORKER_BACKOFF_BASE_S="0.02",
                    SLUICE_WORKER_FINAL_BACKOFF_BASE_S="0.1",
                )
            )
            assert rc == 0, err[-3000:]
        counts = moto_server.fault_counts()
    finally:
        moto_server.faults()
    assert counts["injected"] >= 0.1 * counts["gets"] > 0
    out = read_run(moto_server, plan)
    check_complete(dataset, plan, out, shards)
    retries = sum(
        r["stats"].get("s3_botocore_retries", 0) + r["stats"].get("s3_retries", 0) for r in out.results.values()
    )
    assert retries > 0


def test_slowdown_with_default_adaptive_mode(moto_server, dataset):
    """Worker settings at their defaults but device=cpu: one rank in-process, one loader process,
    16 concurrent GETs, adaptive mode, default backoffs."""
    shards = [dataset.keys[:12]]
    plan = make_run(moto_server, "throttle-adaptive", shards)
    moto_server.faults(slowdown_rate=0.2, seed=9)
    try:
        env = worker_env(moto_server, plan, SLUICE_SHARD_INDEX="0")
        for name in ("SLUICE_WORKER_TORCH_THREADS", "SLUICE_WORKER_FETCH_CONCURRENCY"):
            del env[name]
        rc, err = run_worker(env)
        counts = moto_server.fault_counts()
    finally:
        moto_server.faults()
    assert rc == 0, err[-3000:]
    assert counts["injected"] > 0
    check_complete(dataset, plan, read_run(moto_server, plan), shards)


def test_immediate_retries_then_final_pass_then_transient_failure(moto_server, dataset):
    """botocore retries off (one attempt, standard mode: no client-side rate limiter either), so our
    immediate retries and the final pass do all the work, and every GET is accounted for."""
    keys = [k for k in dataset.keys if k.startswith("img-")][:40]
    flaky, deferred, dead = keys[3], keys[10], keys[20]
    plan = make_run(moto_server, "retry-layers", [keys])
    moto_server.faults(
        fail_first={f"/{IMAGES_BUCKET}/{flaky}": 2, f"/{IMAGES_BUCKET}/{deferred}": 5},
        always_fail=[f"/{IMAGES_BUCKET}/{dead}"],
    )
    try:
        rc, err = run_worker(
            worker_env(
                moto_server,
                plan,
                SLUICE_SHARD_INDEX="0",
                SLUICE_WORKER_LOADERS="0",
                SLUICE_WORKER_S3_MAX_ATTEMPTS="1",
                SLUICE_WORKER_S3_RETRY_MODE="standard",
                SLUICE_WORKER_RETRIES="3",
                SLUICE_WORKER_BACKOFF_BASE_S="0.01",
                SLUICE_WORKER_FINAL_RETRIES="3",
                SLUICE_WORKER_FINAL_BACKOFF_BASE_S="0.05",
            )
        )
        counts = moto_server.fault_counts()
    finally:
        moto_server.faults()
    assert rc == 0, err[-3000:]  # 1 of 40 failed: under the 10% threshold
    out = read_run(moto_server, plan)
    assert set(out.rows) == {uri(k) for k in keys} - {uri(dead)}
    assert all(len(v) == 1 for v in out.rows.values())
    assert out.failures[0] == [
        {
            "key": uri(dead),
            "reason": "s3_error_transient",
            "attempt": 1,
            "detail": out.failures[0][0]["detail"],
            "etag": None,
            "version_id": None,
        }  # no bytes were read: no version to record
    ]
    assert "SlowDown" in out.failures[0][0]["detail"]
    per_key = counts["per_key"]
    assert per_key[f"/{IMAGES_BUCKET}/{flaky}"] == 3  # 2 failures + 1 success, all immediate
    assert per_key[f"/{IMAGES_BUCKET}/{deferred}"] == 6  # 4 immediate tries fail, final pass: 1 fails, 1 works
    assert per_key[f"/{IMAGES_BUCKET}/{dead}"] == 4 + 3  # 1 + 3 immediate, then 3 in the final pass
    stats = out.results[0]["stats"]
    assert stats["s3_deferred"] == 2 and stats["s3_recovered"] == 1
    # The deferred key was committed by a final-pass chunk, the dead one recorded there too.
    retry_markers = [m for m in out.markers.values() if m["kind"] == "retry"]
    assert len(retry_markers) == 1 and retry_markers[0]["rows"] == 1
    assert [f["key"] for f in retry_markers[0]["failed"]] == [uri(dead)]
