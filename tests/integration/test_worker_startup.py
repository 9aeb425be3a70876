"""Start-up overlap: a rank's loaders fetch and decode while its model loads, traces and dry-runs.

A whole node in-process (local plan and shard, the images on moto's S3, each GET's time
recorded): the first GET comes before the model is ready, the model
finds full batches waiting, and a model that fails to load leaves no loader or feeder
thread behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ConfigError
from gpu_worker.main import run_node
from sluice.aws.store import ObjectStore
from sluice.contracts.sections import ModelSpec
from sluice.shards import encode_shard
from tests import pace
from tests.plans import run_plan
from tests.worker_gets import Gets, moto_objects
from tests.worker_images import make_demo_images

IMAGES = dict(make_demo_images(40, seed=9, min_side=48, max_side=96))
CFG = WorkerConfig(device="cpu", loaders=0, torch_threads=1, fetch_concurrency=4)


@pytest.fixture(autouse=True)
def images() -> Iterator[Any]:
    """IMAGES in the bucket "bkt" of moto's S3."""
    yield from moto_objects("bkt", IMAGES)


def _node(tmp_path: Path, model_uri: str) -> dict[str, str]:
    base = f"{tmp_path}/runs/r/"
    plan = run_plan(
        "r",
        base,
        total_keys=len(IMAGES),
        model=ModelSpec(uri=model_uri, batch_size=4, image_size=64),
        job={"attempts": 1},
    )
    Path(base + "shards").mkdir(parents=True)
    Path(base + "shards/0.shard").write_bytes(encode_shard([("bkt", sorted(IMAGES))]))
    Path(base + "plan.json").write_text(plan.model_dump_json())
    return {"SLUICE_PLAN_URI": base + "plan.json", "SLUICE_SHARD_INDEX": "0"}


def test_first_get_comes_before_the_model_is_ready(tmp_path: Path):
    env = _node(tmp_path, "builtin:reference-cnn")
    with Gets(CFG) as gets:
        result = run_node(CFG, env, store=ObjectStore())
    assert (result.processed, result.ok) == (40, True)
    ready = result.pipeline_window[0]  # epoch seconds: the model is loaded, traced and dry-run
    assert result.stats["model_load_seconds"] > 0.1  # the builtin's init, BatchNorm calibration, trace, dry run
    assert gets.times[0] < ready - 0.1
    before_ready = sum(1 for t in gets.times if t < ready)
    assert before_ready >= 8  # at least the two batch buffers' worth
    assert result.stats["prefetched_batches"] >= 1  # full batches waiting when the model was ready


def test_a_model_that_fails_to_load_stops_the_started_loaders(tmp_path: Path):
    env = _node(tmp_path, str(tmp_path / "missing.pt"))
    with pytest.raises(ConfigError, match="does not exist"):
        run_node(CFG, env, store=ObjectStore())
    deadline = time.monotonic() + pace.scaled(5)  # a guard against a hang (tests/pace.py)
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t.name == "feeder" or t.name.startswith(("loader-", "fetch"))]
        if not left:
            break
        time.sleep(0.05)
    assert not left
