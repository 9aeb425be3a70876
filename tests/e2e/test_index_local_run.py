"""A local run over a folder of images ends with its index: `sluice search --image` finds each image first.

The run is the real one (`sluice local run --images DIR --out OUT`: moto, the worker processes,
then the index stage's job, `python -m sluice.index build --bucket --run`, run by the local
executor after "Run Succeeded"); its summary names the index, copied to OUT/<run id>/index/.
One `sluice search` process embeds every image again with the index's own model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from sluice.local.demo import demo_images

CLI = [sys.executable, "-m", "sluice.cli"]


def _cli(*args: str, cwd, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=dict(os.environ))


def test_a_local_run_ends_with_an_index_where_each_image_is_its_own_top_1(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    names = []
    for key, data in demo_images(6, seed=77):
        names.append(key.rsplit("/", 1)[-1])
        (photos / names[-1]).write_bytes(data)
    run = _cli("local", "run", "--images", str(photos), "--out", str(tmp_path / "out"), "--json", "--no-prometheus",
               cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["events"][-2:] == ["Run Succeeded", "Run Indexed"], summary["events"]
    index = summary["index"]
    assert index == os.path.join(summary["output_dir"], "index") and summary["index_rows"] == len(names)
    assert re.fullmatch(r"s3://.+/indexes/local-images-\d{8}-\d{6}-[0-9a-f]{4}/", summary["index_uri"])  # its own

    queries = [a for n in names for a in ("--image", str(photos / n))]
    found = _cli("search", index, *queries, "-k", "3", "--json", cwd=tmp_path)
    assert found.returncode == 0, found.stderr[-3000:]
    results = json.loads(found.stdout)["results"]
    assert len(results) == len(names)
    for name, hits in zip(names, results, strict=True):
        assert hits[0]["key"].endswith("/" + name), (name, hits)
        assert hits[0]["score"] > 0.99


def test_a_local_run_above_the_fleet_threshold_builds_its_index_through_the_stages(tmp_path):
    """SLUICE_INDEX_FLEET_ROWS lowered: train, an array of 2 segment children and commit, run by the local executor."""
    env = {**os.environ, "SLUICE_INDEX_FLEET_ROWS": "1", "SLUICE_INDEX_MIN_ANN_ROWS": "512"}
    out = tmp_path / "out"
    args = ["--demo", "560", "--image-size", "32", "--shards", "2", "--no-prometheus", "--json", "--out", str(out)]
    run = subprocess.run(
        [*CLI, "local", "run", *args], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["events"][-2:] == ["Run Succeeded", "Run Indexed"], summary["events"]
    assert summary["index_rows"] == 560
    # The jobs' logs: the GPU array's 2 children, then train, 2 segment children, commit (one attempt each).
    logs = sorted(p.name for p in (out / summary["run_id"] / "logs").iterdir())
    children = [n for n in logs if re.fullmatch(r".+_[01]-attempt1\.log", n)]
    assert len(logs) == 6 and len(children) == 4, logs
    shown = _cli("index", "show", summary["index"], "--json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert [t["ann"] for t in json.loads(shown.stdout)["tables"]] == ["IVF_PQ"]  # a real IVF-PQ, from the segments

    inputs = sorted((tmp_path / summary["input_dir"]).rglob("*.jpg"))[::80]  # 7 of the run's own images
    found = _cli("search", summary["index"], *[a for p in inputs for a in ("--image", str(p))], "-k", "1", "--json",
                 cwd=tmp_path)  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    for path, hits in zip(inputs, json.loads(found.stdout)["results"], strict=True):
        assert hits[0]["key"].endswith("/" + path.name) and hits[0]["score"] > 0.99, (path, hits)
