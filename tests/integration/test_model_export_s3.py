"""`sluice model export ... --out s3://...` on moto, then a whole worker node running the artifact from S3."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from gpu_worker.config import MAX_IMAGE_PIXELS, WorkerConfig
from gpu_worker.decode.image import decode_image
from gpu_worker.main import run_node
from gpu_worker.models.engine import Engine
from gpu_worker.models.load import load_model
from gpu_worker.models.spec import resolve_uri
from sluice.aws.store import ObjectStore
from sluice.cli import main
from sluice.contracts.sections import ModelSpec
from sluice.shards import encode_shard
from tests.conftest import moto_s3
from tests.plans import run_plan
from tests.worker_images import make_demo_images

MODEL_URI = "s3://models/encoders/mnv3.pt"


IMAGES = dict(make_demo_images(12, seed=5))


@pytest.fixture
def s3():
    yield from moto_s3("models")


def test_cli_exports_to_s3_and_a_node_embeds_with_it(s3, tmp_path: Path, capsys):
    argv = ["model", "export", "torchvision:mobilenet_v3_small", "--no-pretrained", "--image-size", "32"]
    assert main([*argv, "--out", MODEL_URI]) == 0
    printed = capsys.readouterr().out
    assert MODEL_URI in printed and "random-init" in printed
    spec = json.loads(s3.get_object(Bucket="models", Key="encoders/mnv3.pt.json")["Body"].read())
    assert (spec["name"], spec["format"], spec["image_size"], spec["output_dim"]) == (
        "torchvision:mobilenet_v3_small",
        "torchscript",
        32,
        1024,
    )

    # A node whose plan names the artifact: it downloads it once and embeds every image with it.
    base = f"{tmp_path}/runs/r/"
    keys = sorted(IMAGES)
    plan = run_plan(
        "r",
        base,
        total_keys=len(keys),
        model=ModelSpec(uri=MODEL_URI, batch_size=4, image_size=224),  # the spec's 32 px wins
        job={"attempts": 1},
    )
    Path(base + "shards").mkdir(parents=True)
    Path(base + "shards/0.shard").write_bytes(encode_shard([("bkt", keys)]))
    Path(base + "plan.json").write_text(plan.model_dump_json())
    s3.create_bucket(Bucket="bkt")
    for key, data in IMAGES.items():
        s3.put_object(Bucket="bkt", Key=key, Body=data)
    cfg = WorkerConfig(device="cpu", loaders=0, torch_threads=1, output_dtype="float32")
    result = run_node(cfg, {"SLUICE_PLAN_URI": base + "plan.json", "SLUICE_SHARD_INDEX": "0"}, store=ObjectStore())
    assert (result.processed, result.failed, result.ok) == (12, 0, True)

    table = pq.read_table(sorted(Path(plan.output_prefix, "shard=0").glob("*.parquet")))
    got = dict(zip(table.column("key").to_pylist(), np.array(table.column("embedding").to_pylist())))
    model, info = load_model(resolve_uri(MODEL_URI, str(tmp_path / "here"), ObjectStore()), 224)
    engine = Engine(model, info, "cpu", len(keys))
    batch = np.stack([decode_image(IMAGES[k], info.preprocess, MAX_IMAGE_PIXELS) for k in keys])  # the spec's pipeline
    [(_, want)] = engine.submit(torch.from_numpy(batch), None)
    assert sorted(got) == [f"s3://bkt/{k}" for k in keys]
    for key, emb in zip(keys, want):
        assert got[f"s3://bkt/{key}"].shape == (1024,)
        np.testing.assert_allclose(got[f"s3://bkt/{key}"], emb, atol=1e-4)
