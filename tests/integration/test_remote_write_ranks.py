"""Several ranks pushing at once to a real Prometheus (Debian's package): none is refused."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request

from gpu_worker.telemetry.collector import RankCollector, rank_registry
from gpu_worker.telemetry.families import CRITICAL
from gpu_worker.telemetry.remote_write import PushPolicy, RemoteWriter
from gpu_worker.telemetry.stats import Stats
from sluice.local.emulator.prometheus import LocalPrometheus

RANKS = 8


def _query(prom: LocalPrometheus, expr: str) -> list[dict]:
    url = f"{prom.url}api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_ranks_pushing_concurrently_are_never_refused(prometheus):
    stats = [Stats() for _ in range(RANKS)]
    writers = []
    for r, s in enumerate(stats):
        ident = {
            "run_id": "conc-1",
            "shard": "0",
            "node": str(r // 4),
            "rank": str(r),
            "gpu": "",  # CPU ranks: no gpu label at all
            "attempt": "1",
            "instance_type": "local",
        }
        reg = rank_registry(RankCollector(s.snapshot, ident))
        # 0.2 s pushes from 8 ranks: far denser than production's 30 s, to provoke collisions.
        writers.append(
            RemoteWriter(prometheus.write_url, reg, labels=ident, policy=PushPolicy(interval_s=0.2, keep=CRITICAL))
        )
    done = threading.Event()

    def work(s: Stats) -> None:
        while not done.is_set():
            s.incr("images", 10)
            s.incr("wait_seconds", 0.01)
            time.sleep(0.01)

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in stats]
    for t in threads:
        t.start()
    for w in writers:
        w.start()
    time.sleep(4.0)
    done.set()
    for t in threads:
        t.join()
    for w in writers:
        assert w.stop() is not None
    outcomes = [dict(w.outcomes) for w in writers]
    assert all(set(o) == {"sent"} and o["sent"] >= 10 for o in outcomes), outcomes
    assert all(w.dropped_samples == 0 for w in writers)

    total = sum(s.get("images") for s in stats)
    got = _query(prometheus, 'sum(max_over_time(sluice_images_processed_total{run_id="conc-1"}[5m]))')
    assert got and float(got[0]["value"][1]) == total
    drops = _query(prometheus, 'max_over_time(sluice_remote_write_dropped_samples_total{run_id="conc-1"}[5m])')
    assert sorted(int(d["metric"]["rank"]) for d in drops) == list(range(RANKS))
    assert all(float(d["value"][1]) == 0 and "gpu" not in d["metric"] for d in drops)
    # Each rank ended its series with staleness markers: nothing is "current" any more.
    assert _query(prometheus, '{__name__=~"sluice_.+", run_id="conc-1"}') == []
