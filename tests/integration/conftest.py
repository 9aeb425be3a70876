"""Integration fixtures: a real moto S3 server on 127.0.0.1 (as a subprocess), and worker helpers.

The server is sluice.local.emulator.server.MotoServer running moto's own WSGI app (what
`python -m moto.server` runs) wrapped by tests/worker_s3server.py, which can add per-GET
latency and 503 SlowDown faults on demand. Worker processes reach it through
AWS_ENDPOINT_URL; nothing in this process sets that variable globally, so in-process
`mock_aws` tests are unaffected.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.local.emulator.server import MotoServer

ROOT = Path(__file__).resolve().parents[2]
IMAGES_BUCKET = "worker-images"
CONTROL_BUCKET = "worker-control"
TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class FaultServer(MotoServer):
    """MotoServer running tests/worker_s3server.py: moto plus GET latency and 503 faults on demand."""

    def __init__(self) -> None:
        super().__init__(module="tests.worker_s3server", cwd=ROOT, credentials=TEST_CREDENTIALS)

    def client(self, service: str = "s3", *, config: Any = None) -> Any:
        from botocore.config import Config

        default = Config(max_pool_connections=16, retries={"max_attempts": 10, "mode": "standard"})
        return super().client(service, config=config or default)

    def faults(self, **config: Any) -> dict[str, Any]:
        """Replace the fault configuration (no arguments: none) and reset the counters."""
        req = urllib.request.Request(f"{self.endpoint}/_faults", data=json.dumps(config).encode(), method="POST")
        with urllib.request.urlopen(req) as resp:
            return dict(json.loads(resp.read()))

    def fault_counts(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.endpoint}/_faults") as resp:
            return dict(json.loads(resp.read())["counts"])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[FaultServer]:
    with FaultServer() as server:
        s3 = server.client()
        for bucket in (IMAGES_BUCKET, CONTROL_BUCKET):
            s3.create_bucket(Bucket=bucket)
        yield server


@pytest.fixture
def on_server(moto_server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultServer]:
    """The server, with this process's boto3 clients (ObjectStore, writing a run) pointed at it too."""
    from sluice.aws import clients

    for k, v in moto_server.env.items():
        monkeypatch.setenv(k, v)
    clients.reset_clients()
    yield moto_server
    clients.reset_clients()


@dataclass(frozen=True)
class Dataset:
    keys: list[str]  # every key the runs name, in manifest order
    images: dict[str, bytes]  # uploaded bytes of every key that exists
    expected_failures: dict[str, str]  # s3 URI -> reason

    @property
    def readable(self) -> set[str]:
        return {uri(k) for k in self.keys} - set(self.expected_failures)


def uri(key: str) -> str:
    return f"s3://{IMAGES_BUCKET}/{key}"


