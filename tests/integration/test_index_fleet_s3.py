"""The distributed index build's steps on S3 (a moto server): plan, models, segments and outcome under s3://.

Each step is a process, as each AWS Batch job is, with SLUICE_INDEX_MIN_ANN_ROWS lowered so a
small run gets a real IVF-PQ index through the stages.
"""

from __future__ import annotations

import os
import subprocess
import sys

from sluice.contracts.events import RunIndexed
from sluice.contracts.manifest import IndexTarget
from sluice.index.fleet.files import FleetPlan
from sluice.paths import fleet_path
from tests.index_support import clustered, uris, write_run
from tests.integration.conftest import CONTROL_BUCKET, ROOT


def _step(server, step: str, *extra: str, child: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **server.env, "PYTHONPATH": str(ROOT), "SLUICE_INDEX_MIN_ANN_ROWS": "512"}
    if child is not None:
        env["AWS_BATCH_JOB_ARRAY_INDEX"] = str(child)
    args = ["-m", "sluice.index", "stage", step, "--bucket", CONTROL_BUCKET, "--run", "fleet", *extra]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def test_the_three_steps_on_s3_write_run_indexed(on_server):
    from sluice.aws.store import ObjectStore

    base = f"s3://{CONTROL_BUCKET}/runs/"
    n, keys = 3_000, uris(3_000)
    x = clustered(n, 16, 3, centers=40)
    target = IndexTarget(uri=f"s3://{CONTROL_BUCKET}/indexes/fleet/", name="fleet")
    plan = write_run(base, "fleet", keys, x, chunk_keys=500)
    store = ObjectStore()
    store.put(base + "fleet/plan.json", plan.model_copy(update={"index": target}).model_dump_json().encode())
    for step, extra, child in [("train", ["--children", "2"], None), ("segment", [], 1), ("segment", [], 0)]:
        proc = _step(on_server, step, *extra, child=child)
        assert proc.returncode == 0, proc.stderr[-3000:]
    fleet = FleetPlan.model_validate_json(store.get(fleet_path(target.uri, "fleet", "plan.json")))
    assert [t.mode for t in fleet.tables] == ["segments"] and all(fleet.tables[0].shares)
    proc = _step(on_server, "commit")
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = RunIndexed.model_validate_json(store.get(target.uri + "_results/fleet.json"))
    assert (done.rows, done.ann, done.tables[0].uri) == (n, "IVF_PQ", target.uri + "reference-cnn.lance")
