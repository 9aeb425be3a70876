"""A whole node with job.decode: gpu without CUDA falls back (warning and counter, no failed shard);
the loaders' device path, on device="cpu" with torchvision's real decode_jpeg, embeds what the CPU path does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.main import run_node
from sluice.aws.store import ObjectStore
from sluice.contracts.sections import ModelSpec
from sluice.shards import encode_shard
from tests.plans import run_plan
from tests.worker_gets import moto_objects
from tests.worker_images import corrupt_images, make_demo_images, png_image

IMAGES = dict(make_demo_images(30, seed=4242, min_side=90, max_side=260))
IMAGES.update(corrupt_images())
IMAGES["a.png"] = png_image()
CFG = WorkerConfig(
    device="cpu", loaders=0, torch_threads=1, fetch_concurrency=8, output_dtype="float32", metrics_port=0
)


@pytest.fixture(autouse=True)
def images() -> Iterator[Any]:
    """IMAGES in the bucket "bkt" of moto's S3."""
    yield from moto_objects("bkt", IMAGES)


def _run(tmp_path: Path, name: str, decode: str, cfg: WorkerConfig) -> tuple[object, dict[str, np.ndarray]]:
    base = f"{tmp_path}/{name}/runs/r/"
    plan = run_plan(
        "r",
        base,
        total_keys=len(IMAGES),
        model=ModelSpec(uri="builtin:reference-cnn", batch_size=8, image_size=64),
        job={"attempts": 1, "decode": decode},
        max_failed_fraction=0.5,  # the five corrupt images
    )
    Path(base + "shards").mkdir(parents=True)
    Path(base + "shards/0.shard").write_bytes(encode_shard([("bkt", sorted(IMAGES))]))
    Path(base + "plan.json").write_text(plan.model_dump_json())
    env = {"SLUICE_PLAN_URI": base + "plan.json", "SLUICE_SHARD_INDEX": "0"}
    result = run_node(cfg, env, store=ObjectStore())
    table = pq.read_table(sorted(Path(plan.output_prefix, "shard=0").glob("*.parquet")))
    return result, dict(zip(table.column("key").to_pylist(), np.array(table.column("embedding").to_pylist())))


def test_gpu_decode_on_a_machine_without_cuda_falls_back_to_the_cpu(tmp_path: Path, caplog):
    result, got = _run(tmp_path, "gpu", "gpu", CFG)
    assert len(got) == 31  # every good image embedded once
    assert (result.processed, result.failed, result.ok) == (31, 5, True)
    assert result.stats["decode_gpu_fallback"] == 1 and "decode_on_gpu" not in result.stats
    assert "job.decode gpu, but the rank has no CUDA device: decoding on the CPU" in caplog.text


def test_the_loaders_device_path_embeds_what_the_cpu_path_does(tmp_path: Path):
    _, cpu = _run(tmp_path, "cpu", "cpu", CFG)
    # The rank decides the device; here it is set as a CUDA rank would, torchvision decoding on the CPU.
    result, dev = _run(tmp_path, "dev", "cpu", CFG.replace(decode_device="cpu"))
    assert (result.processed, result.failed, result.ok) == (31, 5, True)
    assert sorted(dev) == sorted(cpu)
    cos = np.array([float(cpu[k] @ dev[k]) for k in cpu])
    assert cos.min() >= 0.99, cos
    png = "s3://bkt/a.png"  # through the CPU fallback inside the device path: the same pixels
    assert float(cpu[png] @ dev[png]) == pytest.approx(1.0, abs=1e-5)