@pytest.fixture(scope="session")
def dataset(moto_server: FaultServer) -> Dataset:
    """400 small JPEGs of mixed sizes plus 5 corrupt, 2 missing, 1 bomb, 1 non-image, 1 PNG, 1 CMYK, 1 EXIF."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.worker_images import bad_and_special_objects, make_demo_images

    images = dict(make_demo_images(400, seed=11))
    failures: dict[str, str] = {}
    special = bad_and_special_objects()
    for name, (data, reason) in special.items():
        if data is not None:
            images[name] = data
        if reason is not None:
            failures[uri(name)] = reason
    s3 = moto_server.client()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=IMAGES_BUCKET, Key=kv[0], Body=kv[1]), images.items()))
    # Interleave the special objects with the JPEGs so every shard and rank gets some.
    keys = sorted(k for k in images if k.startswith("img-"))
    for i, name in enumerate(sorted(special)):
        keys.insert(min(len(keys), 7 + i * 37), name)
    return Dataset(keys, images, failures)


def make_run(
    server: FaultServer,
    run_id: str,
    shards: list[list[str]],
    *,
    mode: str = "array",
    batch_size: int = 16,
    image_size: int = 64,
    max_failed_fraction: float = 0.1,
    model: str = "builtin:reference-cnn",
    output_dtype: str = "float16",
) -> Any:
    """Upload shards (lists of keys in IMAGES_BUCKET) and plan.json; returns the RunPlan."""
    from sluice.contracts.sections import ModelSpec
    from sluice.shards import encode_shard
    from tests.plans import run_plan

    base = f"s3://{CONTROL_BUCKET}/runs/{run_id}/"
    plan = run_plan(
        run_id,
        base,
        n_shards=len(shards),
        total_keys=sum(map(len, shards)),
        keys_per_shard=max(map(len, shards)),
        model=ModelSpec(uri=model, batch_size=batch_size, image_size=image_size),
        job={"mode": mode, "nodes": len(shards)} if mode == "multinode" else {},
        manifest_uri=f"s3://{CONTROL_BUCKET}/manifests/{run_id}.json",
        output={"dtype": output_dtype},
        max_failed_fraction=max_failed_fraction,
        created_at="2024-01-01T00:00:00+00:00",
    )
    s3 = server.client()
    for i, keys in enumerate(shards):
        # Small blocks so ranks really do range-read only their part of a shard.
        data = encode_shard([(IMAGES_BUCKET, keys)], sort=False, block_keys=32)
        s3.put_object(Bucket=CONTROL_BUCKET, Key=f"runs/{run_id}/shards/{i}.shard", Body=data)
    s3.put_object(Bucket=CONTROL_BUCKET, Key=f"runs/{run_id}/plan.json", Body=plan.model_dump_json().encode())
    return plan


def worker_env(server: FaultServer, plan: Any, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AWS_BATCH_"))}
    env.update(server.env)
    env.update(
        {
            "SLUICE_PLAN_URI": f"s3://{CONTROL_BUCKET}/runs/{plan.run_id}/plan.json",
            "SLUICE_WORKER_DEVICE": "cpu",
            "SLUICE_WORKER_TORCH_THREADS": "1",
            "SLUICE_WORKER_FETCH_CONCURRENCY": "8",
            "PYTHONPATH": str(ROOT),
        }
    )
    env.update(extra)
    return env


def start_worker(env: dict[str, str]) -> subprocess.Popen[str]:
    """`python -m gpu_worker` in its own process group (so a test can kill the whole 'container')."""
    return subprocess.Popen(
        [sys.executable, "-m", "gpu_worker"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"worker did not finish in {timeout}s; stderr tail:\n{err[-3000:]}") from None
    return proc.returncode, err


def run_worker(env: dict[str, str], timeout: float = 180) -> tuple[int, str]:
    return finish(start_worker(env), timeout)


@dataclass
class RunOutput:
    rows: dict[str, list[Any]]  # key -> embeddings (one per occurrence: duplicates show up as len > 1)
    files: dict[str, dict[str, Any]]  # output object key -> {"etag", "last_modified", "rows"}
    markers: dict[str, dict[str, Any]]  # marker object key -> parsed marker
    failures: dict[int, list[dict[str, Any]]]  # shard -> failures.jsonl lines
    results: dict[int, dict[str, Any]]  # shard -> result.json


def read_run(server: FaultServer, plan: Any) -> RunOutput:
    import io

    import numpy as np
    import pyarrow.parquet as pq

    s3 = server.client()
    prefix = f"runs/{plan.run_id}/"
    objs = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=CONTROL_BUCKET, Prefix=prefix):
        objs.extend(page.get("Contents", []))
    out = RunOutput({}, {}, {}, {}, {})
    for o in objs:
        key = o["Key"]
        body = s3.get_object(Bucket=CONTROL_BUCKET, Key=key)["Body"].read()
        if key.endswith(".parquet"):
            table = pq.read_table(io.BytesIO(body))
            emb = np.asarray(table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False))
            dim = table.schema.field("embedding").type.list_size
            emb = emb.reshape(-1, dim)
            for k, e in zip(table.column("key").to_pylist(), emb):
                out.rows.setdefault(k, []).append(e)
            out.files[key] = {
                "etag": o["ETag"],
                "last_modified": o["LastModified"],
                "rows": table.num_rows,
                "schema": table.schema,
            }
        elif "/_commits/" in key:
            out.markers[key] = json.loads(body)
        elif "/failures/" in key:
            shard = int(key.rsplit("/", 1)[1].split(".")[0])
            out.failures[shard] = [json.loads(line) for line in body.decode().splitlines() if line]
        elif key.endswith(".result.json"):
            out.results[int(key.rsplit("/", 1)[1].split(".")[0])] = json.loads(body)
    return out


def expected_embeddings(dataset: Dataset, keys: set[str], image_size: int = 64) -> dict[str, Any]:
    """Embeddings computed here, one image at a time, with the worker's own decode and model code."""
    import numpy as np
    import torch

    from gpu_worker.config import MAX_IMAGE_PIXELS
    from gpu_worker.decode.image import decode_image
    from gpu_worker.decode.preprocess import legacy
    from gpu_worker.models.engine import Engine, EngineOptions
    from gpu_worker.models.load import load_model

    model, info = load_model("builtin:reference-cnn", image_size)
    engine = Engine(model, info, "cpu", 8, EngineOptions(jit=False))
    names = sorted(keys)
    out: dict[str, Any] = {}
    for i in range(0, len(names), 8):
        chunk = names[i : i + 8]
        arrs = [decode_image(dataset.images[n.split("/", 3)[3]], legacy(image_size), MAX_IMAGE_PIXELS) for n in chunk]
        arrs += [np.zeros_like(arrs[0])] * (8 - len(arrs))
        ((_, emb),) = engine.submit(torch.from_numpy(np.stack(arrs)), None)
        out.update(zip(chunk, emb))
    return out


