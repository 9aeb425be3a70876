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
