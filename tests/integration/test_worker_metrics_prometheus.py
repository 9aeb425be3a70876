"""A CPU worker job pushes its metrics by remote write to a real Prometheus (Debian's package)."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

from sluice.contracts.results import ShardResult
from sluice.local.emulator.prometheus import LocalPrometheus
from tests import pace
from tests.integration.conftest import finish, make_run, read_run, start_worker, worker_env


def _query(prom: LocalPrometheus, expr: str) -> list[dict]:
    url = f"{prom.url}api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_worker_pushes_counts_that_match_its_output_within_the_series_budget(moto_server, dataset, prometheus):
    keys = dataset.keys[:80]
    plan = make_run(moto_server, "metrics-1", [keys])
    env = worker_env(
        moto_server,
        plan,
        AWS_BATCH_JOB_ARRAY_INDEX="0",
        SLUICE_WORKER_CPU_RANKS="2",
        SLUICE_WORKER_LOADERS="0",
        SLUICE_WORKER_CHUNK_KEYS="20",
        SLUICE_REMOTE_WRITE_URL=prometheus.write_url,
        SLUICE_WORKER_PUSH_INTERVAL_S="1",
        SLUICE_WORKER_PUSH_METRICS="all",
        SLUICE_WORKER_METRICS_PORT="0",
    )
    rc, err = finish(start_worker(env))
    assert rc == 0, err[-3000:]
    processed = ShardResult.model_validate(read_run(moto_server, plan).results[0]).processed
    assert processed > 0

    expr = 'sum(max_over_time(sluice_images_processed_total{run_id="metrics-1"}[5m]))'
    deadline = time.monotonic() + pace.scaled(20)  # a guard against a hang (tests/pace.py)
    while time.monotonic() < deadline:
        got = _query(prometheus, expr)
        if got and float(got[0]["value"][1]) == processed:
            break
        time.sleep(0.5)
    assert got and float(got[0]["value"][1]) == processed, got

    # The ranks ended their series with staleness markers when they finished; their samples stay.
    assert _query(prometheus, '{__name__=~"sluice_.+", run_id="metrics-1"}') == []
    per_rank = _query(prometheus, 'count by (rank) (last_over_time({__name__=~"sluice_.+", run_id="metrics-1"}[5m]))')
    assert {r["metric"]["rank"] for r in per_rank} == {"0", "1"}
    assert all(0 < float(r["value"][1]) <= 42 for r in per_rank), per_rank
    labels = _query(prometheus, 'last_over_time({__name__=~"sluice_.+", run_id="metrics-1"}[5m])')
    # Failures are labelled by reason, never by object; CPU ranks carry no (empty) gpu label.
    assert not any("key" in r["metric"] or "uri" in r["metric"] or "gpu" in r["metric"] for r in labels)
    assert {r["metric"]["instance_type"] for r in labels} and all(r["metric"]["attempt"] == "1" for r in labels)
    # Every series carries its rank's identity, the remote writer's drop counter included.
    drops = [r["metric"] for r in labels if r["metric"]["__name__"] == "sluice_remote_write_dropped_samples_total"]
    assert sorted(d["rank"] for d in drops) == ["0", "1"] and all(d["shard"] == "0" for d in drops)
