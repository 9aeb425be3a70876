"""The index on S3 (a moto server): a run's output read from s3://, the Lance table written to s3://,
and the index stage's entry point (`python -m sluice.index build --bucket --run`) with its outcome
file (<index>/_results/<run>.json).

Lance reaches the server through its own object-store client, configured from AWS_ENDPOINT_URL
(sluice.index.storage), so the build and the searches run as subprocesses with the server's env.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from sluice.contracts.events import IndexFailed, RunIndexed
from sluice.contracts.manifest import IndexTarget, VectorsTarget
from tests.index_support import clustered, uris, write_run
from tests.integration.conftest import CONTROL_BUCKET, ROOT


def _run(server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **server.env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def test_a_run_on_s3_is_indexed_into_s3_and_searched(on_server, tmp_path):
    base = f"s3://{CONTROL_BUCKET}/runs/"
    keys, x = uris(800), clustered(800, 16, 1)
    target = IndexTarget(uri=f"s3://{CONTROL_BUCKET}/indexes/s3test/", name="s3test")
    plan = write_run(base, "s3run", keys, x, chunk_keys=150, uncommitted=20)
    from sluice.aws.store import ObjectStore

    store = ObjectStore()  # the plan names its index, as the planner records output.index
    store.put(base + "s3run/plan.json", plan.model_copy(update={"index": target}).model_dump_json().encode())

    proc = _run(on_server, "-m", "sluice.index", "build", "--bucket", CONTROL_BUCKET, "--run", "s3run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = RunIndexed.model_validate_json(store.get(target.uri + "_results/s3run.json"))
    assert (outcome.run_id, outcome.index_uri, outcome.rows, outcome.ann) == ("s3run", target.uri, 800, "none")
    assert outcome.tables[0].uri == target.uri + "reference-cnn.lance" and outcome.seconds > 0
    assert json.loads(proc.stdout.splitlines()[-1]) == json.loads(outcome.model_dump_json())

    np.save(tmp_path / "q.npy", x[[5, 600]])
    proc = _run(on_server, "-m", "sluice.cli", "search", target.uri, "--vector-file", str(tmp_path / "q.npy"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)["results"]
    assert [r[0]["key"] for r in results] == [keys[5], keys[600]]
    assert not any(h["key"].startswith("s3://images/uncommitted") for r in results for h in r)

    # The same build by hand, from the output prefix, into another index: the same rows.
    proc = _run(
        on_server,
        "-m",
        "sluice.cli",
        "index",
        "build",
        base + "s3run/output/",
        "--out",
        "s3://" + CONTROL_BUCKET + "/indexes/again",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["rows"] == 800


def test_a_failed_index_stage_reports_index_failed_and_leaves_the_run(on_server):
    base = f"s3://{CONTROL_BUCKET}/runs/"
    write_run(base, "emptyrun", [], np.zeros((0, 16), np.float32))
    proc = _run(
        on_server,
        "-m",
        "sluice.index",
        "build",
        "--bucket",
        CONTROL_BUCKET,
        "--run",
        "emptyrun",
        "--out",
        f"s3://{CONTROL_BUCKET}/indexes/never/",
    )
    assert proc.returncode == 1
    from sluice.aws.store import ObjectStore

    never = f"s3://{CONTROL_BUCKET}/indexes/never/"
    outcome = IndexFailed.model_validate_json(ObjectStore().get(never + "_results/emptyrun.json"))
    assert "no committed output rows" in outcome.reason and outcome.index_uri == never
    assert list(ObjectStore().list(never)) == [never + "_results/emptyrun.json"]  # no table written, only the outcome
    assert ObjectStore().get(base + "emptyrun/plan.json")  # the run's files untouched


def test_two_builds_into_one_s3_index_at_once(on_server):
    """Lance commits on S3 with conditional PUTs (If-None-Match): one merge wins, the other retries."""
    base = f"s3://{CONTROL_BUCKET}/runs/"
    shared = uris(600, "both")
    write_run(base, "c1", shared, clustered(600, 16, 1), created_at="2026-03-01T00:00:00+00:00")
    write_run(base, "c2", shared[200:] + uris(100, "c2"), clustered(500, 16, 2), created_at="2026-03-02T00:00:00+00:00")
    index = f"s3://{CONTROL_BUCKET}/indexes/together/"
    env = {**os.environ, **on_server.env, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "index", "build", base + run, "--out", index, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for run in ("c1", "c2")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    check = (
        "import json, lance; from sluice.index.storage import storage_options as so; "
        f"u = '{index}reference-cnn.lance'; t = lance.dataset(u, storage_options=so(u)); "
        "print(json.dumps(t.to_table(columns=['key', 'run']).to_pylist()))"
    )
    proc = _run(on_server, "-c", check)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    by_key = {r["key"]: r["run"] for r in rows}
    assert len(rows) == len(by_key) == 700  # no key twice, none lost
    assert {by_key[k] for k in shared[:200]} == {"c1"} and {by_key[k] for k in shared[200:]} == {"c2"}


def test_the_index_stage_also_puts_the_runs_vectors_into_s3_vectors_when_the_plan_names_it(on_server):
    base = f"s3://{CONTROL_BUCKET}/runs/"
    keys, x = uris(30), clustered(30, 8, 4)
    target = IndexTarget(
        uri=f"s3://{CONTROL_BUCKET}/indexes/vec/", name="vec", s3_vectors=VectorsTarget(bucket="vecs", shards=2)
    )
    plan = write_run(base, "vecrun", keys, x)
    from sluice.aws.store import ObjectStore

    store = ObjectStore()
    store.put(base + "vecrun/plan.json", plan.model_copy(update={"index": target}).model_dump_json().encode())
    vectors = on_server.client("s3vectors")
    vectors.create_vector_bucket(vectorBucketName="vecs")

    proc = _run(on_server, "-m", "sluice.index", "build", "--bucket", CONTROL_BUCKET, "--run", "vecrun")
    assert proc.returncode == 0, proc.stderr[-3000:]
    outcome = RunIndexed.model_validate_json(store.get(target.uri + "_results/vecrun.json"))
    assert outcome.rows == 30 and outcome.s3_vectors is not None
    assert (outcome.s3_vectors.bucket, outcome.s3_vectors.vectors) == ("vecs", 30)
    assert outcome.s3_vectors.indexes == ["vec-reference-cnn-000", "vec-reference-cnn-001"]
    held = [
        v["key"]
        for name in outcome.s3_vectors.indexes
        for v in vectors.list_vectors(vectorBucketName="vecs", indexName=name)["vectors"]
    ]
    assert sorted(held) == sorted(keys)