def check_complete(dataset: Dataset, plan: Any, out: RunOutput, shards: list[list[str]]) -> None:
    """Every readable key exactly once, right dim/norm/values; failures exactly the bad keys."""
    import numpy as np

    assert set(out.rows) == dataset.readable & {uri(k) for s in shards for k in s}
    dups = {k: len(v) for k, v in out.rows.items() if len(v) != 1}
    assert not dups, f"keys written more than once: {list(dups.items())[:5]}"
    assert out.rows, "no rows written"
    expected = expected_embeddings(dataset, set(out.rows))
    for key, (emb,) in out.rows.items():
        assert emb.shape == (128,)
        assert abs(float(np.linalg.norm(emb.astype(np.float32))) - 1.0) < 2e-3
        np.testing.assert_allclose(emb.astype(np.float32), expected[key], atol=3e-3, err_msg=key)
    # Every Parquet object is named by a marker (no orphan from a killed attempt).
    named = {m["file"] for m in out.markers.values() if m["file"]}
    assert {k.rsplit("/", 1)[1] for k in out.files} == named
    for i, keys in enumerate(shards):
        want = {uri(k): r for k, r in ((k, dataset.expected_failures.get(uri(k))) for k in keys) if r}
        got = {f["key"]: f["reason"] for f in out.failures[i]}
        assert got == want, f"shard {i}"
        assert len(out.failures[i]) == len(got)
        res = out.results[i]
        assert res["processed"] == len(keys) - len(want)
        assert res["failed"] == len(want)
        assert res["n_keys"] == len(keys)
        assert res["ok"] is True


@pytest.fixture
def prometheus() -> Iterator[Any]:
    """A real Prometheus (Debian's package) with its remote-write receiver, on a free loopback port.

    In CI it must run: .ci/run installs the package, and a missing binary fails instead of skipping.
    """
    import shutil

    from sluice.local.emulator.prometheus import LocalPrometheus

    if shutil.which("prometheus") is None:
        if os.environ.get("CI"):
            pytest.fail("prometheus missing in CI: .ci/run installs Debian's prometheus package")
        pytest.skip("prometheus not installed (apt-get install prometheus)")
    prom = LocalPrometheus().start()
    yield prom
    prom.stop()
