"""A local run over a folder of images, then its index: `sluice search --image` finds each image first.

The run is the real one (`sluice local run --images DIR --out OUT`: moto, the prepare and
worker processes); the index is built from its --out folder (committed chunks, plan.json) and
each image is embedded again by `sluice search --image`, with the index's own model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sluice.local.demo import demo_images

CLI = [sys.executable, "-m", "sluice.cli"]


def _cli(*args: str, cwd, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=dict(os.environ))


@pytest.mark.slow  # a whole local run, then a search process per image (several minutes on 2 busy cores)
def test_each_image_of_a_local_run_is_its_own_top_1(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    images = list(demo_images(8, seed=77))
    for key, data in images:
        (photos / key.rsplit("/", 1)[-1]).write_bytes(data)
    run = _cli(
        "local",
        "run",
        "--images",
        str(photos),
        "--shards",
        "2",
        "--out",
        str(tmp_path / "out"),
        "--json",
        "--no-prometheus",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    run_dir = summary["output_dir"]

    built = _cli("index", "build", run_dir, "--out", str(tmp_path / "index"), "--json", cwd=tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    report = json.loads(built.stdout)
    assert report["rows"] == len(images) and report["tables"][0]["model_id"] == "builtin:reference-cnn@1"

    for key, _ in images:
        name = key.rsplit("/", 1)[-1]
        found = _cli(
            "search", str(tmp_path / "index"), "--image", str(photos / name), "-k", "3", "--json", cwd=tmp_path
        )
        assert found.returncode == 0, found.stderr[-3000:]
        [hits] = json.loads(found.stdout)["results"]
        assert hits[0]["key"].endswith("/" + name), (name, hits)
        assert hits[0]["score"] > 0.99
