"""`sluice model export` and `sluice search` print their own lines only: no third-party warning or progress bar."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sluice.contracts.sections import ModelSpec
from sluice.modelid import file_id
from tests.index_support import write_run

pytestmark = pytest.mark.subprocess  # the commands run as a user runs them
CLI = [sys.executable, "-m", "sluice.cli"]
NOISE = ("Warning", "deprecated", "it/s]", "Loading weights", "[transformers]")


def _quiet(stderr: str) -> None:
    assert not [w for w in NOISE if w in stderr], stderr[-3000:]


def test_export_then_search_with_the_exported_model_say_nothing_of_torch_or_its_libraries(tmp_path):
    from gpu_worker.door import embed_images
    from sluice.local.demo import demo_images

    model = str(tmp_path / "mobilenet.pt")
    argv = ["model", "export", "torchvision:mobilenet_v3_small", "--no-pretrained", "--image-size", "32"]
    done = subprocess.run([*CLI, *argv, "--out", model], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    _quiet(done.stderr)
    images = list(demo_images(12))
    vectors = embed_images(model, 32, images)
    keys = [f"s3://photos/{k}" for k, _ in images]
    spec = ModelSpec(uri=model, name="mobilenet")
    write_run(str(tmp_path / "runs"), "r1", keys, vectors, models=[spec], model_ids=[file_id(model)])
    index = str(tmp_path / "idx")
    built = subprocess.run(
        [*CLI, "index", "build", str(tmp_path / "runs" / "r1"), "--out", index], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (tmp_path / "q.jpg").write_bytes(images[5][1])
    found = subprocess.run(
        [*CLI, "search", index, "--image", str(tmp_path / "q.jpg"), "-k", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    assert json.loads(found.stdout)["results"][0][0]["key"] == keys[5]
    _quiet(found.stderr)
