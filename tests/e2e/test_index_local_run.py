"""A local run above the fleet threshold builds its index through the index stages: `sluice search` finds
each image first.

The run is the real one (`sluice local run --demo N --out OUT`: moto, the worker processes, then
the index stage's jobs, run by the local executor after "Run Succeeded"); its summary names the
index, copied to OUT/<run id>/index/. (A run under the threshold, whose index is one job's:
the folder run through the prepare stage in tests/e2e/test_local_run.py.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

CLI = [sys.executable, "-m", "sluice.cli"]


def _cli(*args: str, cwd, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=dict(os.environ))


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
